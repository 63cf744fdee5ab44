#!/bin/bash
# The SQS face with @aws-sdk/client-sqs (JSON 1.0) under node, unchanged. The SDK comes from
# the npm registry into a cache directory (SPOOL_NPM_CACHE, default ~/.cache/spool-test-npm)
# once; without node or the registry the test skips and says why. Usage:
# sqs_node_test.sh SPOOL_SERVE. TAP output.
set -uo pipefail
SERVE=$1
HERE=$(cd "$(dirname "$0")" && pwd)
command -v node >/dev/null && command -v npm >/dev/null || { echo "1..0 # SKIP node or npm is not installed"; exit 0; }
SDK=${SPOOL_NPM_CACHE:-${HOME:-/tmp}/.cache/spool-test-npm}
if [ ! -f "$SDK/node_modules/@aws-sdk/client-sqs/package.json" ]; then
  mkdir -p "$SDK"
  if ! timeout 300 npm install --silent --no-audit --no-fund --prefix "$SDK" @aws-sdk/client-sqs@3 > "$SDK/install.log" 2>&1; then
    echo "1..0 # SKIP SKIPPED LOUDLY: npm could not install @aws-sdk/client-sqs (registry unreachable?): $(tail -1 "$SDK/install.log")"
    exit 0
  fi
fi
T=$(mktemp -d)
PID=
trap '[ -n "$PID" ] && kill $PID 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
mkdir "$T/root"
printf '[default]\naws_access_key_id = AKIDNODE\naws_secret_access_key = node-secret\n' > "$T/credentials"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$SERVE" "$T/root" --sqs 127.0.0.1:$PORT --credentials "$T/credentials" & PID=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.05; done
timeout 120 node "$HERE/sqs_node_test.mjs" "$SDK/node_modules" "http://127.0.0.1:$PORT" AKIDNODE node-secret
