#!/bin/bash
# Installs the Debian 12 packages spool builds and tests with, if any are missing.
# Usage: scripts/deps.sh [--test | --bench-python]   (--test adds clang for the fuzzers, pytest for python/tests and mypy for its type check, openssl for the TLS test, strace for the CLI test's syncs, attr for getfattr in the spoolfs test, python3-setuptools/-venv/-pip for the install test's pip install, tmux for the spool top test, chromium (headless) for the dashboard's browser test, Go for bindings/go and, where the machine has no node, Node.js, npm and make (node-gyp runs it) for bindings/node, python3-boto3, awscli and curl for the SQS face's clients; --bench-python adds the peers of bench/bench_python.py)
set -euo pipefail
pkgs=(meson ninja-build g++ pkg-config python3 liburing-dev libfuse3-dev fuse3 libxxhash-dev
      libcpp-httplib-dev libssl-dev
      libboost-dev libspdlog-dev libcli11-dev nlohmann-json3-dev libgtest-dev libbenchmark-dev
      libnats-dev nats-server libncurses-dev)
[ "${1:-}" = "--test" ] && pkgs+=(clang libclang-rt-14-dev util-linux procps python3-pytest python3-mypy openssl strace attr tmux golang-go
                                   python3-setuptools python3-venv python3-pip
                                   python3-boto3 awscli curl chromium)
# A machine may bring its own Node.js (with npm and node's headers); Debian's is the fallback.
[ "${1:-}" = "--test" ] && ! command -v node >/dev/null && pkgs+=(nodejs npm libnode-dev)
# node-gyp builds the addon with make, which a minimal Debian (and --no-install-recommends) lacks.
[ "${1:-}" = "--test" ] && pkgs+=(make)
[ "${1:-}" = "--bench-python" ] && pkgs+=(python3-persist-queue python3-rq python3-redis redis-server)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} = 0 ] && exit 0
echo "spool: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
