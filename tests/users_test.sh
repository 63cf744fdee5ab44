#!/usr/bin/env bash
# Queues and more than one user (docs/security.md, "Who may do what"): a
# queue a group shares stays usable by every member whoever rebuilds its index, rolls its
# segments or makes its dead-letter queue, whatever their umask; a user who may only read a
# queue cannot stop its writers by locking its files. The users are real: this test creates
# them (useradd) and runs the spool binary as them (setpriv).
#
#   bash tests/users_test.sh build/tools/spool
#
# Output is TAP. Needs root (to create users); without it, "1..0 # SKIP reason".
set -u
source "$(dirname "${BASH_SOURCE[0]}")/tap.sh"

tap_args PATH_TO_SPOOL_BINARY "$@"
skip_all() {
  echo "1..0 # SKIP MULTI-USER TESTS NOT RUN: $* -- sharing a queue between users is untested here"
  exit 0
}
[[ $(id -u) == 0 ]] || skip_all "not root (uid $(id -u)): users cannot be created"
for tool in useradd groupadd userdel groupdel setpriv flock /usr/bin/python3; do
  command -v $tool >/dev/null || skip_all "$tool is not installed"
done
export LC_ALL=C

ROOT=$(mktemp -d "${TMPDIR:-/tmp}/spool-users-test.XXXXXX")
chmod 0755 "$ROOT"
# The binary, where every user can run it (the build tree may be private).
mkdir "$ROOT/bin"
cp "$1" "$ROOT/bin/spool"
chmod 0755 "$ROOT/bin" "$ROOT/bin/spool"
SPOOL=$ROOT/bin/spool

# Two members of a group and one outsider, made for this run and removed after it.
G=spooltest-$$
A=spta-$$
B=sptb-$$
R=sptr-$$
cleanup() {
  for u in "$A" "$B" "$R"; do userdel "$u" 2>/dev/null; done
  groupdel "$G" 2>/dev/null
  rm -rf "$ROOT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
groupadd "$G" || skip_all "groupadd failed"
useradd -M -U -G "$G" -s /usr/sbin/nologin "$A" || skip_all "useradd failed"
useradd -M -U -G "$G" -s /usr/sbin/nologin "$B" || skip_all "useradd failed"
useradd -M -U -s /usr/sbin/nologin "$R" || skip_all "useradd failed"

# as USER CMD...: runs CMD as USER, with USER's groups, from the current directory.
as() {
  local u=$1
  shift
  setpriv --reuid="$u" --regid="$(id -g "$u")" --init-groups -- "$@"
}

# mode_group PATH: "MODE GROUP" of PATH, as stat prints them (e.g. "2770 spooltest-1").
mode_group() { stat -c '%a %G' "$1"; }

# Every file under DIR (not directories) has mode WANT and group GROUP.
all_files_are() {
  local dir=$1 want=$2 group=$3 f
  while IFS= read -r f; do
    eq "mode and group of ${f#"$D"/}" "$(mode_group "$f")" "$want $group"
  done < <(find "$dir" -type f)
}

# ---------------------------------------------------------------- tests

# A queue shared by a group: A creates it; B, with umask 077, fills several segments (rolls
# and spares), removes the index so that the next open rebuilds it, and makes the
# dead-letter queue; A then still receives, acks, sends and compacts. Every file either of
# them made is the queue's group and mode.
t_group_shared_queue_stays_usable_by_every_member() {
  chmod 1777 "$D"
  as "$A" "$SPOOL" init q --group "$G" --mode 0660 --segment-size 64K --max-receives 1 --visibility 200ms ||
    fail "init --group --mode"
  eq "the queue directory" "$(mode_group q)" "2770 $G"
  # A message whose 200 ms lease runs out; the next receive dead-letters it (max 1), and
  # that makes the dead-letter queue.
  as "$B" sh -c "umask 077; exec '$SPOOL' send q poison >/dev/null" || fail "B sends"
  as "$B" sh -c "umask 077; exec '$SPOOL' recv q >/dev/null 2>&1" || fail "B receives"
  sleep 0.4
  as "$B" sh -c "umask 077; exec '$SPOOL' recv q >/dev/null 2>&1"
  [[ -d q/dlq ]] || fail "no dead-letter queue was made"
  eq "the dead-letter queue's directory" "$(mode_group q/dlq)" "2770 $G"
  seq 1 2000 | sed 's/$/ 0123456789012345678901234567890123456789/' >lines
  as "$B" sh -c "umask 077; exec '$SPOOL' send q --lines <lines >/dev/null" || fail "B sends"
  local segs
  segs=$(find q/segments -name '*.seg' | wc -l)
  ((segs >= 2)) || fail "only $segs segment(s): the sends did not roll"
  as "$B" rm q/index || fail "B removes the index"
  as "$B" sh -c "umask 077; exec '$SPOOL' stats q >/dev/null" || fail "B's stats (rebuilds the index)"
  eq "owner of the rebuilt index" "$(stat -c %U q/index)" "$B"
  all_files_are q 660 "$G"
  # A, a member with the same rights, still uses everything B made.
  as "$A" "$SPOOL" recv q -n 100 --json >got || fail "A receives"
  eq "messages A received" "$(wc -l <got)" 100
  sed -n 's/.*"receipt":"\([^"]*\)".*/\1/p' got | as "$A" xargs "$SPOOL" ack q || fail "A acks"
  as "$A" "$SPOOL" send q "from A" >/dev/null || fail "A sends"
  as "$A" "$SPOOL" compact q >/dev/null || fail "A compacts"
  as "$A" "$SPOOL" stats q --json >st || fail "A's stats"
  grep -q '"dead_lettered_total":1' st || fail "the dead letter is not counted: $(cat st)"
  all_files_are q 660 "$G"
  # Someone outside the group cannot even look.
  ! as "$R" "$SPOOL" stats q >/dev/null 2>&1 || fail "an outsider read a 0660 queue's stats"
}

# A queue others may read (--mode 0644; a new queue is private by default, issue 43). The outsider R gets
# stats and peek, and cannot open any file writers lock: flock(1) on them fails, so R cannot
# stop A's sends and receives. R's lock on a segment (R may read payloads) stops nothing.
t_a_reader_cannot_block_writers() {
  chmod 1777 "$D"
  as "$A" sh -c "umask 022; exec '$SPOOL' init q --mode 0644" || fail "init"
  as "$A" "$SPOOL" send q one two three >/dev/null || fail "send"
  eq "the queue directory" "$(stat -c %a q)" 755
  as "$R" "$SPOOL" stats q --json >st || fail "the reader's stats"
  grep -q '"ready":3' st || fail "stats: $(cat st)"
  as "$R" "$SPOOL" peek q -n 3 --json >peeked || fail "the reader's peek"
  eq "peeked" "$(sed -n 's/.*"payload":"\([^"]*\)".*/\1/p' peeked | tr '\n' ' ')" "one two three "
  # spool work binds its leases (it makes owners); a compaction makes compact.lock.
  as "$A" timeout 20 "$SPOOL" work q --until-empty --grace 100ms -- sh -c 'cat >/dev/null' 2>/dev/null ||
    fail "spool work"
  as "$A" "$SPOOL" compact q >/dev/null || fail "compact"
  local f
  for f in gate lock index owners compact.lock; do
    [[ -e q/$f ]] || fail "q/$f does not exist"
    eq "mode of $f" "$(stat -c %a "q/$f")" 600
    ! as "$R" flock -n -x "q/$f" true 2>/dev/null || fail "the reader could lock q/$f"
  done
  local seg
  seg=$(find q/segments -name '*.seg' | head -n 1)
  as "$R" flock -x "$seg" sleep 30 &
  BGPIDS+=($!)
  sleep 0.2
  as "$A" timeout 10 "$SPOOL" send q four >/dev/null || fail "a send while the reader locks a segment"
  as "$A" timeout 10 "$SPOOL" recv q -n 4 >/dev/null || fail "a receive while the reader locks a segment"
}

# A queue made by an older spool left its lock files 0644: the first open by their owner
# takes the read bits of those who may not write away again.
t_lock_files_an_older_spool_left_readable_are_tightened() {
  chmod 1777 "$D"
  as "$A" sh -c "umask 022; exec '$SPOOL' init q --mode 0644" || fail "init"
  as "$A" "$SPOOL" send q x >/dev/null || fail "send"
  as "$A" timeout 20 "$SPOOL" work q --until-empty --grace 100ms -- sh -c 'cat >/dev/null' 2>/dev/null ||
    fail "spool work (makes owners)"
  chmod 0644 q/gate q/lock q/index q/owners || fail "chmod"
  as "$R" flock -n -x q/lock true || fail "the reader could not lock the 0644 file (the premise)"
  as "$A" "$SPOOL" stats q >/dev/null || fail "stats"
  for f in gate lock index owners; do
    eq "mode of $f" "$(stat -c %a "q/$f")" 600
    ! as "$R" flock -n -x "q/$f" true 2>/dev/null || fail "the reader could still lock q/$f"
  done
}

# Issue 48: after `chmod -R a+rX q` the lock files are 0644 until the owner's next open, and a
# reader who opens one meanwhile keeps its descriptor: `flock -x q/gate` by R stalled every
# send of A (a timeout). A writer now fails at once, naming R's process, for gate and lock
# alike; once R lets go, sends work again.
t_a_readers_lock_after_chmod_is_named_not_waited_for() {
  chmod 1777 "$D"
  as "$A" sh -c "umask 022; exec '$SPOOL' init q --mode 0644" || fail "init"
  as "$A" "$SPOOL" send q one >/dev/null || fail "send"
  chmod -R a+rX q || fail "chmod -R a+rX"
  local f pid rc
  for f in gate lock; do
    # R's holder, run without the function `as` so that $! is its pid (flock(1) would pass
    # its lock to a child).
    setpriv --reuid="$R" --regid="$(id -g "$R")" --init-groups -- /usr/bin/python3 -c 'import fcntl, sys, time; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); time.sleep(30)' "q/$f" &
    pid=$!
    BGPIDS+=("$pid")
    sleep 0.3
    as "$A" timeout 10 "$SPOOL" send q two >out 2>err
    rc=$?
    ((rc != 124)) || fail "A's send waited for R's lock on q/$f until the timeout"
    ((rc != 0)) || fail "A's send went through while R locked q/$f"
    grep -qF "q/$f is locked by pid " err || fail "the error does not name the holder: $(cat err)"
    grep -qF "user $R" err || fail "the error does not name user $R: $(cat err)"
    grep -qF "may not write the queue" err || fail "unclear error: $(cat err)"
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    chmod 0644 "q/$f"  # the next file R locks is readable again (A's open tightened it)
  done
  as "$A" timeout 10 "$SPOOL" send q three >/dev/null || fail "a send after R let go"
  # OFD read locks on every byte of owners (the 128 binding slots): a binding fails saying
  # that processes that are not spool's hold them (OFD locks name no pid), where it said
  # that 128 processes bind their leases.
  as "$A" timeout 20 "$SPOOL" work q --until-empty --grace 100ms -- sh -c 'cat >/dev/null' 2>/dev/null ||
    fail "spool work (makes owners)"
  chmod 0644 q/owners
  setpriv --reuid="$R" --regid="$(id -g "$R")" --init-groups -- /usr/bin/python3 -c '
import fcntl, struct, sys, time
f = open(sys.argv[1])
for k in range(128):
    fcntl.fcntl(f, fcntl.F_OFD_SETLK, struct.pack("hh4xqqi4x", fcntl.F_RDLCK, 0, k, 1, 0))
time.sleep(30)' q/owners &
  pid=$!
  BGPIDS+=("$pid")
  sleep 0.3
  as "$A" "$SPOOL" send q four >/dev/null || fail "send"
  # spool work goes on without the binding, and its warning says why.
  as "$A" timeout 10 "$SPOOL" work q --until-empty --grace 100ms -- sh -c 'cat >/dev/null' >out 2>err
  grep -qF "are locked by processes that are not spool's" err || fail "spool work's warning: $(cat err)"
}

# Issue 48: on a queue others may read, a reader who keeps segment files open keeps the disk
# of those compaction removes (a removed file keeps its blocks while it is open). spool stats
# names it: the segments, their bytes and the pids (root sees every process; a user, only
# their own).
t_stats_reports_disk_pinned_by_a_reader() {
  chmod 1777 "$D"
  as "$A" sh -c "umask 022; exec '$SPOOL' init q --mode 0644 --segment-size 64K" || fail "init"
  seq 1 3000 | sed 's/$/ 0123456789012345678901234567890123456789/' >lines
  as "$A" "$SPOOL" send q --lines <lines >/dev/null || fail "send"
  setpriv --reuid="$R" --regid="$(id -g "$R")" --init-groups -- /usr/bin/python3 -c '
import glob, sys, time
held = [open(f) for f in sorted(glob.glob(sys.argv[1] + "/*.seg"))]
time.sleep(30)' q/segments &
  local pid=$!
  BGPIDS+=("$pid")
  sleep 0.3
  as "$A" "$SPOOL" purge q --yes >/dev/null || fail "purge"
  as "$A" "$SPOOL" compact q >/dev/null || fail "compact"
  "$SPOOL" stats q --json >st || fail "root's stats"
  grep -q "\"pinned_by\":\[$pid\]" st || fail "pinned_by lacks the reader's pid $pid: $(cat st)"
  local bytes
  bytes=$(sed -n 's/.*"pinned_removed_bytes":\([0-9]*\).*/\1/p' st)
  ((bytes >= 65536)) || fail "pinned_removed_bytes $bytes: $(cat st)"
  "$SPOOL" stats q | grep -q "^removed, open .* held by pid $pid" || fail "human stats: $("$SPOOL" stats q)"
  kill "$pid"
  wait "$pid" 2>/dev/null
  "$SPOOL" stats q --json >st || fail "root's stats"
  grep -q '"pinned_removed_bytes":0' st || fail "still pinned after the reader ended: $(cat st)"
}

# Bad --mode and --group values are refused with what is wrong, and leave nothing behind.
t_bad_mode_or_group_is_refused_and_leaves_nothing() {
  chmod 1777 "$D"
  expect_err() {
    local want=$1 text=$2
    shift 2
    "$@" >out 2>err
    local rc=$?
    eq "exit code of $*" "$rc" "$want"
    grep -qF -- "$text" err || fail "stderr of $* lacks '$text': $(cat err)"
    [[ ! -e q ]] || fail "$* left q behind"
  }
  expect_err 64 "an octal file mode" "$SPOOL" init q --mode 0999
  expect_err 64 "an octal file mode" "$SPOOL" init q --mode rw-rw----
  expect_err 64 "0600 at least" "$SPOOL" init q --mode 0440
  expect_err 64 "no such group" "$SPOOL" init q --group "no-such-group-$$"
  # A user may only give a queue to a group they are in.
  expect_err 1 "Operation not permitted" as "$R" "$SPOOL" init q --group "$G" --mode 0660
}

# issue 48: links planted by a user who may write a queue, followed by root operating on it.
# R owns a queue anyone may write (--mode 0666) and points its dlq at an empty root-owned
# directory: root's `dlq list` and `dlq redrive` made that directory drwxrwsrwx with queue
# files in it. R points another queue's segments at A's private queue's segments: root's
# purge emptied A's queue. R plants `jobs` as a link to A's directory: root's `init jobs
# --group G --mode 0660` made A's directory root:G 2770. Each is refused now, naming the
# link, and every target keeps its mode, owner and content.
t_planted_links_are_not_followed_by_root() {
  chmod 1777 "$D"
  mkdir target
  chmod 0755 target
  local before
  before=$(stat -c '%a %U:%G' target)
  as "$R" "$SPOOL" init q --mode 0666 || fail "R's init"
  as "$R" ln -s "$D/target" q/dlq || fail "R plants the dlq link"
  "$SPOOL" dlq q list >out 2>err && fail "root's dlq list went through the link: $(cat out)"
  grep -qF "q/dlq is a symbolic link" err || fail "dlq list's error: $(cat err)"
  "$SPOOL" dlq q redrive >out 2>err && fail "root's redrive went through the link"
  grep -qF "q/dlq is a symbolic link" err || fail "redrive's error: $(cat err)"
  eq "the dlq link's target" "$(stat -c '%a %U:%G' target) $(ls -A target | wc -l)" "$before 0"

  as "$A" sh -c "umask 077; exec '$SPOOL' init private" || fail "A's init"
  as "$A" "$SPOOL" send private one two three >/dev/null || fail "A's sends"
  as "$R" "$SPOOL" init q2 || fail "R's second init"
  as "$R" rm -r q2/segments q2/index || fail "R removes q2's segments"
  as "$R" ln -s "$D/private/segments" q2/segments || fail "R plants the segments link"
  "$SPOOL" purge q2 --yes >out 2>err && fail "root's purge went through the link: $(cat out)"
  grep -qF "q2/segments is a symbolic link" err || fail "purge's error: $(cat err)"
  eq "messages in A's queue" "$(as "$A" "$SPOOL" stats private --json | sed -n 's/.*"ready":\([0-9]*\).*/\1/p')" 3

  as "$A" mkdir adir || fail "A's directory"
  chmod 0700 adir
  before=$(stat -c '%a %U:%G' adir)
  as "$R" ln -s "$D/adir" jobs || fail "R plants jobs"
  "$SPOOL" init jobs --group "$G" --mode 0660 >out 2>err && fail "root's init went through the link"
  grep -qF "jobs is a symbolic link" err || fail "init's error: $(cat err)"
  eq "A's directory" "$(stat -c '%a %U:%G' adir) $(ls -A adir | wc -l)" "$before 0"
}

TESTS=(
  t_group_shared_queue_stays_usable_by_every_member
  t_a_reader_cannot_block_writers
  t_lock_files_an_older_spool_left_readable_are_tightened
  t_a_readers_lock_after_chmod_is_named_not_waited_for
  t_stats_reports_disk_pinned_by_a_reader
  t_bad_mode_or_group_is_refused_and_leaves_nothing
  t_planted_links_are_not_followed_by_root
)
run_tests kill_bg
