#!/usr/bin/env bash
# Install what serving needs when it is missing on a Debian machine: system packages and the project venv.
# Idempotent; fast when everything is already there. The SAM CLI (build, deploy, lint) is infra/install_sam.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v redis-benchmark >/dev/null || need_apt+=(redis-tools)
command -v valgrind >/dev/null || need_apt+=(valgrind)  # make bench counts the hot path's instructions
command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server)
command -v mysqlslap >/dev/null || need_apt+=(mariadb-client)  # make bench drives the DB side of the ceiling with it
command -v make >/dev/null || need_apt+=(make)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  as_root=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: run as root, or install: ${need_apt[*]}" >&2; exit 1; }
    as_root=(sudo)
  fi
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
  # Debian starts packaged servers itself under systemd; without it we start our own (infra/services.py)
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.requirements.sha
want=$(sha256sum requirements-dev.lock | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/pip install -q --upgrade pip
  # the lock pins every package with its hashes (make lock): the same versions on every machine, nothing swapped
  .venv/bin/pip install -q --require-hashes --no-deps -r requirements-dev.lock
  echo "$want" > "$stamp"
fi

