#!/bin/bash
# The Python comparison (bench/bench_python.py; docs/performance.md, "Python"): spool's Python
# package against persist-queue's SQLite ack queue and RQ on Redis, one producer and two
# consumer processes, 100 B, every message acked.
#
# Usage: bench/bench_python.sh [--build DIR] [bench_python.py arguments...]
#   --build DIR   meson build directory holding libspool.so.0 (default: build at the repo root;
#                 set up with --buildtype=release and built if missing)
#   e.g. bench/bench_python.sh --systems spool,rq --n-peer 5000 --sync interval
#
# Installs what is missing with apt-get (root, or sudo) through scripts/deps.sh --bench-python:
# the build dependencies and python3-persist-queue, python3-rq, python3-redis, redis-server; if
# redis-server's postinst started the system service, it is stopped (the script runs its own
# redis-server on a free port, stopped by PID). Runs the script with Debian's /usr/bin/python3,
# the Python that sees those packages.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
build="$ROOT/build"
if [ "${1:-}" = --build ]; then build=$2; shift 2; fi
case "${1:-}" in --build=*) build=${1#*=}; shift ;; -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac

log() { echo "bench_python: $*" >&2; }
had_redis=0
dpkg-query -W -f='${Status}' redis-server 2>/dev/null | grep -q "install ok installed" && had_redis=1
bash "$ROOT/scripts/deps.sh" --bench-python
if [ $had_redis = 0 ]; then
  # Its postinst may have started the system service: the script runs its own redis-server.
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  if [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
  elif command -v service >/dev/null; then
    $SUDO service redis-server stop >/dev/null 2>&1 || true
  fi
fi

if [ ! -f "$build/libspool.so.0" ]; then
  if [ ! -f "$build/build.ninja" ]; then
    log "meson setup $build"
    meson setup "$build" "$ROOT" --buildtype=release -Dtests=false -Dfuzz=false >/dev/null
  fi
  lib=$(ninja -C "$build" -t targets all | grep -o '^libspool\.so[.0-9]*[0-9]' | head -n 1)
  ninja -C "$build" "$lib" >/dev/null || { log "building libspool failed"; exit 1; }
fi

export SPOOL_LIBRARY="$build/libspool.so.0" PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
exec /usr/bin/python3 "$ROOT/bench/bench_python.py" "$@"
