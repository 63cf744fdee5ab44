#!/bin/bash
# Builds spool and runs its main job: producers and competing worker processes on a local
# queue, one worker killed mid-task, and the final stats.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
[ -d build ] || meson setup build --buildtype=release >/dev/null
ninja -C build examples/spool-demo >/dev/null
exec build/examples/spool-demo "$@"
