#!/bin/bash
# Cross-builds spool for 64-bit ARM (arm64, aarch64) or 32-bit ARM (armhf: ARMv7, hard float)
# on an amd64 Debian 12 machine and runs the unit tests under qemu-user. Sets up, if missing:
# the architecture in dpkg (multiarch; the amd64 packages are untouched: apt installs the
# ARCH -dev packages beside them), the crossbuild-essential-ARCH toolchain,
# qemu-user-static, and the ARCH -dev packages spool builds with. Meson cross files:
# scripts/arm64-cross.ini, scripts/armhf-cross.ini. scripts/cross-arm64.sh is
# `cross-arm.sh arm64`.
#
#   bash scripts/cross-arm.sh ARCH                     every GoogleTest case, one by one,
#                                                      then tests/cli_test.sh
#   bash scripts/cross-arm.sh ARCH MESON_TEST_ARGS...  meson test instead, e.g. --suite storage
#
#   ARCH               arm64 or armhf
#   SPOOL_CROSS_BUILD  build directory (default build-ARCH; SPOOL_ARM64_BUILD for arm64)
#   SPOOL_CROSS_TESTS  "beyond_test ..." runs only those programs, and not the cli test
#                      (SPOOL_ARM64_TESTS for arm64)
#   SPOOL_JOBS         ninja -j (default 2)
#   SPOOL_CASE_TIMEOUT seconds per GoogleTest case under qemu (default 120)
#   SPOOL_TEST_SCALE   data size of the heavy cases (default 0.125, as under the sanitizers)
#   SPOOL_IO           I/O backend for every program (default: the one its meson test sets,
#                      else the library's default, mmap)
#
# What runs, and the last runs' results: docs/footprint.md, "arm64" and "armhf". In short:
# every case of the GoogleTest programs, each under qemu-ARCH-static with a time limit, and
# the CLI test with the cross-built `spool`. qemu-user 7.2 does not emulate io_uring: the
# io_uring backend is not tested (the library falls back to pwrite by itself). Without
# binfmt_misc, programs that exec the CLI get a shell-script wrapper that starts it under
# qemu. The cases that kill a process while it holds the index's robust mutex cannot pass
# under qemu-user, which answers set_robust_list with ENOSYS, so the kernel never reports
# the dead owner: a probe checks that, and if so they are listed as NOT RUN by name (not
# counted as passed). Not part of scripts/test.sh: the cross build and the emulated run
# take tens of minutes on 2 cores. Exits non-zero if a case failed or timed out.
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-}
case $arch in
  arm64) triplet=aarch64-linux-gnu; qemu_arch=aarch64
         build_default=${SPOOL_ARM64_BUILD:-build-arm64}; tests_default=${SPOOL_ARM64_TESTS:-} ;;
  armhf) triplet=arm-linux-gnueabihf; qemu_arch=arm
         build_default=build-armhf; tests_default= ;;
  *) echo "usage: $0 arm64|armhf [MESON_TEST_ARGS...]" >&2; exit 2 ;;
esac
shift
qemu=qemu-$qemu_arch-static
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive

if ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
  echo "spool: adding the $arch architecture to dpkg (multiarch)"
  $SUDO dpkg --add-architecture "$arch"
  $SUDO apt-get update -qq
fi
pkgs=(crossbuild-essential-$arch qemu-user-static meson ninja-build pkg-config
      libcli11-dev nlohmann-json3-dev)
for p in liburing-dev libxxhash-dev libspdlog-dev libfmt-dev libboost-dev libgtest-dev \
         libgmock-dev libfuse3-dev; do pkgs+=("$p:$arch"); done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "spool: installing ${missing[*]}"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

dir=${SPOOL_CROSS_BUILD:-$build_default}
jobs=${SPOOL_JOBS:-2}
[ -d "$dir" ] || meson setup "$dir" --cross-file "scripts/$arch-cross.ini" -Dwerror=true -Dbench=false >/dev/null
# The library, the tools and the test programs run below; not every target: the benchmarks,
# the fuzzers and the NATS test helper are left out.
gtests=(storage_test index_test mapped_test queue_test queue_process_test attributes_test
        compact_test verify_test beyond_test faults_test corruption_test hostile_test
        bad_input_test crash_campaign_test damage_campaign_test)
only=${SPOOL_CROSS_TESTS:-$tests_default}
[ -n "$only" ] && read -r -a gtests <<<"$only"
targets=(libspool.so.0.1.0 libspool.a tools/spool tools/spool-dump fuse/spoolfs examples/spool-producer
         examples/spool-worker)
for t in "${gtests[@]}"; do targets+=("tests/$t"); done
ninja -C "$dir" -j"$jobs" "${targets[@]}"
file "$dir"/libspool.so.0.*[0-9] | sed 's/, BuildID.*//'

# No QEMU_LD_PREFIX: the multiarch libc6:ARCH puts the loader in /lib
# (ld-linux-aarch64.so.1, ld-linux-armhf.so.3), where qemu finds it, next to the ARCH
# liburing, spdlog... (-L /usr/TRIPLET would load the cross toolchain's libc6-ARCH-cross
# instead, a different build of glibc from the one the multiarch libraries come with.)
unset QEMU_LD_PREFIX
io_forced=${SPOOL_IO:-}
if [ $# -gt 0 ]; then
  exec meson test -C "$dir" --print-errorlogs "$@"
fi

# Without binfmt_misc the kernel cannot start an ARCH program, so the tests that exec the
# `spool` CLI (bad-input, crash-campaign, cli) are given a host shell script that runs it
# under qemu: an exec of a script works from inside qemu-user (the kernel starts the host
# shell, which execs qemu-ARCH-static on the ARCH binary).
abs=$(cd "$dir" && pwd)
mkdir -p "$dir/qemu-wrap"
for t in spool spool-dump; do  # (tests/cli_test.sh looks for spool-dump beside spool)
  printf '#!/bin/sh\nexec %s %s/tools/%s "$@"\n' "$qemu" "$abs" "$t" >"$dir/qemu-wrap/$t"
  chmod +x "$dir/qemu-wrap/$t"
done
binfmt=no
[ -e /proc/sys/fs/binfmt_misc/qemu-$qemu_arch ] && binfmt=yes

# Robust futexes, checked rather than assumed: a probe forks a child that locks a robust
# process-shared mutex and exits, then the parent times a lock. On a real kernel it gets
# EOWNERDEAD; qemu-user 7.2 answers set_robust_list with ENOSYS, so the kernel never walks
# the guest's robust list when the child dies and the lock times out.
cat >"$dir/robust_probe.c" <<'PROBE'
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
int main(void) {
  pthread_mutex_t* m = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  if (m == MAP_FAILED || pthread_mutex_init(m, &a) != 0) return 2;
  pid_t p = fork();
  if (p == 0) { pthread_mutex_lock(m); _exit(0); }
  waitpid(p, 0, 0);
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += 2;
  int r = pthread_mutex_timedlock(m, &t);
  puts(r == 130 ? "EOWNERDEAD" : r == 110 ? "ETIMEDOUT" : "other");
  return 0;
}
PROBE
$triplet-gcc -O2 -pthread "$dir/robust_probe.c" -o "$dir/robust_probe"
robust=$($qemu "$dir/robust_probe")
robust_syscall=$($qemu -strace "$dir/robust_probe" 2>&1 | grep -m1 -o 'set_robust_list(.*' || true)
echo "robust-mutex probe under qemu: lock after the holder exited -> $robust; ${robust_syscall:-set_robust_list not called}"
# The cases that always kill a process while it holds the index's robust mutex: when the
# probe shows the emulator cannot report a dead owner, they are NOT RUN, by name and loudly.
robust_cases=(QueueProcessTest.HolderKilledRightAfterLockingDoesNotWedgeOthers
              QueueProcessTest.HolderKilledBetweenLogAppendAndIndexUpdateLosesNothing
              BeyondTest.BindingSurvivesTheRepairAfterItsOwnerDiedHoldingTheLock
              LockHolderDeath.KilledInsideTheLockDuringEachOperationChangesNothingAndWedgesNothing
              LockHolderDeath.HolderKilledWhileStoppedReleasesTheWaiter
              LockHolderDeath.RepairAtEveryStepOfACompactionLosesNothing
              LockHolderDeath.FirstOpenerAfterARepairWasKilledMidwayDoesNotTrustTheIndex
              AttributesTest.DedupHoldsAfterAProcessIsKilledHoldingTheLock
              AttributesTest.DedupHoldsForASendKilledAfterItsAppend)
# Cases that run their own program again through a host program (setpriv, to drop root):
# the host kernel cannot start an ARCH binary without binfmt_misc, and the wrapper above
# only stands in for the CLI.
exec_cases=(SegmentOpenTest.UnreadableSegmentIsAnErrorNotACrash)
# Cases that SIGKILL processes at random moments (CompactTest.KillNine..., the crash
# campaign, BeyondTest.PidNamespaces..., whose victim's flusher thread may hold the lock)
# hit a lock holder only sometimes. Every case that runs out of time is examined before it
# is killed: if one of its processes sleeps in FUTEX_WAIT on a word that names a thread
# (TID | FUTEX_WAITERS: how a robust mutex is left when its holder dies and nobody sets
# FUTEX_OWNER_DIED) that is no live thread of the test, at any PID-namespace level, it is
# reported as WEDGED with that TID and counted apart from the failures.
# (/proc/TID/syscall: 202 is futex on an x86-64 host.)
alive() {  # PID has not exited (an exited, not yet reaped child is a zombie: state Z)
  local st
  st=$(sed 's/.*) //' /proc/"$1"/stat 2>/dev/null | cut -d' ' -f1)
  [ -n "$st" ] && [ "$st" != Z ]
}
wedge_of() {  # SID: "PID waits on ... TID" for the first such waiter in the session, or nothing
  local p t nr addr op val tid pids ids
  pids=$(ps -e -o pid=,sid= | awk -v s="$1" '$2 == s {print $1}')
  ids=$(for p in $pids; do cat /proc/"$p"/task/*/status 2>/dev/null; done |
        sed -n 's/^NSpid:[[:space:]]*//p' | tr -s ' \t' '\n\n')
  for p in $pids; do
    for t in /proc/"$p"/task/*; do
      read -r nr addr op val _ <"$t/syscall" 2>/dev/null || continue
      [ "$nr" = 202 ] || continue
      case $(( op & 0x7f )) in 0|9) ;; *) continue ;; esac
      [ $(( val & 0xc0000000 )) = $(( 0x80000000 )) ] || continue
      tid=$(( val & 0x3fffffff ))
      if [ "$tid" -gt 0 ] && ! grep -qx "$tid" <<<"$ids"; then
        echo "process $p sleeps in FUTEX_WAIT at $addr on a lock owned by TID $tid, no live thread of this test"
        return
      fi
    done
  done
}

# Each GoogleTest case on its own under qemu, with a time limit, so that one case that
# cannot work under emulation is reported by name instead of holding up its whole binary
# until meson's timeout. Each program gets the environment of its meson test (meson
# introspect: SPOOL_KNOWN_BUG_*, SPOOL_CLI), with SPOOL_CLI pointing at
# the wrapper, and SPOOL_IO as its meson test sets it unless SPOOL_IO was given (the
# library's default, mmap, where the test sets none). SPOOL_TEST_SCALE shrinks the data-heavy cases, as under the sanitizers
# (emulation is several times slower).
export SPOOL_TEST_SCALE=${SPOOL_TEST_SCALE:-0.125}
limit=${SPOOL_CASE_TIMEOUT:-120}
meson introspect "$dir" --tests >"$dir/tests.json"
test_env() {  # NAME=VALUE lines of the (first) meson test that runs tests/$1
  python3 -c '
import json, sys
for t in json.load(open(sys.argv[1])):
    if t["cmd"] and t["cmd"][0].endswith("/tests/" + sys.argv[2]):
        for k, v in sorted(t["env"].items()):
            if k != "SPOOL_IO" or not sys.argv[3]:
                print(f"{k}={v}")
        break
' "$dir/tests.json" "$1" "$io_forced"
  [ -z "$io_forced" ] || echo "SPOOL_IO=$io_forced"
}
passed=0; failed=0; timedout=0; skipped=0; qemu_skipped=0; wedged=0
started=$(date +%s)
for bin in "${gtests[@]}"; do
  exe=$dir/tests/$bin
  [ -x "$exe" ] || { echo "$bin: NOT BUILT"; failed=$((failed + 1)); continue; }
  mapfile -t envs < <(test_env "$bin")
  for i in "${!envs[@]}"; do
    case ${envs[$i]} in SPOOL_CLI=*) envs[$i]=SPOOL_CLI=$abs/qemu-wrap/spool ;; esac
  done
  mapfile -t cases < <($qemu "$exe" --gtest_list_tests |
    awk '/^[^ ]/ {suite=$1} /^  / {print suite $1}')
  for c in "${cases[@]}"; do
    if [ "$robust" != EOWNERDEAD ] && printf '%s\n' "${robust_cases[@]}" | grep -qx "$c"; then
      printf '%-20s %-75s %s\n' "$bin" "$c" "NOT RUN UNDER QEMU (needs EOWNERDEAD; probe: $robust)"
      qemu_skipped=$((qemu_skipped + 1))
      continue
    fi
    if [ $binfmt = no ] && printf '%s\n' "${exec_cases[@]}" | grep -qx "$c"; then
      printf '%-20s %-75s %s\n' "$bin" "$c" "NOT RUN UNDER QEMU (execs itself through setpriv; no binfmt_misc)"
      qemu_skipped=$((qemu_skipped + 1))
      continue
    fi
    SECONDS=0
    rc=0
    wedge=""
    # In its own session, so that it and every process it forked can be examined and killed.
    env "${envs[@]}" setsid $qemu "$exe" --gtest_filter="$c" >"$dir/case.log" 2>&1 &
    pid=$!
    while alive $pid && [ $SECONDS -lt "$limit" ]; do sleep 0.2; done
    if alive $pid; then
      wedge=$(wedge_of $pid)
      kill -KILL -- -$pid 2>/dev/null || true
      wait $pid 2>/dev/null || true
      rc=124
    else
      wait $pid || rc=$?
    fi
    # Leftovers of a killed case (forked children outside the session's leader) go too.
    for p in $(ps -e -o pid=,sid= | awk -v s=$pid '$2 == s {print $1}'); do kill -KILL "$p" 2>/dev/null || true; done
    if [ $rc = 0 ] && grep -q '^\[  SKIPPED \] 1 test' "$dir/case.log"; then
      result=SKIP; skipped=$((skipped + 1))
    elif [ $rc = 0 ]; then
      result=ok; passed=$((passed + 1))
    elif [ $rc = 124 ] && [ -n "$wedge" ]; then
      result="WEDGED UNDER QEMU after ${limit}s (no EOWNERDEAD)"; wedged=$((wedged + 1))
    elif [ $rc = 124 ] || [ $rc = 137 ]; then
      result="TIMEOUT (${limit}s)"; timedout=$((timedout + 1))
    else
      result="FAIL (exit $rc)"; failed=$((failed + 1))
    fi
    printf '%-20s %-75s %s (%ss)\n' "$bin" "$c" "$result" "$SECONDS"
    case $result in
      WEDGED*) echo "      $wedge" ;;
      SKIP) grep -m2 -E 'SKIPPED|KNOWN' "$dir/case.log" | grep -v '^\[' | head -n 2 | sed 's/^/      /' || true ;;
      FAIL*) grep -E 'Failure|error:|Expected|Which is|actual' "$dir/case.log" | head -n 6 | sed 's/^/      /' || true ;;
    esac
  done
done

# The CLI end to end (tests/cli_test.sh, TAP) with the wrapped ARCH binary.
SECONDS=0
cli_rc=0
: >"$dir/cli.tap"
[ -n "$only" ] ||
  timeout -k 5 1200 bash tests/cli_test.sh "$dir/qemu-wrap/spool" >"$dir/cli.tap" 2>&1 || cli_rc=$?
cli_ok=$(grep -c '^ok ' "$dir/cli.tap" || true); cli_not=$(grep -c '^not ok ' "$dir/cli.tap" || true)
grep '^not ok ' "$dir/cli.tap" | sed 's/^/      /' || true
echo "cli (tests/cli_test.sh): $cli_ok ok, $cli_not not ok, exit $cli_rc (${SECONDS}s)"

echo
echo "$arch under qemu-user ($($qemu --version | head -n1)), $(( $(date +%s) - started ))s:"
echo "  GoogleTest cases: $passed passed, $((failed + timedout)) failed ($timedout timed out), $skipped skipped by the test itself"
if [ $qemu_skipped -gt 0 ]; then
  echo "  *** $qemu_skipped case(s) NOT RUN: they kill a holder of the index's robust mutex, and under"
  echo "  *** qemu-user the next locker never gets EOWNERDEAD (probe: $robust; ${robust_syscall:-set_robust_list not called}),"
  echo "  *** or (without binfmt_misc) they exec their own $arch program through a host one."
  echo "  *** They need $arch hardware or a full-system VM."
fi
if [ $wedged -gt 0 ]; then
  echo "  *** $wedged case(s) WEDGED: a random SIGKILL landed inside the index lock, and a survivor waits"
  echo "  *** for ever on the dead holder's futex (the same qemu-user limit); not counted as failed."
fi
echo "  cli (tests/cli_test.sh): $cli_ok ok, $cli_not not ok"
echo "  *** NOT RUN under qemu: install (meson install, then the examples compiled and run), fuse"
echo "  *** (/dev/fuse with an emulated spoolfs), forward (nats-server); nor the io_uring backend"
echo "  *** (qemu-user 7.2 has no io_uring)."
echo "  binfmt_misc handler for $qemu_arch: $binfmt"
[ $failed = 0 ] && [ $timedout = 0 ] && [ "$cli_rc" = 0 ]
