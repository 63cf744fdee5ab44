#!/bin/bash
# Cross-builds spool for arm64 (aarch64) on an amd64 Debian 12 machine and runs the unit
# tests under qemu-user. Sets up, if missing: the arm64 architecture in dpkg (multiarch;
# the amd64 packages are untouched: apt installs the arm64 -dev packages beside them), the
# crossbuild-essential-arm64 toolchain, qemu-user-static, and the arm64 -dev packages spool
# builds with. Build directory: build-arm64 (meson cross file scripts/arm64-cross.ini).
#
#   bash scripts/cross-arm64.sh                     every GoogleTest case, one by one
#   bash scripts/cross-arm64.sh MESON_TEST_ARGS...  meson test instead, e.g. --suite storage
#
# What runs, and the last run's results: docs/footprint.md, "arm64". In short: the
# GoogleTest cases of the storage, queue, queue-process, compact, verify and beyond suites,
# each under qemu-aarch64-static with a time limit (SPOOL_CASE_TIMEOUT, default 120 s) and
# SPOOL_IO=pwrite (qemu-user 7.2 does not emulate io_uring; the library falls back to pwrite
# by itself, the variable makes the choice explicit). Cases that kill a process while it
# holds the index's robust mutex cannot pass under qemu-user, which does not implement
# set_robust_list (ENOSYS), so the kernel never reports the dead owner: they time out.
# Tests that run other arm64 programs from a shell or by exec (cli, install, fuse,
# crash-campaign, faults, bad-input) need binfmt_misc to start a foreign binary and are
# left out (this VM has none mounted). Not part of scripts/test.sh: the cross build and the
# emulated run take tens of minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "spool: adding the arm64 architecture to dpkg (multiarch)"
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
fi
pkgs=(crossbuild-essential-arm64 qemu-user-static meson ninja-build pkg-config
      libcli11-dev nlohmann-json3-dev
      liburing-dev:arm64 libxxhash-dev:arm64 libspdlog-dev:arm64 libfmt-dev:arm64
      libboost-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64 libfuse3-dev:arm64)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "spool: installing ${missing[*]}"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

dir=build-arm64
[ -d $dir ] || meson setup $dir --cross-file scripts/arm64-cross.ini -Dwerror=true -Dbench=false >/dev/null
# The library, the tools and the test programs run below; not every target: the
# benchmarks and the fault/crash campaigns (they need binfmt_misc) are left out.
targets=(libspool.so.0.1.0 libspool.a tools/spool tools/spool-dump fuse/spoolfs examples/spool-producer
         examples/spool-worker)
for t in storage_test queue_test queue_process_test compact_test verify_test beyond_test; do
  targets+=("tests/$t")
done
ninja -C $dir -j2 "${targets[@]}"
file $dir/libspool.so.0.*[0-9] | sed 's/, BuildID.*//'

# No QEMU_LD_PREFIX: the multiarch libc6:arm64 puts the arm64 loader at
# /lib/ld-linux-aarch64.so.1, where qemu finds it, next to the arm64 liburing, spdlog...
# With QEMU_LD_PREFIX=/usr/aarch64-linux-gnu the cross toolchain's older libc
# (libc6-arm64-cross 2.36-8cross1) was mixed with those libraries and every program spun
# at 100% CPU in its first queue operation.
unset QEMU_LD_PREFIX
export SPOOL_IO=pwrite
if [ $# -gt 0 ]; then
  exec meson test -C $dir --print-errorlogs "$@"
fi
# Each GoogleTest case on its own under qemu, with a time limit, so that one case that
# cannot work under emulation (see docs/footprint.md, "arm64") is reported by name instead
# of holding up its whole binary until meson's timeout. SPOOL_TEST_SCALE shrinks the
# data-heavy cases, as under the sanitizers (emulation is several times slower).
export SPOOL_TEST_SCALE=${SPOOL_TEST_SCALE:-0.125}
limit=${SPOOL_CASE_TIMEOUT:-120}
passed=0; failed=0; timedout=0; skipped=0
for bin in storage_test queue_test queue_process_test compact_test verify_test beyond_test; do
  exe=$dir/tests/$bin
  [ -x "$exe" ] || continue
  mapfile -t cases < <(qemu-aarch64-static "$exe" --gtest_list_tests |
    awk '/^[^ ]/ {suite=$1} /^  / {print suite $1}')
  for c in "${cases[@]}"; do
    SECONDS=0
    rc=0
    timeout -k 5 "$limit" qemu-aarch64-static "$exe" --gtest_filter="$c" >"$dir/case.log" 2>&1 || rc=$?
    if [ $rc = 0 ] && grep -q '^\[  SKIPPED \] 1 test' "$dir/case.log"; then
      result=SKIP; skipped=$((skipped + 1))
    elif [ $rc = 0 ]; then
      result=ok; passed=$((passed + 1))
    elif [ $rc = 124 ] || [ $rc = 137 ]; then
      result="TIMEOUT (${limit}s)"; timedout=$((timedout + 1))
    else
      result="FAIL (exit $rc)"; failed=$((failed + 1))
      grep -E 'Failure|error:|Expected|Which is|actual' "$dir/case.log" | head -n 6 | sed 's/^/      /'
    fi
    printf '%-20s %-75s %s (%ss)\n' "$bin" "$c" "$result" "$SECONDS"
  done
done
echo "arm64 under qemu-user: $passed passed, $((failed + timedout)) failed, $skipped skipped ($timedout of the failures timed out)"
