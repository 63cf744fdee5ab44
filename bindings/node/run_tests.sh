#!/bin/bash
# The Node binding's tests, run by meson test (tests/meson.build): `npm install` of a copy of
# this package (its install script builds the addon against this build's libspool through
# pkg-config, with node's own headers: nothing is downloaded), `node --test`, then a worker
# killed while it drains a queue with `spool work` (../drain_test.sh).
# Usage: run_tests.sh BUILD_DIR LIBSPOOL_DIR SPOOL_CLI SANITIZE
set -euo pipefail
build=$1 libdir=$2 cli=$3 sanitize=$4
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../test_env.sh"
skip_under_sanitizer "the Node binding's tests" "$sanitize"
for tool in node npm; do
  command -v $tool >/dev/null || { echo "$tool not found: scripts/deps.sh --test installs it" >&2; exit 1; }
done
work=$build/bindings-node
uninstalled_pc "$work/pkgconfig" "$here/../.." "$libdir"
# A fresh copy each run, so the source tree gets no build/ and no stale addon is tested.
rm -rf "$work/pkg"
mkdir -p "$work/pkg" "$work/home"
cp -r "$here/index.js" "$here/index.d.ts" "$here/package.json" "$here/binding.gyp" \
  "$here/build.js" "$here/src" "$here/test" "$here/example" "$work/pkg/"
export HOME=$work/home npm_config_cache=$work/home/npm-cache npm_config_update_notifier=false
cd "$work/pkg"
npm install --offline --no-audit --no-fund --loglevel=warn
node --test test/
bash "$here/../drain_test.sh" "$cli" node example/worker.js --work 10
