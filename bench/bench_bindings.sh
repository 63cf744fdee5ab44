#!/bin/bash
# Per-call cost of a send from Go and from Node.js against the C API, in one run on one
# machine (docs/performance.md, "Go and Node.js"): one message per call, and a batch of 100
# per call; 64-byte payloads, a fresh queue each, the default interval sync policy.
# Usage: bench/bench_bindings.sh [--build DIR] [N]   (DIR: a configured meson build, default
# build; N: single sends per language, default 200000, and N/100 batches)
# Each language runs 3 times, taking turns, and the best of the 3 is shown: the machine's
# other load only ever adds time. Both the wall time and the CPU time of the process per call
# are shown: on a loaded machine the wall time is mostly waiting for a core.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
[ "${1:-}" = --build ] && { build=$2; shift 2; }
n=${1:-200000}
root=$(pwd)
build=$(cd "$build" && pwd)
ninja -C "$build" libspool.so.0.1.0 >/dev/null
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
. bindings/test_env.sh
uninstalled_pc "$build/bindings-bench/pkgconfig" "$root" "$build"

cc -O2 -std=c99 -Wall -Wextra -Werror -Iinclude bench/bench_capi.c -L"$build" -lspool -Wl,-rpath,"$build" -o "$tmp/bench_capi"

export GOCACHE="$build/bindings-go/cache" GOPATH="$build/bindings-go/gopath" GOPROXY=off GOFLAGS=-mod=readonly
(cd bindings/go && go test -c -o "$tmp/go.test" .)

pkg=$build/bindings-bench/node
rm -rf "$pkg"; mkdir -p "$pkg"
cp -r bindings/node/index.js bindings/node/package.json bindings/node/binding.gyp bindings/node/build.js \
  bindings/node/src "$pkg/"
(cd "$pkg" && HOME=$build/bindings-bench npm_config_update_notifier=false npm install --offline --no-audit --no-fund --loglevel=error >/dev/null)
for round in 1 2 3; do
  mkdir -p "$tmp/c$round"; "$tmp/bench_capi" "$tmp/c$round" "$n" >>"$tmp/c.txt"
  "$tmp/go.test" -test.run '^$' -test.bench '^BenchmarkSend$' -test.benchtime "${n}x" >>"$tmp/go.txt"
  "$tmp/go.test" -test.run '^$' -test.bench '^BenchmarkSendBatch100$' -test.benchtime "$((n / 100))x" >>"$tmp/go.txt"
  mkdir -p "$tmp/node$round"; node bench/bench_node.js "$pkg" "$tmp/node$round" "$n" >>"$tmp/node.txt"
  rm -rf "$tmp/c$round" "$tmp/node$round"
done

python3 - "$tmp" "$n" <<'PY'
import re, sys
tmp, n = sys.argv[1], int(sys.argv[2])
def kv(f):  # the best of the rounds for each key
    out = {}
    for k, v in (l.split() for l in open(f) if l.strip()):
        out[k] = min(out.get(k, float("inf")), float(v))
    return out
c, node = kv(f"{tmp}/c.txt"), kv(f"{tmp}/node.txt")
go = {}
for l in open(f"{tmp}/go.txt"):
    m = re.match(r"Benchmark(Send|SendBatch100)(-\d+)?\s+\d+\s+([\d.]+) ns/op\s+([\d.]+) cpu-ns/op", l)
    if m:
        k = "send" if m.group(1) == "Send" else "batch100"
        for key, v in ((k + "_ns", m.group(3)), (k + "_cpu_ns", m.group(4))):
            go[key] = min(go.get(key, float("inf")), float(v))
print(f"{n} sends, {n // 100} batches of 100; 64-byte payloads; ns per call, best of 3 (ratio to C)")
print(f"{'':14}{'C':>10}{'Go':>18}{'Node':>18}")
for key, name in (("send_ns", "send, wall"), ("send_cpu_ns", "send, CPU"),
                  ("batch100_ns", "batch, wall"), ("batch100_cpu_ns", "batch, CPU")):
    print(f"{name:14}{c[key]:>10,.0f}{go[key]:>10,.0f} ({go[key] / c[key]:.2f}x)"
          f"{node[key]:>10,.0f} ({node[key] / c[key]:.2f}x)")
PY
