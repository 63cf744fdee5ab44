#!/bin/bash
# The Go binding's tests, run by meson test (tests/meson.build): go vet, go test, and the
# concurrency test again under -race, built against this build's libspool through
# pkg-config, with Go's caches under the build directory and no module downloads.
# Usage: run_tests.sh BUILD_DIR LIBSPOOL_DIR SPOOL_CLI SANITIZE
set -euo pipefail
build=$1 libdir=$2 cli=$3 sanitize=$4
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../test_env.sh"
skip_under_sanitizer "the Go binding's tests" "$sanitize"
if ! command -v go >/dev/null; then
  echo "go not found: scripts/deps.sh --test installs golang-go" >&2
  exit 1
fi
uninstalled_pc "$build/bindings-go/pkgconfig" "$here/../.." "$libdir"
export GOCACHE="$build/bindings-go/cache" GOPATH="$build/bindings-go/gopath"
export GOPROXY=off GOFLAGS=-mod=readonly GO111MODULE=on GOTOOLCHAIN=local CGO_ENABLED=1
cd "$here"
go vet ./...
go test -count=1 ./...
go test -count=1 -race -run 'Concurrent|LongPoll' .
go build -o "$build/bindings-go/worker" ./example/worker
bash "$here/../drain_test.sh" "$cli" "$build/bindings-go/worker" -work 10ms
