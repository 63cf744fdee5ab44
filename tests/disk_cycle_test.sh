#!/usr/bin/env bash
# Issue 48: acked disk is reclaimed under a CLI-driven workload. Compaction runs in a
# background thread of the process that rolled a segment, so with `spool send`, `recv` and
# `ack` commands that exit at once it never ran: on a 64 MiB ext4 file system a queue that
# is empty after every cycle failed its sends after a few cycles with "No space left on
# device ... the 0 queued messages". A send that meets a full disk now compacts first.
#
#   bash tests/disk_cycle_test.sh build/tools/spool
#
# Issue 43, small devices: on a file system with 560 KiB free, a 200 KB send was refused
# ("No space left on device") because the room kept for draining the queue was asked for as
# a whole spare segment of the next size (512 KiB). A spare of the room still short is made
# instead, so a send whose record fits succeeds; one that cannot fit still fails with a
# clear error, nothing queued is lost, and the queue drains and takes sends again (the end
# of this file, on a tmpfs of 560 KiB).
#
# Needs root, mkfs.ext4 and a loop device; without them it exits 77 (skipped) saying why.
set -u
if [[ $# -ne 1 || ! -x $1 ]]; then
  echo "usage: $0 PATH_TO_SPOOL" >&2
  exit 2
fi
SPOOL=$(realpath "$1")
skip() {
  echo "*** SKIPPED: $* -- the full-disk CLI cycle of issue 48 is untested here" | tee /dev/stderr
  exit 77
}
[[ $(id -u) == 0 ]] || skip "not root: a loop file system cannot be mounted"
command -v mkfs.ext4 >/dev/null || skip "mkfs.ext4 is not installed (e2fsprogs)"
D=$(mktemp -d "${TMPDIR:-/tmp}/spool-disk-cycle.XXXXXX")
M=$D/mnt
S=$D/small
cleanup() {
  mountpoint -q "$M" && umount "$M"
  mountpoint -q "$S" && umount "$S"
  rm -rf "$D"
}
trap cleanup EXIT
mkdir "$M"
truncate -s 64M "$D/img" && mkfs.ext4 -q -F "$D/img" || skip "mkfs.ext4 of a 64 MiB image failed"
mount -o loop,nosuid,nodev "$D/img" "$M" 2>"$D/err" || skip "mount -o loop failed: $(cat "$D/err")"

fail() {
  echo "FAIL: $*"
  df -k "$M" "$S" 2>/dev/null | tail -n +2
  ls -l "$M"/*/segments "$S"/q 2>/dev/null
  exit 1
}
# 10 messages of 400 KB: 4 MiB a cycle.
python3 -c "print('\n'.join(('%05d' % i) * 80000 for i in range(10)))" >"$D/lines"

# cycle Q N: N rounds of send, receive and ack of every message, each a command of its own.
# Prints the round that failed, or nothing.
cycle() {
  local q=$1 n=$2 c
  for ((c = 1; c <= n; c++)); do
    if ! "$SPOOL" send "$q" --lines <"$D/lines" >/dev/null 2>"$D/send.err"; then
      echo "$c"
      return 1
    fi
    "$SPOOL" recv "$q" -n 10 --json >"$D/got" || fail "round $c: recv failed"
    [[ $(wc -l <"$D/got") == 10 ]] || fail "round $c: received $(wc -l <"$D/got") of 10"
    grep -o '"receipt":"[^"]*"' "$D/got" | cut -d '"' -f 4 >"$D/receipts"  # sed's .* is slow on 400 KB lines
    xargs "$SPOOL" ack "$q" <"$D/receipts" || fail "round $c: ack failed"
  done
}

# 4 MiB segments: 30 rounds (120 MiB through a 55 MiB file system) all go through.
"$SPOOL" init "$M/q" --segment-size 4M || fail "init"
round=$(cycle "$M/q" 30) || fail "round $round: send failed: $(cat "$D/send.err")"
echo "ok: 30 rounds of 4 MiB on a 64 MiB ext4: $(df -k --output=used "$M" | tail -n 1) KiB used"
rm -rf "$M/q"

# The default 64 MiB segments: segments double up to 32 MiB, whose successor (64 MiB) cannot
# fit. Until issue 43 a send then failed ("the next segment (64 MiB) does not fit"); now the
# spare is made of the room the send lacks, and every round goes through.
"$SPOOL" init "$M/big" || fail "init"
round=$(cycle "$M/big" 30) || fail "round $round with 64 MiB segments: send failed: $(cat "$D/send.err")"
echo "ok: 30 rounds with 64 MiB segments on a 64 MiB ext4: $(df -k --output=used "$M" | tail -n 1) KiB used"

# ---- Issue 43: a small device (a tmpfs of 560 KiB).
mkdir "$S"
mount -t tmpfs -o size=560k,mode=0700 spool-small "$S" 2>"$D/err" || fail "mount -t tmpfs failed: $(cat "$D/err")"
echo "free before init: $(df -k --output=avail "$S" | tail -n 1) KiB"
"$SPOOL" init "$S/q" || fail "init"
echo "free after init: $(df -k --output=avail "$S" | tail -n 1) KiB"
head -c 200000 /dev/urandom >"$D/m1"
head -c 200000 /dev/urandom >"$D/m2"

# The 200 KB send fits: it succeeds.
"$SPOOL" send "$S/q" <"$D/m1" >/dev/null 2>"$D/err" || fail "a 200 KB send that fits was refused: $(cat "$D/err")"
echo "ok: a 200 KB send on 560 KiB succeeds; free now $(df -k --output=avail "$S" | tail -n 1) KiB"

# A second one does not fit beside it: a clear error, exit 1, and the first is still there.
"$SPOOL" send "$S/q" <"$D/m2" >/dev/null 2>"$D/err"
rc=$?
[[ $rc == 1 ]] || fail "a second 200 KB send exited $rc, not 1: $(cat "$D/err")"
grep -q "No space left on device" "$D/err" && grep -q "does not fit" "$D/err" &&
  grep -q "free disk space" "$D/err" || fail "the full disk's error is unclear: $(cat "$D/err")"
echo "ok: the second 200 KB send fails saying: $(cat "$D/err")"

# Nothing lost: the first message comes out whole and is acked; the queue takes sends again.
# (Another 200 KB one needs a segment of its own, which this device can give once the first
# segment is compacted away, after later sends have filled it: docs/durability.md.)
"$SPOOL" recv "$S/q" >"$D/got" 2>"$D/err" || fail "recv: $(cat "$D/err")"
cmp -s "$D/got" "$D/m1" || fail "the message received is not the one sent"
receipt=$(sed -n 's/^receipt: //p' "$D/err")
"$SPOOL" ack "$S/q" "$receipt" || fail "ack"
head -c 20000 /dev/urandom >"$D/m3"
"$SPOOL" send "$S/q" <"$D/m3" >/dev/null 2>"$D/err" || fail "a 20 KB send after the drain was refused: $(cat "$D/err")"
"$SPOOL" recv "$S/q" >"$D/got" 2>/dev/null || fail "recv of the 20 KB message"
cmp -s "$D/got" "$D/m3" || fail "the 20 KB message received is not the one sent"
echo "ok: drained, the queue takes sends again"
