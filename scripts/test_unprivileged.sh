#!/usr/bin/env bash
# The sandbox tests as a user who is not root: what a researcher's own account gets (rlimits it cannot raise, no
# cgroup to write, bubblewrap through unprivileged user namespaces, Docker through the docker group, workspaces it
# must be able to remove). Run as root, after scripts/sandbox_setup.sh; idempotent. It makes (or reuses):
# - the user mappa-ci (override: MAPPA_CI_USER), in a group docker that may use the engine's socket;
# - a copy of this checkout the user owns (tracked and untracked files as they are now, uncommitted changes
#   included), under the user's home;
# then runs the sandbox test files there as that user with this checkout's virtual environment, and exits with
# pytest's status. The rootfs root built is found by the user (sandboxes.image.rootfs_dir).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
PY="${1:-$REPO/.venv/bin/python}"
CI_USER="${MAPPA_CI_USER:-mappa-ci}"
TESTS=(tests/test_sandbox_hostile.py tests/test_sandbox_subprocess.py tests/test_docker_reaper.py
  tests/test_sandbox_limiters.py)
[ -f tests/test_sandbox_defects.py ] && TESTS+=(tests/test_sandbox_defects.py)

if [ "$(id -u)" != 0 ]; then
  echo "test_unprivileged: run me as root (I make a user and hand it the Docker socket)" >&2
  exit 2
fi
id "$CI_USER" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$CI_USER"
getent group docker >/dev/null || groupadd --system docker
id -nG "$CI_USER" | tr ' ' '\n' | grep -qx docker || usermod -aG docker "$CI_USER"
# the engine's socket, for the group (dockerd --group docker does this when it starts)
for sock in /var/run/docker.sock /run/docker.sock; do
  if [ -S "$sock" ]; then
    chgrp docker "$sock" && chmod g+rw "$sock"
  fi
done

HOME_DIR="$(getent passwd "$CI_USER" | cut -d: -f6)"
COPY="$HOME_DIR/repo"
rm -rf "$COPY"
mkdir -p "$COPY"
# (files deleted in the working tree but still in git's index are skipped by --ignore-failed-read, with a warning)
git ls-files --cached --others --exclude-standard -z | tar --null --files-from=- --ignore-failed-read -cf - \
  | tar -xf - -C "$COPY"
chown -R "$CI_USER": "$COPY"

# The interpreter: this checkout's virtual environment. Where the user cannot run it (its base interpreter lies
# under a home closed to others, as pyenv's under /root), a system interpreter of the same version with the
# environment's packages on the path.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
VERSION="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
EXTRA_PATH=""
if ! runuser -u "$CI_USER" -- "$PY" -c pass 2>/dev/null; then
  found=""
  for candidate in "/usr/local/bin/python$VERSION" "/usr/bin/python$VERSION"; do
    if [ -x "$candidate" ] && runuser -u "$CI_USER" -- "$candidate" -c pass 2>/dev/null; then
      found="$candidate"
      break
    fi
  done
  if [ -z "$found" ]; then
    echo "test_unprivileged: $CI_USER can run neither $PY nor a python$VERSION of the system" >&2
    exit 2
  fi
  PY="$found"
  EXTRA_PATH=":$SITE"
fi

# The user's own home and cache; the copy first on the path; CI's requirement of the isolating backends kept.
as_user=(runuser -u "$CI_USER" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$HOME_DIR" LANG=C.UTF-8
  PYTHONPATH="$COPY$EXTRA_PATH" PYTHONDONTWRITEBYTECODE=1)
for var in CI MAPPA_REQUIRE_BACKENDS; do
  [ -n "${!var:-}" ] && as_user+=("$var=${!var}")
done
cd "$COPY"
"${as_user[@]}" "$PY" -c "import sandboxes; assert sandboxes.__file__.startswith('$COPY/'), sandboxes.__file__"
echo "test_unprivileged: as $CI_USER ($(id -u "$CI_USER")) with $PY: ${TESTS[*]}"
exec "${as_user[@]}" "$PY" -m pytest -p no:cacheprovider -q -ra "${TESTS[@]}"
