#!/usr/bin/env bash
# End-to-end test of spoolfs, the filesystem view of queues (docs/filesystem.md is the
# contract): real mounts driven by ordinary shell commands, checked with the spool CLI.
#
#   bash tests/fuse_test.sh build/fuse/spoolfs build/tools/spool
#   FUSE_TEST_ONLY='root|dlq' bash tests/fuse_test.sh ...    # only the tests matching a regex
#
# Output is TAP: "1..N", then "ok N - name" or "not ok N - name" followed by the failed test's
# log as "# ..." lines. Exits 0 only if every test passes. Needs root (or a setuid
# fusermount3) and /dev/fuse; without them it prints "1..0 # SKIP reason" and exits 0.
#
# Every test runs in its own subshell and directory (queue and mount point) under one mktemp
# -d directory. A mount is waited for with a timeout while checking that the daemon lives;
# when the test ends, pass or fail, every mount it made is unmounted (fusermount3 -u, then
# -u -z) and every daemon it started is killed and reaped.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/tap.sh"

tap_args "PATH_TO_SPOOLFS PATH_TO_SPOOL_CLI" "$@"
SPOOLFS=$(abs "$1")
SPOOL=$(abs "$2")
export LC_ALL=C

# ------------------------------------------------------------------ can this machine mount?
skip_all() {
  echo "1..0 # SKIP FUSE TESTS NOT RUN: $* -- spoolfs is untested here"
  exit 0
}
[[ $(id -u) == 0 ]] || skip_all "not root (uid $(id -u)); run as root, or in a container with --device /dev/fuse --cap-add SYS_ADMIN"
[[ -c /dev/fuse ]] || skip_all "/dev/fuse does not exist (docker: --device /dev/fuse)"
if ! { exec 3<>/dev/fuse; } 2>/dev/null; then
  skip_all "/dev/fuse cannot be opened"
fi
exec 3>&-
command -v fusermount3 >/dev/null || skip_all "fusermount3 is not installed (needed for auto_unmount)"
command -v mountpoint >/dev/null || skip_all "mountpoint(1) is not installed"
HAVE_PY=0
command -v python3 >/dev/null && HAVE_PY=1
# fusermount3's auto_unmount watcher cannot work where / is not a mount point (a chroot): it
# first marks / private in a mount namespace of its own, which fails there, and it exits
# without unmounting. A killed spoolfs then leaves a dead mount, which spoolfs itself removes
# when it mounts there again (fuse/dead_mount.h); the kill -9 tests check that instead.
AUTO_UNMOUNT=1
if ! mountpoint -q /; then
  AUTO_UNMOUNT=0
  echo "# NOTE: / is not a mount point here (a chroot?), so fusermount3's auto_unmount" \
    "cannot remove the mount of a killed spoolfs; the kill -9 tests check that the next" \
    "spoolfs removes it instead" | tee /dev/stderr
fi

# in_mount_table DIR: DIR is mounted, even by a dead daemon (which `mountpoint -q` misses:
# its stat fails with "Transport endpoint is not connected"). The table writes a space as \040.
in_mount_table() {
  MP=${1// /\\040} awk '$2 == ENVIRON["MP"] { n++ } END { exit !n }' /proc/self/mounts
}
# dead_mount DIR: DIR is the mount of a dead daemon.
dead_mount() { in_mount_table "$1" && [[ $(stat "$1" 2>&1) == *"not connected"* ]]; }
# unmount DIR: unmounts DIR if it is mounted.
unmount() {
  in_mount_table "$1" || return 0
  fusermount3 -u "$1" 2>/dev/null || fusermount3 -u -z "$1"
}

ROOT=$(mktemp -d "${TMPDIR:-/tmp}/spoolfs-test.XXXXXX")
cleanup() {
  # A test's own trap unmounts; this catches anything left by an interrupted run.
  local m
  for m in "$ROOT"/*/mnt*; do unmount "$m"; done
  rm -rf "$ROOT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- helpers (used in tests)

# wait_for polls every 0.05 s: mounts and FUSE answers are quick.
POLL=0.05

# mount_fs QUEUE MNT [SPOOLFS ARGS...]: mounts in the foreground mode (-f) as a background
# job, so that the test knows the daemon's pid (in PID, and in PIDS for teardown); waits up to
# 10 s for the mount, failing at once if the daemon exits.
PIDS=()
MNTS=()
mount_fs() {
  local q=$1 m=$2 i
  shift 2
  mkdir -p "$m"
  chmod 700 "$m"
  "$SPOOLFS" "$q" "$m" -f "$@" 2>>"$D/spoolfs.err" &
  PID=$!
  PIDS+=("$PID")
  MNTS+=("$m")
  for ((i = 0; i < 200; i++)); do
    mountpoint -q "$m" && return 0
    alive "$PID" || fail "spoolfs exited before mounting: $(cat "$D/spoolfs.err")"
    sleep 0.05
  done
  fail "$m not mounted after 10 s"
}

# teardown: unmounts every mount of the test and kills and reaps its daemons.
teardown() {
  local m p
  for m in "${MNTS[@]}"; do unmount "$m" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    kill -TERM "$p" 2>/dev/null
  done
  for p in "${PIDS[@]}"; do
    for ((i = 0; i < 50; i++)); do alive "$p" || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
}

new_queue() { "$SPOOL" init "$1" "${@:2}" >/dev/null || fail "spool init $1 failed"; }

# names MNT: the message files listed, one per line, in ls order.
names() { ls "$1" | grep -E '^[0-9]+$'; }
not_mounted() { ! in_mount_table "$1"; }
gone() { ! alive "$1"; }
count_is() { [[ $(names "$1" | wc -l) == "$2" ]]; }
listed() { names "$1" | grep -qx "$2"; }
not_listed() { ! listed "$@"; }

# fails_with TEXT COMMAND...: COMMAND must fail and say TEXT (an strerror, any case) on stderr.
fails_with() {
  local want=$1 err
  shift
  if err=$("$@" 2>&1 >/dev/null); then fail "succeeded: $*"; fi
  grep -qi -- "$want" <<<"$err" || fail "$*: said '$err', want '$want'"
}
write_to() { echo x >"$1"; }
queues() { ls "$1" | tr '\n' ' '; }

# make_dead_letter QUEUE PAYLOAD: sends a message and has it dead-lettered. QUEUE must have
# been made with --max-receives 1 and a short --visibility: one receive, then, once its lease
# has lapsed, the next receive moves the message to the dead-letter queue.
make_dead_letter() {
  "$SPOOL" send "$1" "$2" >/dev/null || fail "spool send failed"
  "$SPOOL" recv "$1" >/dev/null 2>&1 || fail "spool recv failed"
  wait_for 10 dead_lettered "$1"
}
dead_lettered() {
  "$SPOOL" recv "$1" >/dev/null 2>&1
  [[ $(stat_of dead "$1") == 1 ]]
}

# xattr FILE NAME: prints the value of an extended attribute.
xattr() {
  if ((HAVE_PY)); then
    python3 -c 'import os,sys; sys.stdout.write(os.getxattr(sys.argv[1], sys.argv[2]).decode())' "$1" "$2"
  elif command -v getfattr >/dev/null; then
    getfattr --only-values -n "$2" "$1"
  else
    echo "no python3 or getfattr to read xattrs" >&2
    return 1
  fi
}

# ---------------------------------------------------------------------------- tests

# .next: two readers wait at once (holding no FUSE worker: ls, cat and rm go on meanwhile),
# two sends wake them, and each gets a different message, its id on the first line.
t_next_blocks_until_a_message_and_each_reader_gets_its_own() {
  new_queue "$D/q"
  local M=$D/mnt
  mount_fs "$D/q" "$M"
  "$SPOOL" send "$D/q" first >/dev/null
  wait_for 10 listed "$M" 1
  timeout 20 cat "$M/.next" >"$D/r0" || fail "the read of .next with a message ready failed"
  eq "ready message through .next" "$(tr '\n' ' ' <"$D/r0")" "1 first"
  timeout 20 cat "$M/.next" >"$D/r1" &
  local r1=$!
  timeout 20 cat "$M/.next" >"$D/r2" &
  local r2=$!
  sleep 0.5  # both readers wait now
  alive "$r1" && alive "$r2" || fail "a read of .next returned with nothing queued"
  timeout 5 ls "$M" >/dev/null || fail "ls hangs while readers wait on .next"
  timeout 5 cat "$M/.stats" >/dev/null || fail "cat .stats hangs while readers wait on .next"
  timeout 5 rm "$M/1" || fail "rm hangs while readers wait on .next"
  "$SPOOL" send "$D/q" a >/dev/null
  "$SPOOL" send "$D/q" b >/dev/null
  wait "$r1" || fail "reader 1: exit $?"
  wait "$r2" || fail "reader 2: exit $?"
  local id1 id2
  id1=$(head -n 1 "$D/r1")
  id2=$(head -n 1 "$D/r2")
  [[ $id1 =~ ^[0-9]+$ && $id2 =~ ^[0-9]+$ && $id1 != "$id2" ]] || fail "ids '$id1' and '$id2'"
  eq "payloads" "$( (tail -n +2 "$D/r1"; echo; tail -n +2 "$D/r2"; echo) | sort | tr '\n' ' ')" "a b "
  eq "in flight" "$(stat_of in_flight "$D/q")" 2
  rm "$M/$id1" "$M/$id2" || fail "rm of the messages read through .next"
  eq "acked" "$(stat_of acked_total "$D/q")" 3
}

# Issue 43: a walk of the tree never blocks. grep -r on an empty queue used to open .next
# and wait forever; .next is not listed (it opens by name), and the walk ends.
t_grep_r_on_an_empty_queue_returns() {
  new_queue "$D/q"
  local M=$D/mnt rc=0
  mount_fs "$D/q" "$M"
  timeout 10 grep -r x "$M" >/dev/null 2>&1 || rc=$?
  ((rc != 124)) || fail "grep -r on an empty queue hung (killed by timeout after 10 s)"
  timeout 10 find "$M" -type f -exec cat {} + >/dev/null 2>&1
  (($? != 124)) || fail "find -exec cat on an empty queue hung"
  ls -a "$M" | grep -qx '.next' && fail ".next is listed by ls -a"
  [[ -e $M/.next ]] || fail ".next does not open by name"
  "$SPOOL" send "$D/q" found >/dev/null
  timeout 10 cat "$M/.next" | grep -qx found || fail ".next by name did not deliver"
}

# An interrupted read of .next takes nothing: the message sent after it goes to the next
# reader, and no lease is left behind.
t_next_interrupted_read_takes_nothing() {
  new_queue "$D/q"
  local M=$D/mnt
  mount_fs "$D/q" "$M"
  # In the background: a read whose interrupt is ignored hangs uninterruptibly (the kernel
  # waits for spoolfs's answer), and must fail the test rather than stop it.
  timeout -s INT 1 cat "$M/.next" >"$D/r" 2>/dev/null &
  local reader=$! rc=0
  interrupted() { ! alive "$reader"; }
  wait_for 5 interrupted
  wait "$reader" || rc=$?
  eq "exit of the interrupted read (timeout's 124)" "$rc" 124
  [[ -s $D/r ]] && fail "the interrupted read returned data: $(cat "$D/r")"
  "$SPOOL" send "$D/q" later >/dev/null
  sleep 0.3
  eq "in flight after the interrupted read and a send" "$(stat_of in_flight "$D/q")" 0
  timeout 10 cat "$M/.next" >"$D/r" || fail "the next read failed"
  eq "next read" "$(tr '\n' ' ' <"$D/r")" "1 later"
}

# .stats under tail -f shows new figures as the queue changes, and held counts only leases
# that have not run out.
t_stats_follows_under_tail_and_held_counts_live_leases() {
  new_queue "$D/q"
  local M=$D/mnt
  mount_fs "$D/q" "$M" -o visibility=1s
  timeout 4 tail -f "$M/.stats" >"$D/tail" 2>&1 &
  local t=$!
  sleep 1.2
  "$SPOOL" send "$D/q" x >/dev/null
  wait_for 10 listed "$M" 1
  cat "$M/1" >/dev/null || fail "cat of the message"
  grep -q "held 1" "$M/.stats" || fail ".stats while leased: $(cat "$M/.stats")"
  sleep 1.3  # the 1 s lease has run out
  grep -q "held 0" "$M/.stats" || fail ".stats counts an expired lease as held: $(cat "$M/.stats")"
  wait "$t"
  grep -q "^sent total *0$" "$D/tail" || fail "tail -f: no first snapshot: $(cat "$D/tail")"
  grep -q "^sent total *1$" "$D/tail" || fail "tail -f showed no new figures: $(cat "$D/tail")"
}

t_not_a_queue_is_refused() {
  mkdir -p "$D/notq" "$D/mnt"
  echo x >"$D/notq/file"
  "$SPOOLFS" "$D/notq" "$D/mnt" -f >"$D/out" 2>"$D/err" && fail "mounted a directory that is not a queue"
  grep -q "not a spool queue" "$D/err" || fail "unclear message: $(cat "$D/err")"
  grep -q "spool init NEW_DIR" "$D/err" || fail "message does not say how to create one: $(cat "$D/err")"
  # spool init refuses a directory holding other files: spoolfs must not suggest it there.
  grep -qF "spool init $D/notq" "$D/err" && fail "suggests an init that fails: $(cat "$D/err")"
  mountpoint -q "$D/mnt" && fail "left a mount behind"
  "$SPOOLFS" "$D/missing" "$D/mnt" -f 2>"$D/err" && fail "mounted a missing directory"
  grep -qF "no such queue directory; create the queue with 'spool init $D/missing'" "$D/err" ||
    fail "unclear message for a missing queue: $(cat "$D/err")"
  mkdir -p "$D/empty"
  "$SPOOLFS" "$D/empty" "$D/mnt" -f 2>"$D/err" && fail "mounted (and so created?) a queue in an empty directory"
  grep -qF "spool init $D/empty" "$D/err" || fail "no init suggested for an empty directory: $(cat "$D/err")"
  # (Queue::open with create=false leaves its lock file "gate" behind here: a library matter.)
  [[ -e $D/empty/spool.conf ]] && fail "spoolfs created a queue in an empty directory"
  "$SPOOLFS" "$D/empty" "$D/mnt" -o visibility=soon 2>"$D/err" && fail "accepted visibility=soon"
  grep -q "visibility" "$D/err" || fail "unclear message for a bad visibility: $(cat "$D/err")"
  return 0
}

t_shell_round_trip() {
  new_queue "$D/q"
  local M=$D/mnt
  mount_fs "$D/q" "$M"
  echo "hello from echo" >"$M/job" || fail "echo > MNT/job failed"
  # RELEASE (which sends) is asynchronous to close(): the echo's message must be 1.
  wait_for 10 count_is "$M" 1
  printf 'copied\n' >"$D/src.txt"
  cp "$D/src.txt" "$M/" || fail "cp failed"
  # RELEASE (which sends) is asynchronous to close(): wait for both messages.
  wait_for 10 count_is "$M" 2
  ls -l "$M" >"$D/ls" || fail "ls -l failed"
  grep -qE '^-rw------- .* 16 .* 1$' "$D/ls" || fail "ls -l does not show message 1 with 16 bytes: $(cat "$D/ls")"
  eq "cat 1" "$(cat "$M/1")" "hello from echo"
  eq "cat 2" "$(cat "$M/2")" "copied"
  not_listed "$M" 1 || fail "a received message is still listed"
  eq "receive_count of 1" "$(xattr "$M/1" user.spool.receive_count)" 1
  [[ $(xattr "$M/1" user.spool.enqueued_at) =~ ^20[0-9][0-9]-[0-9][0-9]-[0-9][0-9]T.*Z$ ]] ||
    fail "enqueued_at: $(xattr "$M/1" user.spool.enqueued_at)"
  eq "in flight" "$(stat_of in_flight "$D/q")" 2
  rm "$M/1" "$M/2" || fail "rm failed"
  [[ -e $M/1 ]] && fail "MNT/1 exists after rm"
  eq "ready" "$(stat_of ready "$D/q")" 0
  eq "in flight" "$(stat_of in_flight "$D/q")" 0
  eq "acked" "$(stat_of acked_total "$D/q")" 2
  grep -q '^acked total *2$' "$M/.stats" || fail ".stats: $(cat "$M/.stats")"
  grep -q '"acked_total":2' "$M/.stats.json" || fail ".stats.json: $(cat "$M/.stats.json")"
  if ((HAVE_PY)); then
    python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$M/.stats.json" || fail ".stats.json is not JSON"
  fi
  # A created and closed empty file is an empty message.
  : >"$M/empty" || fail "creating an empty file failed"
  wait_for 10 count_is "$M" 1
  eq "size of the empty message" "$(stat -c %s "$M/3")" 0
  eq "cat empty" "$(cat "$M/3" | wc -c)" 0
  rm "$M/3" || fail "rm of the empty message failed"
}

t_read_is_a_fixed_snapshot_and_offsets_work() {
  new_queue "$D/q"
  local M=$D/mnt
  mount_fs "$D/q" "$M"
  head -c 300000 /dev/urandom >"$D/payload"
  "$SPOOL" send "$D/q" <"$D/payload" >/dev/null || fail "spool send failed"
  wait_for 10 listed "$M" 1
  eq "listed size" "$(stat -c %s "$M/1")" 300000
  if ((HAVE_PY)); then
    # One open, reads at several offsets and a re-read: all agree with the payload.
    python3 - "$M/1" "$D/payload" <<'EOF' || fail "offset reads disagree"
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
want = open(sys.argv[2], 'rb').read()
assert os.pread(fd, 10, 150000) == want[150000:150010]
assert os.pread(fd, 100, 299950) == want[299950:]
assert os.pread(fd, 10, 300000) == b''
got = b''
while True:
    b = os.read(fd, 65536)
    if not b: break
    got += b
assert got == want, (len(got), len(want))
os.close(fd)
EOF
  else
    cmp "$M/1" "$D/payload" || fail "payload differs"
  fi
  # The same mount does not hand a message it holds to a second reader.
  cat "$M/1" >/dev/null 2>"$D/err" && fail "a second open of a held message succeeded"
  grep -q "busy" "$D/err" || fail "second open: $(cat "$D/err")"
  rm "$M/1" || fail "rm failed"
}

t_writes_to_messages_and_oversized_files_are_refused() {
  new_queue "$D/q" --max-payload 4096 --segment-size 1M
  local M=$D/mnt
  mount_fs "$D/q" "$M"
  "$SPOOL" send "$D/q" "original" >/dev/null
  wait_for 10 listed "$M" 1
  (echo overwrite >"$M/1") 2>"$D/err" && fail "writing to a message file succeeded"
  grep -qi "permission denied" "$D/err" || fail "overwrite: $(cat "$D/err")"
  (echo more >>"$M/1") 2>/dev/null && fail "appending to a message file succeeded"
  eq "in flight after refused writes" "$(stat_of in_flight "$D/q")" 0
  head -c 5000 /dev/zero >"$D/big"
  cp "$D/big" "$M/big" 2>"$D/err" && fail "an oversized file was accepted"
  grep -qi "file too large" "$D/err" || fail "oversized: $(cat "$D/err")"
  head -c 4096 /dev/zero >"$D/max"
  cp "$D/max" "$M/max" || fail "a file of exactly max_payload was refused"
  wait_for 10 listed "$M" 2
  # A partial send would happen at the refused file's RELEASE, which the kernel sends after
  # cp has returned: wait until it was handled (RELEASE forgets the pending name, then would
  # send, in the same request; names are looked up afresh, entry_timeout 0) rather than
  # sleep and hope.
  wait_for 10 test ! -e "$M/big"
  eq "messages (the oversized one must not be sent in part)" "$(stat_of sent_total "$D/q")" 2
  eq "size" "$(stat -c %s "$M/2")" 4096
  eq "cat original" "$(cat "$M/1")" original
  # Names of messages are reserved; dot files are refused.
  fails_with "not supported" write_to "$M/12345"
  (echo x >"$M/.hidden") 2>/dev/null && fail "created a dot file"
  return 0
}

t_rename_link_mknod_chmod_are_refused() {
  new_queue "$D/q"
  local M=$D/mnt
  mount_fs "$D/q" "$M"
  "$SPOOL" send "$D/q" "stay" >/dev/null
  wait_for 10 listed "$M" 1
  mv "$M/1" "$M/renamed" 2>"$D/err" && fail "mv within the mount succeeded"
  grep -qi "not permitted" "$D/err" || fail "mv: $(cat "$D/err")"
  ln "$M/1" "$M/hard" 2>/dev/null && fail "ln succeeded"
  ln -s /etc/passwd "$M/sym" 2>/dev/null && fail "ln -s succeeded"
  mknod "$M/fifo" p 2>/dev/null && fail "mknod succeeded"
  mkdir "$M/dir" 2>/dev/null && fail "mkdir succeeded"
  chmod 777 "$M/1" 2>/dev/null && fail "chmod succeeded"
  rm "$M/.stats" 2>/dev/null && fail "rm .stats succeeded"
  eq "acked" "$(stat_of acked_total "$D/q")" 0
  eq "in flight" "$(stat_of in_flight "$D/q")" 0
  mountpoint -q "$M" || fail "the mount is gone"
  alive "$PID" || fail "spoolfs died"
  # mv to another filesystem is copy (a receive) then unlink (an ack): it takes the message.
  mv "$M/1" "$D/outside" || fail "mv out of the mount failed"
  eq "moved out" "$(cat "$D/outside")" stay
  eq "acked after mv out" "$(stat_of acked_total "$D/q")" 1
}

t_rm_of_a_message_not_received_here_is_refused() {
  new_queue "$D/q"
  local M=$D/mnt
  mount_fs "$D/q" "$M"
  "$SPOOL" send "$D/q" "x" >/dev/null
  wait_for 10 listed "$M" 1
  rm "$M/1" 2>"$D/err" && fail "rm acked a message this mount had not received"
  grep -qi "not permitted" "$D/err" || fail "rm: $(cat "$D/err")"
  # (touch of such a message once deadlocked spoolfs: hence the timeout.)
  fails_with "permission denied" timeout -s KILL 10 touch "$M/1"
  rm "$M/999" 2>/dev/null && fail "rm of a missing message succeeded"
  eq "ready" "$(stat_of ready "$D/q")" 1
}

t_cli_and_mount_interoperate() {
  new_queue "$D/q"
  local M=$D/mnt
  mount_fs "$D/q" "$M"
  "$SPOOL" send "$D/q" "from the cli" >/dev/null || fail "spool send failed"
  wait_for 10 listed "$M" 1
  eq "size" "$(stat -c %s "$M/1")" 12
  echo "from the mount" >"$M/m"
  wait_for 10 listed "$M" 2
  # The CLI receives what the mount sent (message 2) after the first one.
  "$SPOOL" recv -n 2 --json "$D/q" >"$D/recv" || fail "spool recv failed"
  grep -q '"payload":"from the mount\\n"' "$D/recv" || fail "recv: $(cat "$D/recv")"
  # Leased by the CLI: hidden from ls, and opening it fails rather than stealing it.
  wait_for 10 not_listed "$M" 1
  cat "$M/1" 2>/dev/null && fail "read a message leased by another process"
  local receipt
  receipt=$(sed -n 's/.*"receipt":"\([^"]*\)".*/\1/p' "$D/recv" | head -n 1)
  "$SPOOL" nack "$D/q" "$receipt" >/dev/null || fail "nack failed"
  wait_for 10 listed "$M" 1
  eq "cat after nack" "$(cat "$M/1")" "from the cli"
  eq "receive_count" "$(xattr "$M/1" user.spool.receive_count)" 2
  rm "$M/1" || fail "rm failed"
}

# Issue 26: a message's attributes are xattrs user.spool.attr.KEY of its file once this
# mount has received it (read it), listed by listxattr; a message without is unchanged.
t_attributes_are_xattrs() {
  ((HAVE_PY)) || fail "python3 is needed to list xattrs"
  new_queue "$D/q"
  local M=$D/mnt
  mount_fs "$D/q" "$M"
  "$SPOOL" send "$D/q" -a color=red -a trace.id=t-1 "with" >/dev/null || fail "spool send failed"
  "$SPOOL" send "$D/q" "plain" >/dev/null || fail "spool send failed"
  wait_for 10 listed "$M" 2
  eq "cat 1" "$(cat "$M/1")" "with"
  eq "color" "$(xattr "$M/1" user.spool.attr.color)" red
  eq "trace.id" "$(xattr "$M/1" user.spool.attr.trace.id)" t-1
  local names
  names=$(python3 -c 'import os,sys; print(" ".join(sorted(os.listxattr(sys.argv[1]))))' "$M/1")
  [[ " $names " == *" user.spool.attr.color "* && " $names " == *" user.spool.attr.trace.id "* ]] ||
    fail "listxattr: $names"
  fails_with "No data" xattr "$M/1" user.spool.attr.nope
  eq "cat 2" "$(cat "$M/2")" "plain"
  names=$(python3 -c 'import os,sys; print(" ".join(sorted(os.listxattr(sys.argv[1]))))' "$M/2")
  [[ $names != *attr* ]] || fail "a message without attributes lists some: $names"
  rm "$M/1" "$M/2" || fail "rm failed"
}

# Issue 26: a message's ordered group is the read-only xattr user.spool.group of its file
# once this mount has received it, read with getfattr as any xattr; a message without a
# group has none. The group's next message shows up only after rm of the one before.
t_group_is_an_xattr() {
  command -v getfattr >/dev/null && command -v setfattr >/dev/null ||
    fail "getfattr and setfattr (package attr) are needed"
  new_queue "$D/q"
  local M=$D/mnt
  mount_fs "$D/q" "$M"
  "$SPOOL" send "$D/q" --group order-17 "g1" >/dev/null || fail "spool send failed"
  "$SPOOL" send "$D/q" --group order-17 "g2" >/dev/null || fail "spool send failed"
  "$SPOOL" send "$D/q" "plain" >/dev/null || fail "spool send failed"
  wait_for 10 listed "$M" 3
  not_listed "$M" 2 || fail "2 is listed while blocked behind 1"
  eq "cat 1" "$(cat "$M/1")" "g1"
  eq "group of 1" "$(getfattr --absolute-names --only-values -n user.spool.group "$M/1")" "order-17"
  getfattr --absolute-names -d -m '^user\.spool\.' "$M/1" >"$D/dump" || fail "getfattr -d failed"
  grep -qx 'user.spool.group="order-17"' "$D/dump" || fail "getfattr -d: $(cat "$D/dump")"
  fails_with "not supported" setfattr -n user.spool.group -v other "$M/1"
  eq "group after setfattr" "$(getfattr --absolute-names --only-values -n user.spool.group "$M/1")" "order-17"
  eq "cat 3" "$(cat "$M/3")" "plain"
  fails_with "No such attribute" getfattr --absolute-names --only-values -n user.spool.group "$M/3"
  getfattr --absolute-names -d -m '^user\.spool\.' "$M/3" >"$D/dump" || fail "getfattr -d failed"
  ! grep -q "^user.spool.group" "$D/dump" || fail "a message without a group dumps one: $(cat "$D/dump")"
  rm "$M/1" "$M/3" || fail "rm failed"
  wait_for 10 listed "$M" 2
  eq "cat 2" "$(cat "$M/2")" "g2"
  eq "group of 2" "$(getfattr --absolute-names --only-values -n user.spool.group "$M/2")" "order-17"
  rm "$M/2" || fail "rm failed"
}

t_touch_extends_the_lease() {
  new_queue "$D/q"
  local M=$D/mnt
  mount_fs "$D/q" "$M" -o visibility=4s
  "$SPOOL" send "$D/q" "long job" >/dev/null
  wait_for 10 listed "$M" 1
  cat "$M/1" >/dev/null || fail "cat failed"
  local i
  for i in 1 2 3 4 5; do
    sleep 1
    touch "$M/1" || fail "touch $i failed"
  done
  # 5 s after the receive, 4 s visibility: only the touches keep it leased.
  eq "in flight" "$(stat_of in_flight "$D/q")" 1
  not_listed "$M" 1 || fail "the message reappeared despite touch"
  rm "$M/1" || fail "rm after touch failed"
  eq "acked" "$(stat_of acked_total "$D/q")" 1
}

t_expired_lease_reappears_with_receive_count_2() {
  new_queue "$D/q"
  local M=$D/mnt
  mount_fs "$D/q" "$M" -o visibility=4s
  "$SPOOL" send "$D/q" "again" >/dev/null
  wait_for 10 listed "$M" 1
  eq "first read" "$(cat "$M/1")" again
  not_listed "$M" 1 || fail "listed while leased"
  eq "receive_count" "$(xattr "$M/1" user.spool.receive_count)" 1
  wait_for 15 listed "$M" 1
  eq "second read" "$(cat "$M/1")" again
  eq "receive_count" "$(xattr "$M/1" user.spool.receive_count)" 2
  rm "$M/1" || fail "rm failed"
  eq "ready" "$(stat_of ready "$D/q")" 0
}

# watcher_of PID: the fusermount3 watcher (auto_unmount) that spoolfs PID started, or "".
# cat, not awk over the files: awk gives up at the first file it cannot open, and a process
# that exits between the glob and the read (the machine is busy in CI) is such a file.
watcher_of() {
  local w="" i
  for ((i = 0; i < 30; i++)); do
    w=$(cat /proc/[0-9]*/stat 2>/dev/null | awk -v p="$1" '$4 == p && $2 == "(fusermount3)" { print $1 }')
    [[ -n $w ]] && break
    sleep 0.1
  done
  echo "$w"
}

t_kill_9_leaves_the_queue_intact_and_remounts() {
  new_queue "$D/q"
  local M=$D/mnt
  # A lease far longer than the test: message 1 can only come back because spoolfs binds
  # its leases to itself (docs/semantics.md, instant release on death).
  mount_fs "$D/q" "$M" -o visibility=10m
  "$SPOOL" send "$D/q" "one" >/dev/null
  "$SPOOL" send "$D/q" "two" >/dev/null
  echo "three" >"$M/t"
  wait_for 10 count_is "$M" 3
  cat "$M/1" >/dev/null || fail "cat failed"
  local W
  W=$(watcher_of "$PID")
  kill -KILL "$PID"
  wait "$PID" 2>/dev/null
  if ((AUTO_UNMOUNT)); then
    # auto_unmount: fusermount3 removes the mount of the dead daemon. (Not "mountpoint -q":
    # it also fails on a dead mount that is still there.) fusermount3's watcher has to be
    # scheduled to do it: on a loaded CI machine 10 s was once not enough, so give it 60 s
    # and say what was left if even that is not enough.
    local deadline=$((SECONDS + 60)) left_at=0
    until not_mounted "$M"; do
      if ((SECONDS >= deadline)); then
        fail "the mount of the killed spoolfs is still there after 60 s: " \
          "$(grep -F "${M// /\\040}" /proc/self/mounts); stat: $(stat "$M" 2>&1 | head -n 1);" \
          "watchers: $(pgrep -a fusermount3 | tr '\n' ';')"
      fi
      # Under load the watcher can exit without unmounting (its umount fails), leaving a
      # dead mount. That is fusermount3's doing, not spoolfs's: say so loudly and go on with
      # the dead mount, which the next spoolfs must then remove (as
      # t_a_dead_mount_is_removed_by_the_next_spoolfs checks on purpose).
      if [[ -n $W ]] && ! alive "$W"; then
        ((left_at == 0)) && left_at=$SECONDS
        if ((SECONDS - left_at >= 2)) && dead_mount "$M"; then
          echo "*** NOTE: fusermount3's watcher $W exited and left the dead mount of the killed spoolfs;" \
            "going on with the dead mount ***" >>"$D/notes"
          break
        fi
      fi
      sleep 0.1
    done
  else
    wait_for 10 dead_mount "$M"
  fi
  eq "sent" "$(stat_of sent_total "$D/q")" 3
  eq "acked" "$(stat_of acked_total "$D/q")" 0
  "$SPOOL" verify "$D/q" >"$D/verify" 2>&1 || fail "verify: $(cat "$D/verify")"
  mount_fs "$D/q" "$M"
  # The dead daemon's lease is released and message 1 comes back.
  wait_for 10 count_is "$M" 3
  eq "cat 1" "$(cat "$M/1")" one
  eq "receive_count" "$(xattr "$M/1" user.spool.receive_count)" 2
  eq "cat 3" "$(cat "$M/3")" three
  rm "$M/1" "$M/3" || fail "rm failed"
  eq "ready" "$(stat_of ready "$D/q")" 1
}

# The watcher killed with the daemon (systemd's final SIGKILL goes to the whole cgroup)
# leaves a dead mount; the next spoolfs on that mount point removes it and mounts. The space
# in the mount point's name checks that /proc/self/mountinfo's escapes are read.
t_a_dead_mount_is_removed_by_the_next_spoolfs() {
  new_queue "$D/q"
  local M="$D/mnt 2" W
  mount_fs "$D/q" "$M"
  "$SPOOL" send "$D/q" "one" >/dev/null
  wait_for 10 count_is "$M" 1
  W=$(watcher_of "$PID")
  [[ -n $W ]] || fail "no fusermount3 watcher under spoolfs $PID"
  kill -KILL "$W"
  wait_for 10 gone "$W"
  kill -KILL "$PID"
  wait "$PID" 2>/dev/null
  wait_for 10 dead_mount "$M"
  mount_fs "$D/q" "$M"
  grep -q "removed the dead mount a killed spoolfs left on $M" "$D/spoolfs.err" ||
    fail "no notice: $(cat "$D/spoolfs.err")"
  eq "mounts on $M" "$(MP=${M// /\\040} awk '$2 == ENVIRON["MP"]' /proc/self/mounts | wc -l)" 1
  eq "cat 1" "$(cat "$M/1")" one
  rm "$M/1" || fail "rm failed"
  eq "acked" "$(stat_of acked_total "$D/q")" 1
}

t_listing_is_bounded_by_limit() {
  new_queue "$D/q"
  local M=$D/mnt
  seq 1 30 | "$SPOOL" send "$D/q" --lines >/dev/null || fail "send failed"
  mount_fs "$D/q" "$M" --limit 10
  count_is "$M" 10 || fail "listed $(names "$M" | wc -l), want 10"
  eq "first ten" "$(names "$M" | sort -n | tr '\n' ' ')" "1 2 3 4 5 6 7 8 9 10 "
  cat "$M/1" >/dev/null && rm "$M/1"
  eq "next ten" "$(names "$M" | sort -n | tr '\n' ' ')" "2 3 4 5 6 7 8 9 10 11 "
}

# 3000 entries take several getdents calls (and many more READDIRs); acking in between must
# not skip or repeat entries (cookies are message ids, not positions).
t_readdir_over_a_changing_directory() {
  ((HAVE_PY)) || { echo "no python3: checked only with ls"; return 0; }
  new_queue "$D/q"
  local M=$D/mnt
  seq 1 3000 | "$SPOOL" send "$D/q" --lines >/dev/null || fail "send failed"
  mount_fs "$D/q" "$M" --limit 5000
  python3 - "$M" <<'EOF' || fail "readdir skipped or repeated entries"
import os, sys
m = sys.argv[1]
seen = []
with os.scandir(m) as it:
    for i, e in enumerate(it):
        seen.append(e.name)
        if i == 50:
            # Receive and ack 10 messages that have not been listed yet, and 10 that have.
            for n in list(range(2500, 2510)) + list(range(5, 15)):
                open(os.path.join(m, str(n)), 'rb').read()
                os.unlink(os.path.join(m, str(n)))
ids = [int(n) for n in seen if n.isdigit()]
assert len(ids) == len(set(ids)), "repeated"
want = [n for n in range(1, 3001) if not 2500 <= n < 2510]
missing = sorted(set(want) - set(ids) - set(range(5, 15)))
assert not missing, missing
assert not set(range(2500, 2510)) & set(ids), "listed acked messages"
EOF
}

t_four_shell_consumers_process_each_message_once() {
  new_queue "$D/q"
  local M=$D/mnt
  seq 1 200 | sed 's/^/m/' | "$SPOOL" send "$D/q" --lines >/dev/null || fail "send failed"
  mount_fs "$D/q" "$M"
  consumer() {
    local n=$1 f b any deadline=$((SECONDS + 120))
    while :; do
      ((SECONDS < deadline)) || { echo "consumer $n still finding messages after 120 s" >>"$D/c$n.err"; break; }
      any=0
      for f in "$M"/*; do
        [[ -e $f ]] || continue
        any=1
        b=${f##*/}
        if cat "$f" >"$D/c$n.tmp" 2>/dev/null; then
          echo "$b $(cat "$D/c$n.tmp")" >>"$D/c$n.log"
          rm "$f" 2>>"$D/c$n.err" || echo "rm $b failed" >>"$D/c$n.err"
        fi
      done
      ((any)) || break
    done
  }
  local pids=() i
  for i in 1 2 3 4; do
    consumer "$i" &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  cat "$D"/c*.err 2>/dev/null | grep . && fail "errors: $(cat "$D"/c*.err)"
  cat "$D"/c*.log >"$D/all"
  eq "messages processed" "$(wc -l <"$D/all")" 200
  eq "distinct ids" "$(cut -d' ' -f1 "$D/all" | sort -u | wc -l)" 200
  awk '$2 != "m" $1 { print; bad = 1 } END { exit bad }' "$D/all" || fail "payload mismatch"
  local c
  for i in 1 2 3 4; do
    c=$(wc -l <"$D/c$i.log" 2>/dev/null || echo 0)
    echo "consumer $i processed $c"
  done
  eq "acked" "$(stat_of acked_total "$D/q")" 200
  eq "ready" "$(stat_of ready "$D/q")" 0
  eq "in flight" "$(stat_of in_flight "$D/q")" 0
}

t_fsync_sends_at_once_and_rm_discards_an_unsent_file() {
  ((HAVE_PY)) || { echo "no python3: not checked"; return 0; }
  new_queue "$D/q"
  local M=$D/mnt
  mount_fs "$D/q" "$M"
  python3 - "$M" "$SPOOL" "$D/q" <<'EOF' || fail "see above"
import json, os, subprocess, sys, time
m, spool, q = sys.argv[1:]
def sent():
    return json.loads(subprocess.check_output([spool, 'stats', q, '--json']))['sent_total']
fd = os.open(os.path.join(m, 'a'), os.O_WRONLY | os.O_CREAT, 0o600)
os.write(fd, b'synced')
assert sent() == 0, 'sent before fsync or close'
os.fsync(fd)
assert sent() == 1, 'fsync did not send'
try:
    os.write(fd, b'more')
    raise SystemExit('a write after fsync was accepted')
except OSError:
    pass
os.close(fd)
fd = os.open(os.path.join(m, 'b'), os.O_WRONLY | os.O_CREAT, 0o600)
os.write(fd, b'discard me')
os.unlink(os.path.join(m, 'b'))
os.close(fd)
time.sleep(0.5)
assert sent() == 1, 'sent twice, or sent an unlinked file: %d' % sent()
EOF
  eq "payload" "$(cat "$M/1")" synced
}

# Issue 43: a message written to a full queue (--max-ready) is never lost in silence: the
# writer's write() or close() fails with EAGAIN, nothing is sent, and the daemon (mounted
# without -f, so its stderr is /dev/null) says why in its --log file.
sent_is() { [[ $(stat_of sent_total "$1") == "$2" ]]; }
t_a_full_queue_fails_the_writer_and_the_log_says_why() {
  new_queue "$D/q" --max-ready 3
  local M=$D/mnt
  mkdir -p "$M"
  MNTS+=("$M")
  "$SPOOLFS" "$D/q" "$M" --log "$D/daemon.log" 2>"$D/err" || fail "spoolfs failed: $(cat "$D/err")"
  echo 1 >"$M/m1" && echo 2 >"$M/m2" || fail "a send with room failed"
  wait_for 10 sent_is "$D/q" 2
  if ((HAVE_PY)); then
    # Opened and written while there was room; the queue fills before its close().
    python3 - "$M" <<'EOF' || fail "see above"
import errno, os, subprocess, sys
m = sys.argv[1]
fd = os.open(os.path.join(m, 'late'), os.O_WRONLY | os.O_CREAT, 0o600)
os.write(fd, b'written while there was room')
subprocess.check_call(['sh', '-c', 'echo 3 > "$1"', 'sh', os.path.join(m, 'm3')])
try:
    os.close(fd)
    raise SystemExit('close() of a file for a full queue succeeded')
except OSError as e:
    assert e.errno == errno.EAGAIN, e
EOF
  else
    echo 3 >"$M/m3" || fail "the third send failed"
  fi
  wait_for 10 sent_is "$D/q" 3
  if echo 4 >"$M/m4" 2>"$D/echo.err"; then fail "echo to a full queue exited 0"; fi
  grep -qi "temporarily unavailable" "$D/echo.err" || fail "echo said: $(cat "$D/echo.err")"
  printf five >"$D/five"
  if cp "$D/five" "$M/m5" 2>"$D/cp.err"; then fail "cp to a full queue exited 0"; fi
  grep -qi "temporarily unavailable" "$D/cp.err" || fail "cp said: $(cat "$D/cp.err")"
  sleep 0.3
  eq "sent" "$(stat_of sent_total "$D/q")" 3
  grep -qE '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{12} spoolfs\[[0-9]+\] error: m4 not sent to .*the queue is full' "$D/daemon.log" ||
    fail "the log does not name m4 (in the one log format): $(cat "$D/daemon.log")"
  # Room again: the next write goes through.
  "$SPOOL" recv "$D/q" >/dev/null || fail "spool recv failed"  # a leased message is not waiting
  echo 6 >"$M/m6" || fail "a send after room was made failed"
  wait_for 10 sent_is "$D/q" 4
}

t_daemon_mode_mounts_and_unmounts() {
  new_queue "$D/q"
  local M=$D/mnt
  mkdir -p "$M"
  MNTS+=("$M")
  "$SPOOLFS" "$D/q" "$M" 2>"$D/err" || fail "spoolfs (daemon mode) failed: $(cat "$D/err")"
  mountpoint -q "$M" || fail "not mounted when spoolfs returned"
  echo "bg" >"$M/x"
  wait_for 10 listed "$M" 1
  fusermount3 -u "$M" || fail "fusermount3 -u failed"
  eq "sent" "$(stat_of sent_total "$D/q")" 1
}

t_spool_mount_runs_spoolfs() {
  new_queue "$D/q"
  local M=$D/mnt
  mkdir -p "$M"
  MNTS+=("$M")
  "$SPOOL" mount "$D/q" "$M" -- --limit 5 2>"$D/err" || fail "spool mount failed: $(cat "$D/err")"
  mountpoint -q "$M" || fail "not mounted when spool mount returned"
  for i in 1 2 3 4 5 6 7; do echo "m$i" >"$M/new$i"; done
  wait_for 10 count_is "$M" 5  # the --limit after -- reached spoolfs
  "$SPOOL" umount "$M" || fail "spool umount failed"  # issue 43
  not_mounted "$M" || fail "still mounted after spool umount"
  "$SPOOL" mount "$D/nope" "$M" 2>"$D/err2" && fail "mounted a missing queue"
  grep -q "nope" "$D/err2" || fail "the error does not name the queue: $(cat "$D/err2")"
  # Issue 43: a non-empty mount point is refused, as the usage says (its files would hide).
  mkdir -p "$D/full" && echo keep >"$D/full/file"
  MNTS+=("$D/full")
  "$SPOOL" mount "$D/q" "$D/full" 2>"$D/err3" && fail "mounted over a non-empty directory"
  grep -q "is not empty" "$D/err3" || fail "the refusal says: $(cat "$D/err3")"
  # --root and --log are spool mount's own flags (listed in its --help).
  mkdir -p "$D/root" "$D/mnt-root"
  MNTS+=("$D/mnt-root")
  new_queue "$D/root/a"
  "$SPOOL" mount "$D/root" "$D/mnt-root" --root --log "$D/root.log" 2>"$D/err4" ||
    fail "spool mount --root failed: $(cat "$D/err4")"
  eq "queues under spool mount --root" "$(queues "$D/mnt-root")" "a "
  "$SPOOL" umount "$D/mnt-root" || fail "spool umount of the --root mount failed"
}

# Issue 46: --sub mounts one subscription: cat receives and rm acks there only; the queue's
# own reader still has the message.
t_sub_mounts_one_subscription() {
  new_queue "$D/q"
  "$SPOOL" sub add "$D/q" audit >/dev/null || fail "spool sub add failed"
  "$SPOOL" send "$D/q" "for everyone" >/dev/null || fail "spool send failed"
  local M=$D/mnt
  mount_fs "$D/q" "$M" --sub audit
  eq "listed in the subscription" "$(names "$M")" 1
  eq "cat" "$(cat "$M/1")" "for everyone"
  eq "leased in the subscription" "$(stat_of in_flight "$D/q" --sub audit)" 1
  eq "the queue's own view untouched" "$(stat_of ready "$D/q")" 1
  grep -q '^in flight *1$' "$M/.stats" || fail ".stats is not the subscription's: $(cat "$M/.stats")"
  rm "$M/1" || fail "rm failed"
  eq "nothing left in it" "$(stat_of ready "$D/q" --sub audit)/$(stat_of in_flight "$D/q" --sub audit)" 0/0
  "$SPOOL" list "$D/q" >"$D/list" || fail "spool list failed"
  eq "the queue's own reader lists message 1" "$(awk 'NR > 1 {print $1}' "$D/list")" 1
  eq "still ready in the queue's own view" "$(stat_of ready "$D/q")" 1
  # A file written is sent to the queue: every reader gets it.
  echo "from the mount" >"$M/job" || fail "echo > MNT/job failed"
  wait_for 10 count_is "$M" 1
  eq "both readers have it" "$(stat_of ready "$D/q")" 2
  # Refusals: an unknown subscription, --sub with --root, spool mount passing --sub on.
  mkdir -p "$D/mnt2"
  MNTS+=("$D/mnt2")
  "$SPOOLFS" "$D/q" "$D/mnt2" --sub nosuch 2>"$D/err" && fail "mounted an unknown subscription"
  grep -q "nosuch" "$D/err" || fail "the refusal does not name it: $(cat "$D/err")"
  "$SPOOLFS" --root "$D" "$D/mnt2" --sub audit 2>"$D/err"
  eq "--sub with --root" "$?" 64
  mkdir -p "$D/mnt3"
  MNTS+=("$D/mnt3")
  "$SPOOL" mount "$D/q" "$D/mnt3" --sub audit 2>"$D/err" || fail "spool mount --sub failed: $(cat "$D/err")"
  eq "spool mount --sub lists the subscription's" "$(names "$D/mnt3")" 2
  "$SPOOL" umount "$D/mnt3" || fail "spool umount failed"
}

# Issue 24: spoolfs (and spool mount, which runs it) on a mount point that already holds a
# spoolfs mount stacked a second daemon on top and exited 0.
t_a_second_mount_on_a_live_one_is_refused() {
  new_queue "$D/q"
  new_queue "$D/q2"
  local M=$D/mnt
  mount_fs "$D/q" "$M"
  echo first >"$M/new"
  wait_for 10 listed "$M" 1
  local how
  for how in spoolfs "spool mount"; do
    if [[ $how == spoolfs ]]; then
      timeout 10 "$SPOOLFS" "$D/q2" "$M" -f >"$D/out" 2>"$D/err"
    else
      timeout 10 "$SPOOL" mount "$D/q2" "$M" >"$D/out" 2>"$D/err"
    fi
    eq "exit code of $how on a live mount" "$?" 1
    grep -q "already holds a spoolfs mount (of $D/q)" "$D/err" || fail "$how: unclear message: $(cat "$D/err")"
    grep -q "fusermount3 -u" "$D/err" || fail "$how: does not say how to unmount: $(cat "$D/err")"
    eq "mounts on $M after $how" "$(MP=$M awk '$2 == ENVIRON["MP"]' /proc/self/mounts | wc -l)" 1
  done
  # The first mount is untouched and still serves.
  eq "cat through the first mount" "$(cat "$M/1")" first
  eq "queue of the first mount: in flight" "$(stat_of in_flight "$D/q")" 1
}

# --root: every queue of DIR is a subdirectory; mkdir makes one; queues made after the mount
# appear.
t_root_lists_queues_and_mkdir_creates_one() {
  local R=$D/root M=$D/mnt
  mkdir -p "$R"
  new_queue "$R/a"
  new_queue "$R/b"
  mkdir -p "$R/junk"
  echo x >"$R/file"
  mount_fs "$R" "$M" --root
  eq "queues" "$(queues "$M")" "a b "
  mkdir "$M/c" || fail "mkdir MNT/c failed"
  [[ -e $R/c/spool.conf ]] || fail "mkdir did not create the queue $R/c"
  eq "queues after mkdir" "$(queues "$M")" "a b c "
  "$SPOOL" send "$R/c" "made by mkdir" >/dev/null || fail "spool send to the new queue failed"
  wait_for 10 listed "$M/c" 1
  eq "spool recv" "$("$SPOOL" recv "$R/c" 2>/dev/null)" "made by mkdir"
  new_queue "$R/d"
  eq "queues after spool init" "$(queues "$M")" "a b c d "
  "$SPOOL" send "$R/d" "late" >/dev/null || fail "spool send failed"
  wait_for 10 listed "$M/d" 1
  eq "cat" "$(cat "$M/d/1")" late
  rm "$M/d/1" || fail "rm failed"
  eq "acked" "$(stat_of acked_total "$R/d")" 1
  # A queue removed and made again under the same name is the new queue in the mount; a
  # removed one is gone.
  rm -rf "$R/d"
  new_queue "$R/d"
  "$SPOOL" send "$R/d" "new d" >/dev/null || fail "spool send failed"
  wait_for 10 listed "$M/d" 1
  eq "cat the new d" "$(cat "$M/d/1")" "new d"
  rm -rf "$R/d"
  fails_with "no such file" ls "$M/d"
  # `spool mount` passes --root on to spoolfs.
  mkdir -p "$D/mnt2"
  MNTS+=("$D/mnt2")
  "$SPOOL" mount "$R" "$D/mnt2" -- --root 2>"$D/err" || fail "spool mount -- --root failed: $(cat "$D/err")"
  eq "queues via spool mount" "$(queues "$D/mnt2")" "a b c "
}

t_root_round_trip_inside_a_queue() {
  local R=$D/root M=$D/mnt
  mkdir -p "$R"
  new_queue "$R/a"
  new_queue "$R/b"
  mount_fs "$R" "$M" --root
  echo "to a" >"$M/a/job" || fail "echo > MNT/a/job failed"
  echo "to b" >"$M/b/job" || fail "echo > MNT/b/job failed"
  wait_for 10 count_is "$M/a" 1
  wait_for 10 count_is "$M/b" 1
  [[ $(stat -c %i "$M/a/1") != $(stat -c %i "$M/b/1") ]] || fail "message 1 of a and of b share an inode"
  eq "cat a/1" "$(cat "$M/a/1")" "to a"
  not_listed "$M/a" 1 || fail "a received message is still listed"
  listed "$M/b" 1 || fail "receiving a/1 took b/1"
  eq "receive_count" "$(xattr "$M/a/1" user.spool.receive_count)" 1
  touch "$M/a/1" || fail "touch failed"
  eq "in flight" "$(stat_of in_flight "$R/a")" 1
  grep -q '"in_flight":1' "$M/a/.stats.json" || fail ".stats.json: $(cat "$M/a/.stats.json")"
  grep -q "^queue *$R/a\$" "$M/a/.stats" || fail ".stats: $(cat "$M/a/.stats")"
  rm "$M/a/1" || fail "rm failed"
  eq "acked in a" "$(stat_of acked_total "$R/a")" 1
  eq "acked in b" "$(stat_of acked_total "$R/b")" 0
  eq "cat b/1" "$(cat "$M/b/1")" "to b"
  rm "$M/b/1" || fail "rm failed"
  eq "ready in b" "$(stat_of ready "$R/b")" 0
}

# Issue 48: a --root mount told queues apart by spool.conf's mtime, so each touch of it (any
# writer of that queue may) made a new slot that kept the old queue's descriptors: 400 touches
# under a limit of 1,024 descriptors and every queue of the mount answered EIO. Here, with 256
# descriptors, 400 touches each followed by a read of .stats: both queues still answer, and
# the daemon holds no more descriptors than before. A queue replaced under its name has its
# old queue closed.
t_root_touching_spool_conf_leaks_no_descriptors() {
  local R=$D/root M=$D/mnt i before after
  mkdir -p "$R"
  new_queue "$R/a"
  new_queue "$R/b"
  mount_fs "$R" "$M" --root
  prlimit --nofile=256 --pid "$PID" || fail "prlimit failed"
  cat "$M/a/.stats" "$M/b/.stats" >/dev/null || fail "cat .stats failed"
  before=$(ls "/proc/$PID/fd" | wc -l)
  for ((i = 1; i <= 400; i++)); do
    touch -d "@$((1000000 + i))" "$R/a/spool.conf"
    cat "$M/a/.stats" >/dev/null 2>"$D/err" || fail "touch $i: cat a/.stats: $(cat "$D/err")"
  done
  "$SPOOL" send "$R/a" "to a" >/dev/null && "$SPOOL" send "$R/b" "to b" >/dev/null ||
    fail "spool send failed"
  wait_for 10 listed "$M/a" 1
  wait_for 10 listed "$M/b" 1
  eq "cat a/1" "$(cat "$M/a/1")" "to a"
  eq "cat b/1" "$(cat "$M/b/1")" "to b"
  after=$(ls "/proc/$PID/fd" | wc -l)
  ((after <= before + 2)) || fail "descriptors: $before before 400 touches, $after after"
  # Replacing a queue under its name: the old one's descriptors are closed.
  for ((i = 1; i <= 5; i++)); do
    rm -rf "$R/b"
    new_queue "$R/b"
    cat "$M/b/.stats" >/dev/null 2>"$D/err" || fail "replacement $i: cat b/.stats: $(cat "$D/err")"
  done
  after=$(ls "/proc/$PID/fd" | wc -l)
  ((after <= before + 2)) || fail "descriptors: $before before 5 replacements, $after after"
}

t_root_refusals_and_bad_names() {
  local R=$D/root M=$D/mnt
  mkdir -p "$R"
  new_queue "$R/q"
  mkdir -p "$R/junk" "$M"
  "$SPOOLFS" --root "$R/q" "$M" -f 2>"$D/err" && fail "mounted a queue as a root of queues"
  grep -q "without --root" "$D/err" || fail "unclear message: $(cat "$D/err")"
  "$SPOOLFS" --root "$R/nope" "$M" -f 2>/dev/null && fail "mounted a missing root"
  mount_fs "$R" "$M" --root
  "$SPOOL" send "$R/q" "keep me" >/dev/null || fail "spool send failed"
  wait_for 10 listed "$M/q" 1
  fails_with "not permitted" rmdir "$M/q"
  fails_with "not permitted" rm -rf "$M/q"
  fails_with "not permitted" rmdir "$M/q/.dlq"
  eq "ready after rmdir and rm -rf" "$(stat_of ready "$R/q")" 1
  fails_with "file exists" mkdir "$M/q"
  fails_with "file exists" mkdir "$M/junk"
  [[ -e $R/junk/spool.conf ]] && fail "mkdir made a queue of an existing directory"
  fails_with "not permitted" mkdir "$M/.Trash-0"
  fails_with "not permitted" mkdir "$M/q/sub"
  fails_with "not permitted" write_to "$M/file"
  fails_with "not permitted" mv "$M/q" "$M/r"
  fails_with "no such file" cat "$M/nope"
  fails_with "no such file" ls "$M/junk"
  fails_with "no such file" ls "$M/file"
  eq "queues" "$(queues "$M")" "q "
  alive "$PID" || fail "spoolfs died"
}

t_dlq_lists_dead_letters_and_cat_then_rm_removes_one() {
  new_queue "$D/q" --max-receives 1 --visibility 1s
  local M=$D/mnt
  mount_fs "$D/q" "$M"
  # No dead letter yet: an empty directory, and looking does not create the dead-letter queue.
  eq ".dlq before" "$(ls -A "$M/.dlq" | wc -l)" 0
  fails_with "no such file" cat "$M/.dlq/1"
  [[ -e $D/q/dlq ]] && fail "looking at .dlq created the dead-letter queue"
  make_dead_letter "$D/q" poison
  wait_for 10 listed "$M/.dlq" 1
  not_listed "$M" 1 || fail "the dead letter is still listed in the queue"
  eq "size" "$(stat -c %s "$M/.dlq/1")" 6
  eq "cat" "$(cat "$M/.dlq/1")" poison
  not_listed "$M/.dlq" 1 || fail "a dead letter being read is still listed"
  eq "receive_count" "$(xattr "$M/.dlq/1" user.spool.receive_count)" 1
  rm "$M/.dlq/1" || fail "rm of a dead letter failed"
  eq "dead" "$(stat_of dead "$D/q")" 0
  eq "spool dlq list" "$("$SPOOL" dlq "$D/q" list)" ""
}

t_dlq_under_root_and_its_bad_names() {
  local R=$D/root M=$D/mnt
  mkdir -p "$R"
  new_queue "$R/q" --max-receives 1 --visibility 1s
  mount_fs "$R" "$M" --root
  eq ".dlq before" "$(ls -A "$M/q/.dlq" | wc -l)" 0
  make_dead_letter "$R/q" "dead in root"
  wait_for 10 listed "$M/q/.dlq" 1
  fails_with "no such file" cat "$M/q/.dlq/abc"
  fails_with "no such file" cat "$M/q/.dlq/999"
  fails_with "no such file" cat "$M/q/.dlq/01"
  fails_with "no such file" cat "$M/q/.dlq/.stats"
  fails_with "no such file" ls "$M/q/.dlq/.dlq"
  fails_with "not permitted" write_to "$M/q/.dlq/new"
  fails_with "not permitted" rm "$M/q/.dlq/1"
  fails_with "not permitted" mkdir "$M/q/.dlq/sub"
  fails_with "not permitted" mv "$M/q/.dlq/1" "$M/q/again"
  eq "dead" "$(stat_of dead "$R/q")" 1
  eq "cat" "$(cat "$M/q/.dlq/1")" "dead in root"
  rm "$M/q/.dlq/1" || fail "rm of a dead letter failed"
  eq "dead after rm" "$(stat_of dead "$R/q")" 0
}

# mount_info MNT: "OPTIONS SOURCE SUPER_OPTIONS" of MNT in /proc/self/mountinfo (the fields
# before and after the " - " separator; the kernel writes a backslash as \134).
mount_info() {
  awk -v mp="$1" '$5 == mp { for (i = 7; $i != "-"; i++) ; print $6, $(i + 2), $(i + 3) }' /proc/self/mountinfo
}

# Issue 23: the queue's path went into the FUSE option string as it was, so a directory named
# "q,allow_other" mounted with allow_other (any user could then open, so receive, its
# messages). "b\,allow_other" catches an escape of commas that forgets backslashes.
t_commas_in_the_queue_path_are_no_mount_options() {
  local name M i=0 info
  for name in 'q,allow_other' 'b\,allow_other,default_permissions'; do
    i=$((i + 1))
    M=$D/mnt$i
    new_queue "$D/$name"
    mount_fs "$D/$name" "$M"
    info=$(mount_info "$M")
    [[ -n $info ]] || fail "$M not in /proc/self/mountinfo"
    echo "# $name: $info"
    [[ $(cut -d' ' -f1,3 <<<"$info") == *allow_other* ]] && fail "mounted with allow_other: $info"
    eq "file system name" "$(cut -d' ' -f2 <<<"$info")" "spool:$D/${name//\\/\\134}"
    echo "to $name" >"$M/job" || fail "writing $M/job failed"
    wait_for 10 count_is "$M" 1
    eq "cat" "$(cat "$M/1")" "to $name"
    rm "$M/1" || fail "rm failed"
    eq "acked in $name" "$(stat_of acked_total "$D/$name")" 1
  done
  # A --root mount of a directory with such a name, and a queue in it.
  mkdir "$D/r,allow_other"
  new_queue "$D/r,allow_other/q,x"
  M=$D/mnt-root
  mount_fs "$D/r,allow_other" "$M" --root
  info=$(mount_info "$M")
  echo "# --root: $info"
  [[ $(cut -d' ' -f1,3 <<<"$info") == *allow_other* ]] && fail "--root mounted with allow_other: $info"
  eq "queues under --root" "$(queues "$M")" "q,x "
}

TESTS=(
  t_next_blocks_until_a_message_and_each_reader_gets_its_own
  t_next_interrupted_read_takes_nothing
  t_grep_r_on_an_empty_queue_returns
  t_stats_follows_under_tail_and_held_counts_live_leases
  t_spool_mount_runs_spoolfs
  t_sub_mounts_one_subscription
  t_a_second_mount_on_a_live_one_is_refused
  t_not_a_queue_is_refused
  t_shell_round_trip
  t_read_is_a_fixed_snapshot_and_offsets_work
  t_writes_to_messages_and_oversized_files_are_refused
  t_rename_link_mknod_chmod_are_refused
  t_rm_of_a_message_not_received_here_is_refused
  t_cli_and_mount_interoperate
  t_touch_extends_the_lease
  t_attributes_are_xattrs
  t_group_is_an_xattr
  t_expired_lease_reappears_with_receive_count_2
  t_kill_9_leaves_the_queue_intact_and_remounts
  t_a_dead_mount_is_removed_by_the_next_spoolfs
  t_listing_is_bounded_by_limit
  t_readdir_over_a_changing_directory
  t_four_shell_consumers_process_each_message_once
  t_fsync_sends_at_once_and_rm_discards_an_unsent_file
  t_daemon_mode_mounts_and_unmounts
  t_a_full_queue_fails_the_writer_and_the_log_says_why
  t_root_lists_queues_and_mkdir_creates_one
  t_root_round_trip_inside_a_queue
  t_root_touching_spool_conf_leaks_no_descriptors
  t_root_refusals_and_bad_names
  t_dlq_lists_dead_letters_and_cat_then_rm_removes_one
  t_dlq_under_root_and_its_bad_names
  t_commas_in_the_queue_path_are_no_mount_options
)

# FUSE_TEST_ONLY=REGEX runs only the tests whose names match (while working on one);
# TAP_ONLY (tap.sh) does the same.
TAP_ONLY=${TAP_ONLY:-${FUSE_TEST_ONLY:-}}

# A failed test's daemon stderr is shown after its log.
tap_after_fail() {
  [[ -s $D/spoolfs.err ]] && sed 's/^/# spoolfs: /' "$D/spoolfs.err"
}
# Notes a passing test left (e.g. an outside tool's misstep it worked around) are shown too.
tap_after_pass() {
  [[ -s $D/notes ]] && sed 's/^/# /' "$D/notes"
  return 0
}
run_tests teardown
