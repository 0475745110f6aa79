#!/usr/bin/env bash
# Make a Docker engine and the sandbox image available for the Docker tests, where that is possible:
# - an engine already answers: only build the image (skipped when it exists);
# - root with apt: install docker.io and debootstrap, start dockerd (no iptables, no bridge: the sandbox
#   containers have no network anyway), build the image offline;
# - otherwise: say why and return 0, so the Docker tests skip with that reason.
set -uo pipefail
PY="${1:-.venv/bin/python}"

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "docker_engine: no engine and no root/apt to install one; Docker tests will be skipped"; exit 0
  fi
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    (apt-get update -q && apt-get install -y -q docker.io debootstrap) >/tmp/mappa-apt.log 2>&1 \
      || { echo "docker_engine: apt-get install docker.io failed (see /tmp/mappa-apt.log)"; exit 0; }
  fi
  nohup dockerd --iptables=false --bridge=none >/tmp/mappa-dockerd.log 2>&1 &
  for _ in $(seq 1 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "docker_engine: dockerd did not start (see /tmp/mappa-dockerd.log)"; exit 0; }
fi
"$PY" -m sandboxes build || echo "docker_engine: building the sandbox image failed; Docker tests will be skipped"
exit 0
