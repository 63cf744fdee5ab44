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
# Every failure is named again at the very end, with the end of its output: CI shows the
# tail of a long log, where the first suite's errors have long scrolled away.
summary=$(mktemp); trap 'rm -f "$summary"' EXIT
fail() {  # fail WHAT: counts one failure and names it in the final summary
  failed=$((failed + 1)); echo "FAILED: $1" >>"$summary"
}

count() {  # count TESTLOG: adds a meson test log's results to the totals
  # A test that never wrote its log (the build or `meson test` itself failed) is a failure,
  # never the previous run's log: suite() and the TSan step delete it before each run.
  # Skips are counted by case, not only by test: a gtest GTEST_SKIP exits 0 (meson says OK)
  # and a TAP "ok N ... # SKIP" line passes, so each "[  SKIPPED ] Suite.Case (N ms)" and
  # each TAP skip in a test's output counts as one skipped case, printed by name.
  local log=$1 out
  if [ ! -f "$log" ]; then
    echo "FAILED: no $log: meson test did not run to the end (see its errors above)"
    fail "no $log: meson test did not run to the end"
    return
  fi
  if ! out=$(python3 - "$log" "$summary" <<'PY'
import json, re, sys
p = f = s = 0
gtest_skip = re.compile(r"^\[  SKIPPED \] (\S+?)(?:, where .*)? \(\d+ ms\)$")
tap_skip = re.compile(r"^ok\b.*?#\s*skip\b\s*(.*)$", re.IGNORECASE)
tap_plan_skip = re.compile(r"^1\.\.0\s*#\s*skip\b\s*(.*)$", re.IGNORECASE)
for line in open(sys.argv[1]):
    t = json.loads(line)
    r, name, lines = t["result"], t["name"], (t.get("stdout") or "").splitlines()
    if r in ("OK", "EXPECTEDFAIL"): p += 1
    elif r == "SKIP": s += 1
    else:
        f += 1
        with open(sys.argv[2], "a") as out:
            # gtest's "Failure" lines with the 4 after each (the assertion), then the end.
            picked = [i + k for i, l in enumerate(lines) if "Failure" in l for k in range(5)]
            picked = sorted(set(i for i in picked if i < len(lines)))[:40]
            out.write(f"FAILED: {name} ({r}); its failures and the end of its output:\n")
            out.writelines("    " + lines[i] + "\n" for i in picked)
            if picked: out.write("    ...\n")
            out.writelines("    " + l + "\n" for l in lines[-20:])
    if r == "SKIP":  # one skip, with the reason a TAP plan "1..0 # SKIP why" gives
        why = [m.group(1) for m in map(tap_plan_skip.match, map(str.strip, lines)) if m]
        print(f"skipped: {name}: the whole test" + (f" ({why[0]})" if why else ""))
        continue
    cases = []
    for l in map(str.strip, lines):
        m = gtest_skip.match(l)
        if m and m.group(1) not in cases: cases.append(m.group(1))
        elif tap_skip.match(l): cases.append(l)
    for c in cases: print(f"skipped: {name}: {c}")
    s += len(cases)
print(p, f, s)
PY
  ); then
    echo "FAILED: cannot read $log"
    fail "cannot read $log"
    return
  fi
  local p f s
  read -r p f s < <(tail -n 1 <<<"$out")
  sed '$d' <<<"$out"
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}

suite() {  # suite BUILD_DIR MESON_ARGS...
  local dir=$1; shift
  [ -d "$dir" ] || meson setup "$dir" -Dwerror=true "$@" >/dev/null
  rm -f "$dir/meson-logs/testlog.json"
  if ! ninja -C "$dir"; then
    echo "FAILED: the build in $dir; its tests did not run"
    fail "the build in $dir"
    return
  fi
  meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes 2 || true
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
  # atomic_thread_fence under -Werror=tsan); only what those tests need is built (the
  # targets they run and depend on, from meson introspect), and a failed build is a failure.
  # Reports are written to build-tsan/tsan-report.PID (spoolfs, spool work and their
  # helpers too): each one is printed and counted as a failure.
  echo "== threaded tests under ThreadSanitizer"
  dir=build-tsan
  [ -d $dir ] || CXX=clang++ meson setup $dir -Dwerror=true --buildtype=debugoptimized -Db_sanitize=thread \
    -Db_lundef=false -Dbench=false >/dev/null
  rm -f $dir/tsan-report.* $dir/meson-logs/testlog.json
  if ! tsan_targets=$(meson introspect $dir --tests --targets | python3 -c '
import json, os, sys
d = json.load(sys.stdin)
files = {t["id"]: t["filename"] for t in d["targets"]}
want = set()
for t in d["tests"]:
    if not any(s.endswith(":tsan") or s == "tsan" for s in t["suite"]):
        continue
    for dep in t["depends"]:
        want.update(files.get(dep, []))
root = os.path.realpath(sys.argv[1])
if not want:
    sys.exit("no tsan tests")
print(" ".join(sorted(os.path.relpath(os.path.realpath(f), root) for f in want)))
' $dir); then
    echo "FAILED: cannot list the targets of the tsan tests in $dir"; fail "listing the tsan targets"
  elif read -ra tsan_targets <<<"$tsan_targets" && ! ninja -C $dir "${tsan_targets[@]}"; then
    echo "FAILED: the ThreadSanitizer build in $dir; its tests did not run"; fail "the build in $dir"
  else
    meson test -C $dir --no-rebuild --suite tsan --print-errorlogs --num-processes 2 || true
    count "$dir/meson-logs/testlog.json"
  fi
  for report in $dir/tsan-report.*; do
    [ -f "$report" ] || continue
    echo "ThreadSanitizer report $report:"; cat "$report"; fail "ThreadSanitizer report $report"
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
      echo "fuzz $name: FAILED"; tail -n 40 "$target.log"; fail "fuzz $name"
    fi
  done
fi
# passed/failed count meson tests (and fuzz targets); skipped counts whole tests meson skipped
# plus the skipped cases inside the others (each one is listed above as "skipped: ...").
if [ -s "$summary" ]; then echo "== failures"; cat "$summary"; fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
