#!/usr/bin/env bash
# make demo from a fresh clone, as the unprivileged user mappa-ci (Docker through the docker group)
set -uo pipefail
OUT=/work/main/runs/demo-nonroot
U=mappa-ci
H=$(getent passwd $U | cut -d: -f6)
rm -rf "$H/demo-clone"
git clone -q /work/main "$H/demo-clone"
git -C "$H/demo-clone" log --oneline -1 > "$OUT/commit.txt"
chown -R $U: "$H/demo-clone"
cd "$H/demo-clone"
date -u +"start %F %T UTC" > "$OUT/times.txt"
runuser -u $U -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$H" LANG=C.UTF-8 \
  PIP_FIND_LINKS=/opt/wheels PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DEFAULT_TIMEOUT=180 PIP_DISABLE_PIP_VERSION_CHECK=1 \
  bash -c 'id; /usr/bin/time -v make setup; date -u +"setup-done %F %T UTC"; /usr/bin/time -v make demo' > "$OUT/console.txt" 2>&1
echo "rc=$?" >> "$OUT/times.txt"
date -u +"end %F %T UTC" >> "$OUT/times.txt"
