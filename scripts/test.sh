#!/bin/bash
# Builds and runs every test: the suite on both I/O backends (warnings are errors), the
# suite again under ASan+UBSan, the threaded tests under ThreadSanitizer, then each fuzz
# target for a bounded time.
# SPOOL_FUZZ_SECONDS (default 40) bounds each fuzzer; SPOOL_QUICK=1 skips sanitizers and fuzzing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --test
fuzz_seconds=${SPOOL_FUZZ_SECONDS:-40}
passed=0; failed=0; skipped=0

count() {  # adds a meson test log's results to the totals
  read -r p f s < <(python3 - "$1" <<'PY'
import json, sys
p = f = s = 0
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    if r in ("OK", "EXPECTEDFAIL"): p += 1
    elif r == "SKIP": s += 1
    else: f += 1
print(p, f, s)
PY
)
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}

suite() {  # suite BUILD_DIR MESON_ARGS...
  local dir=$1; shift
  [ -d "$dir" ] || meson setup "$dir" -Dwerror=true "$@" >/dev/null
  ninja -C "$dir"
  meson test -C "$dir" --print-errorlogs --num-processes 2 || true
  count "$dir/meson-logs/testlog.json"
}
# The sanitizer run repeats every test, with the data-heavy ones (1 GiB of sends, 200
# crash rounds) scaled down: ASan makes them several times slower and they prove the
# same there at a smaller size. SPOOL_TEST_SCALE is read by those tests.

echo "== test suite (both I/O backends)"
suite build-test --buildtype=debugoptimized
if [ "${SPOOL_QUICK:-0}" != 1 ]; then
  echo "== test suite under ASan+UBSan"
  SPOOL_TEST_SCALE=0.125 suite build-asan --buildtype=debug -Db_sanitize=address,undefined -Db_lundef=false -Dbench=false
  # ThreadSanitizer: only the suite 'tsan' (tests/meson.build says which tests and why the
  # multi-process ones are left out), built with clang (gcc refuses the index's
  # atomic_thread_fence under -Werror=tsan); `meson test` builds just what those tests need.
  # Reports are written to build-tsan/tsan-report.PID (spoolfs, spool work and their
  # helpers too): each one is printed and counted as a failure.
  echo "== threaded tests under ThreadSanitizer"
  dir=build-tsan
  [ -d $dir ] || CXX=clang++ meson setup $dir -Dwerror=true --buildtype=debugoptimized -Db_sanitize=thread \
    -Db_lundef=false -Dbench=false >/dev/null
  rm -f $dir/tsan-report.*
  meson test -C $dir --suite tsan --print-errorlogs --num-processes 2 || true
  count "$dir/meson-logs/testlog.json"
  for report in $dir/tsan-report.*; do
    [ -f "$report" ] || continue
    echo "ThreadSanitizer report $report:"; cat "$report"; failed=$((failed + 1))
  done
  echo "== fuzzers, ${fuzz_seconds}s each"
  dir=build-fuzz
  [ -d $dir ] || CXX=clang++ meson setup $dir -Dwerror=true -Dfuzz=true -Dtests=false -Dbench=false \
    -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
  ninja -C $dir $(cd fuzz && ls fuzz_*.cc | sed 's|\.cc$||; s|^|fuzz/|')
  # Two at a time, one per core: the same fuzzing time per target in 3/5 of the wall time.
  fuzz_one() {  # fuzz_one TARGET: leaves TARGET.log and TARGET.result ("ok N" or "FAILED")
    local target=$1 name corpus
    name=$(basename "$target"); corpus=$(mktemp -d)
    cp -r "fuzz/corpus/${name#fuzz_}/." "$corpus/" 2>/dev/null || true
    if "$target" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 "$corpus" >"$target.log" 2>&1; then
      echo "ok $(find "$corpus" -type f | wc -l)" >"$target.result"
    else
      echo FAILED >"$target.result"
    fi
    rm -rf "$corpus"
  }
  targets=()
  for target in $dir/fuzz/fuzz_*; do
    [ -f "$target" ] && [ -x "$target" ] && targets+=("$target")
  done
  for target in "${targets[@]}"; do
    rm -f "$target.result"
    fuzz_one "$target" &
    while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n || true; done
  done
  wait
  for target in "${targets[@]}"; do
    name=$(basename "$target")
    read -r result entries <"$target.result" || result=FAILED
    if [ "$result" = ok ]; then
      echo "fuzz $name: ok ($entries corpus entries)"; passed=$((passed + 1))
    else
      echo "fuzz $name: FAILED"; tail -n 40 "$target.log"; failed=$((failed + 1))
    fi
  done
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
