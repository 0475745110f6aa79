#!/usr/bin/env bash
# Make the isolating sandbox backends available for the tests, where that is possible:
# - bubblewrap: the bwrap binary and the sandbox rootfs (debootstrap, offline from the host's Debian mirror);
# - Docker: an engine (started here if none answers: no iptables, no bridge, since the sandbox containers have
#   no network anyway) and the sandbox image, imported from that same rootfs.
# Installing packages and starting dockerd needs root and apt. Whatever cannot be had is reported; where the
# backends are required ($MAPPA_REQUIRE_BACKENDS, or CI: see sandboxes/check.py) this script then fails, and so does
# `make test`; elsewhere the tests of a missing backend skip, by name, with the reason. Existing rootfs and image are
# reused, never rebuilt.
set -uo pipefail
PY="${1:-.venv/bin/python}"
export DEBIAN_FRONTEND=noninteractive

missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
# libseccomp: the bubblewrap sandbox's seccomp filter is compiled by it (Python bindings: pyseccomp, a dependency)
ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || missing+=(libseccomp2)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -q && apt-get install -y -q "${missing[@]}") >/tmp/mappa-apt.log 2>&1 \
      || echo "sandbox_setup: apt-get install ${missing[*]} failed (see /tmp/mappa-apt.log)"
  else
    echo "sandbox_setup: missing ${missing[*]} and no root/apt to install them"
  fi
fi

"$PY" -c 'from sandboxes.syscall_filter import seccomp_program as p; b, why = p(); raise SystemExit(why)' \
  || echo "sandbox_setup: bubblewrap sandboxes will run without their seccomp filter (see above)"

if [ "$(id -u)" = 0 ] && command -v debootstrap >/dev/null 2>&1; then
  "$PY" -m sandboxes build --rootfs-only >/dev/null || echo "sandbox_setup: building the sandbox rootfs failed"
fi

if ! docker info >/dev/null 2>&1 && command -v dockerd >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  nohup dockerd --iptables=false --bridge=none >/tmp/mappa-dockerd.log 2>&1 &
  for _ in $(seq 1 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
fi
if docker info >/dev/null 2>&1; then
  "$PY" -m sandboxes build >/dev/null || echo "sandbox_setup: building the Docker sandbox image failed"
else
  echo "sandbox_setup: no Docker engine could be started (see /tmp/mappa-dockerd.log)"
fi
# what runs here; exit 1 when a required backend is missing
"$PY" -m sandboxes check
