#!/usr/bin/env bash
# End-to-end test of the `spool` command-line tool: drives the real binary as subprocesses
# and checks its output, exit codes and effects on the queue (docs/cli.md is the contract).
#
#   bash tests/cli_test.sh build/tools/spool
#
# Output is TAP: "1..N", then "ok N - name" or "not ok N - name" followed by the failed
# test's log as "# ..." lines. Exits 0 only if every test passes. Every test runs in its own
# subshell and directory under one mktemp -d directory, removed at exit; background
# processes a test starts are killed when the test ends, pass or fail.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/tap.sh"

tap_args PATH_TO_SPOOL_BINARY "$@"
SPOOL=$(abs "$1")
PROM_CHECK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/prom_check.py
FORGE_KEY=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/forge_attr_key.py
CLI_DOC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/docs/cli.md
tap_root cli

# ---------------------------------------------------------------- helpers (used in tests)

# The start of a log line of `spool work` (an ERE; the level and message follow): the one
# log format of the library and spool work (src/logging.h).
WORK_LOG='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} spool work\[[0-9]+\] '

# expect_full CODE CMD...: like expect, with stdout on /dev/full (every write fails ENOSPC).
expect_full() {
  local want=$1
  shift
  "$@" >/dev/full 2>"$D/err"
  RC=$?
  : >"$D/out"
  [[ $RC == "$want" ]] || fail "expected exit $want, got $RC with stdout on /dev/full from: $* ($(cat "$D/err"))"
}

out_lacks() { ! grep -qF -- "$1" "$D/out" || fail "stdout has '$1': $(head -c 2000 "$D/out")"; }
# one_line_err: errors are one line on stderr.
one_line_err() {
  local n
  n=$(wc -l <"$D/err")
  [[ $n == 1 ]] || fail "expected a one-line error, got $n lines: $(cat "$D/err")"
}

# jget FIELD [FILE]: a number or string field of a one-line JSON object (no nesting).
jget() {
  sed -n "s/.*\"$1\":\(\"[^\"]*\"\|[^,}]*\).*/\1/p" "${2:-$D/out}" | head -n 1 | sed 's/^"\(.*\)"$/\1/'
}

# lines FILE: its number of lines, without starting a process.
lines() {
  local -a a=()
  [[ -e $1 ]] && mapfile -t a <"$1"
  echo "${#a[@]}"
}

# receipt_of: the receipt a plain recv printed on stderr.
receipt_of() { sed -n 's/^receipt: //p' "$D/err" | head -n 1; }

# wait_exit PID WHAT: waits up to 10 s for a background process; fails unless it exits 0.
wait_exit() {
  local pid=$1 rc i
  for ((i = 0; i < 100; i++)); do
    alive "$pid" || break
    sleep 0.1
  done
  alive "$pid" && fail "$2: still running after 10 s"
  wait "$pid"
  rc=$?
  eq "exit code ($2)" "$rc" 0
}

# stop_work PID [SIGNAL]: signals a background `spool work` and waits for it to exit 0.
stop_work() {
  kill "-${2:-TERM}" "$1" || fail "kill -${2:-TERM} $1 failed"
  wait_exit "$1" "spool work after SIG${2:-TERM}"
}

# ---------------------------------------------------------------- tests

t_help_and_version() {
  expect 0 "$SPOOL" --help
  local c
  for c in init send recv ack nack extend peek purge delete dlq stats work; do
    out_has "$c"
  done
  out_has "Exit codes"
  for c in init send recv ack nack extend peek purge delete dlq stats replay mount compact verify work forward pull \
           pause resume release move top sub; do
    expect 0 "$SPOOL" "$c" --help
    out_has "Usage:"
    out_has "Example"  # issue 24: each command's own examples
  done
  # Issue 24: docs/cli.md lists every command spool --help shows, and has a section for it.
  local doc=$CLI_DOC
  if [[ -r $doc ]]; then
    expect 0 "$SPOOL" --help
    for c in $(sed -n '/^Subcommands:/,/^$/s/^  \([a-z]*\) .*/\1/p' "$D/out"); do
      grep -qE "^  $c +[A-Z]" "$doc" || fail "docs/cli.md's command list lacks $c"
      grep -qx "### spool $c" "$doc" || fail "docs/cli.md has no section for $c"
    done
    grep -q "Not yet implemented" "$doc" && fail "docs/cli.md still says something is not yet implemented"
  else
    echo "# NOTE: $doc not found: the docs' command list is not checked"
  fi
  expect 0 "$SPOOL" recv --help
  out_has "--wait"
  out_has "--json"
  expect 0 "$SPOOL" work --help
  out_has "SPOOL_RECEIPT"
  expect 0 "$SPOOL" --version
  out_has "spool"
}

t_usage_errors_exit_64() {
  expect 64 "$SPOOL"
  one_line_err
  expect 64 "$SPOOL" frobnicate q
  err_has "frobnicate"
  one_line_err
  "$SPOOL" init q >/dev/null || fail "init"
  expect 64 "$SPOOL" recv q --frob
  err_has "--frob"
  one_line_err
  expect 64 "$SPOOL" send
  err_has "DIR"
  expect 64 "$SPOOL" ack q
  expect 64 "$SPOOL" nack q
  expect 64 "$SPOOL" extend q 1.1.abc
  expect 64 "$SPOOL" recv q -n 0
  expect 64 "$SPOOL" recv q -n many
  expect 64 "$SPOOL" work q
  expect 64 "$SPOOL" work q -j 0 -- true
  expect 64 "$SPOOL" dlq q
  expect 64 "$SPOOL" dlq q frob
  expect 64 "$SPOOL" send q --lines extra-arg
  expect 64 "$SPOOL" stats q --rate 5
  expect 64 "$SPOOL" stats q --target 5s
  expect 64 "$SPOOL" stats q --rate abc --target 5s
}

# Issue 43: CLI11's own parse errors ("The following argument was not expected: x",
# "--wait: 1 required TEXT missing", "Could not convert: -n = many") read as spool's other
# errors do, naming the command: "spool CMD: what is wrong; what to do".
t_parser_errors_in_spools_words() {
  "$SPOOL" init q >/dev/null || fail "init"
  parse_err() {  # parse_err WANT ARGS...: exit 64 and exactly the line "spool CMD: WANT; run ..."
    local want=$1
    shift
    expect 64 "$SPOOL" "$@"
    one_line_err
    eq "error of spool $*" "$(cat "$D/err")" "spool $1: $want; run 'spool $1 --help' for its usage"
  }
  parse_err "unknown flag '--frob'" recv q --frob
  parse_err "unexpected argument 'extra'" recv q extra
  parse_err "unexpected arguments 'a' 'b'" recv q a b
  parse_err "missing DIR" send
  parse_err "missing --since DUR" replay q
  parse_err "missing ACTION" dlq q
  parse_err "--wait needs a value (a duration: 500ms, 30s, 5m, 2h or seconds)" recv q --wait
  parse_err "bad value 'many' for -n (a whole number)" list q -n many
  parse_err "bad value 'abc' for --rate (a whole number)" stats q --rate abc --target 5s
  parse_err "bad value 'frob' for ACTION (frob not in {list,redrive,purge})" dlq q frob
  parse_err "bad value '0' for -n (value 0 not in range 1 to 100000)" recv q -n 0
  # A bracketed argument keeps its brackets in the message (spool.cc marks it against CLI11's
  # "[a,b]" split, and the mark never shows).
  parse_err "unexpected argument '[1,2]'" recv q '[1,2]'
  eq "nothing sent by rejected commands" "$(stat_of sent_total q)" 0
}

t_bad_durations_exit_64() {
  "$SPOOL" init q >/dev/null || fail "init"
  expect 64 "$SPOOL" init q2 --visibility bogus
  err_has "bogus"
  err_has "--visibility"
  one_line_err
  [[ -e q2/spool.conf ]] && fail "a failed init created a queue"
  expect 64 "$SPOOL" init q2 --visibility 0
  expect 64 "$SPOOL" send q --delay 5x hi
  err_has "5x"
  expect 64 "$SPOOL" send q --delay=-1s hi
  expect 64 "$SPOOL" recv q --wait 1d
  expect 64 "$SPOOL" recv q --visibility 10y
  expect 64 "$SPOOL" nack q 1.1.abc --delay soon
  expect 64 "$SPOOL" extend q 1.1.abc 3weeks
  expect 64 "$SPOOL" extend q 1.1.abc 0
  expect 64 "$SPOOL" work q --visibility xx -- true
  expect 64 "$SPOOL" work q --max-runtime 1x -- true
  expect 64 "$SPOOL" stats q --rate 1 --target later
  eq "nothing sent by rejected commands" "$(stat_of sent_total q)" 0
  # Every accepted form.
  local d
  for d in 500ms 30s 5m 2h 1.5 45; do
    expect 0 "$SPOOL" init "ok-$d" --visibility "$d"
  done
}

t_bad_sizes_exit_64() {
  expect 64 "$SPOOL" init q --segment-size 12Q
  err_has "12Q"
  err_has "--segment-size"
  one_line_err
  expect 64 "$SPOOL" init q --max-payload 1T
  expect 64 "$SPOOL" init q --max-payload -5
  expect 64 "$SPOOL" init q --segment-size 1K  # parses, but below the 4 KiB minimum
  err_has "4 KiB"
  [[ -e q/spool.conf ]] && fail "a failed init created a queue"
  expect 0 "$SPOOL" init a --segment-size 64K --max-payload 4096
  expect 0 "$SPOOL" init b --segment-size 64M --max-payload 64K
  expect 0 "$SPOOL" init c --segment-size 1048576
  # 1G parses (rejected by the library for not fitting, not by the parser).
  expect 64 "$SPOOL" init d --segment-size 64K --max-payload 1G
  grep -q "bad size" "$D/err" && fail "1G was not parsed: $(cat "$D/err")"
  return 0
}

t_init() {
  expect 0 "$SPOOL" init q --visibility 5m --max-receives 3 --sync always --segment-size 1M --max-payload 64K
  [[ -f q/spool.conf ]] || fail "no spool.conf after init"
  expect 1 "$SPOOL" init q
  err_has "already a queue"
  one_line_err
  expect 0 "$SPOOL" init s1 --sync interval
  expect 0 "$SPOOL" init s2 --sync never
  expect 64 "$SPOOL" init s3 --sync sometimes
  expect 64 "$SPOOL" init s4 --max-receives -1
  expect 1 "$SPOOL" init no/such/parent
  err_has "no/such/parent"
  expect 0 "$SPOOL" init "$D/absolute/"
  local s
  for s in q s1 s2 "$D/absolute"; do
    expect 0 "$SPOOL" send "$s" hello
    expect 0 "$SPOOL" recv "$s"
    eq "payload via $s" "$(cat "$D/out")" hello
    expect 0 "$SPOOL" ack "$s" "$(receipt_of)"
  done
}

# Issue 24: a near-empty queue, with its dead-letter queue, takes under 2 MB of disk
# (segments start small); sending more rolls to segments that double in size.
t_near_empty_queue_is_small_and_segments_grow() {
  expect 0 "$SPOOL" init q --max-receives 1
  expect 0 "$SPOOL" send q x
  local kb
  kb=$(du -sk q | cut -f1)
  (( kb < 2048 )) || fail "init and one send take $kb KiB: $(du -ak q)"
  # A dead letter creates dlq/, a queue of its own: still under 2 MB together.
  expect 0 "$SPOOL" recv q
  expect 0 "$SPOOL" nack q "$(receipt_of)"
  expect 2 "$SPOOL" recv q
  eq "dead" "$(stat_of dead q)" 1
  [[ -d q/dlq/segments ]] || fail "no dead-letter queue: $(ls -R q)"
  kb=$(du -sk q | cut -f1)
  (( kb < 2048 )) || fail "a queue and its dead-letter queue take $kb KiB: $(du -ak q)"
  # About 3 MiB of records: past the first segments.
  local pad
  pad=$(printf '%0900d' 0)
  seq -f "%06g $pad" 3000 | "$SPOOL" send --lines q >/dev/null || fail "send --lines"
  local sizes
  sizes=$(stat -c %s q/segments/*.seg | tr '\n' ' ')
  local -a sz=($sizes)
  (( ${#sz[@]} >= 3 )) || fail "3 MiB of messages did not roll twice: segment sizes $sizes"
  (( sz[0] <= 262144 )) || fail "the first segment is not small: segment sizes $sizes"
  local i
  for ((i = 1; i < ${#sz[@]}; i++)); do
    (( sz[i] == 2 * sz[i - 1] )) || fail "segment $((i + 1)) is not twice the one before: sizes $sizes"
  done
  expect 0 "$SPOOL" verify q
  eq "ready" "$(stat_of ready q)" 3000
}

# Issue 43 (plurals): verify's summary said "1 segments, ... 1 messages".
# Issue 43 (plurals): counts say "1 message", not "1 messages", wherever spool prints one.
t_counts_in_words() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" init r >/dev/null || fail "init r"
  "$SPOOL" send q hello >/dev/null || fail "send"
  expect 0 "$SPOOL" recv q --visibility 1h
  expect 0 "$SPOOL" release q 1
  expect 0 "$SPOOL" peek q
  out_has "--- message 1 (received 1 time, enqueued "
  out_has ", 5 bytes)"
  expect 0 "$SPOOL" move q r
  err_has "moved 1 message to r"
}

t_verify_summary_in_words() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q one >/dev/null || fail "send"
  expect 0 "$SPOOL" verify q
  grep -qE '^q: 1 segment, [0-9]+ records, 1 message, ok$' "$D/out" || fail "verify said: $(cat "$D/out")"
}

t_not_a_queue_exit_1() {
  expect 1 "$SPOOL" send missing hello
  err_has "spool init"
  one_line_err
  mkdir empty
  expect 1 "$SPOOL" send empty hello
  err_has "spool init empty"
  mkdir other && echo x >other/file
  expect 1 "$SPOOL" send other hello
  err_has "spool init needs a new or empty directory"
  expect 1 "$SPOOL" init other
  err_has "other files"
  echo x >afile
  expect 1 "$SPOOL" send afile hello
  err_has "spool init needs a new or empty directory"
  expect 1 "$SPOOL" recv missing
  err_has "spool init"
  expect 1 "$SPOOL" peek missing
  expect 1 "$SPOOL" stats missing
  expect 1 "$SPOOL" purge missing --yes
  expect 1 "$SPOOL" ack missing 1.1.abc
  expect 1 "$SPOOL" nack missing 1.1.abc
  expect 1 "$SPOOL" extend missing 1.1.abc 5s
  expect 1 "$SPOOL" dlq missing list
  expect 1 "$SPOOL" work missing -- true
  err_has "spool init"
  [[ -e missing ]] && fail "a command on a missing queue created it"
  return 0
}

t_send_recv_ack_text() {
  "$SPOOL" init q >/dev/null || fail "init"
  expect 0 "$SPOOL" send q hello
  eq "id of first message" "$(cat "$D/out")" 1
  expect 0 "$SPOOL" send q two three
  eq "ids of two messages" "$(tr '\n' ' ' <"$D/out")" "2 3 "
  expect 0 "$SPOOL" recv q
  eq "plain payload" "$(cat "$D/out")" hello
  [[ $(wc -c <"$D/out") == 5 ]] || fail "plain recv added bytes: $(od -c "$D/out")"
  grep -qE '^receipt: 1\.1\.[0-9a-f]+$' "$D/err" || fail "no receipt line on stderr: $(cat "$D/err")"
  local r
  r=$(receipt_of)
  expect 0 "$SPOOL" ack q "$r"
  eq "acked_total" "$(stat_of acked_total q)" 1
  # -n 2 takes both remaining messages, one receipt line each.
  expect 0 "$SPOOL" recv q -n 5
  eq "payloads of recv -n" "$(cat "$D/out")" "twothree"
  eq "receipts of recv -n" "$(grep -c '^receipt: ' "$D/err")" 2
  # shellcheck disable=SC2046
  expect 0 "$SPOOL" ack q $(sed -n 's/^receipt: //p' "$D/err")
  eq "ready after acks" "$(stat_of ready q)" 0
  eq "acked after acks" "$(stat_of acked_total q)" 3
  expect 2 "$SPOOL" recv q
  [[ -s $D/out ]] && fail "recv on an empty queue wrote to stdout"
  return 0
}

# in_long_poll PID: the main thread of PID sleeps in a futex wait with a timeout: the long
# poll on the index's wake word (a mutex wait has no timeout). /proc/PID/task/PID/syscall is
# "NR ADDR OP VAL TIMEOUT ..." while in a system call.
in_long_poll() {
  local op timeout
  read -r _ _ op _ timeout _ <"/proc/$1/task/$1/syscall" 2>/dev/null || return 1
  [[ $(cat "/proc/$1/wchan" 2>/dev/null) == futex* && $op == 0x* && $timeout != 0x0 ]] && (((op & 127) == 0))
}
# parked PID: PID is in its long poll; fails the test if PID has exited.
parked() {
  alive "$1" || fail "recv --wait returned before anything was sent"
  in_long_poll "$1"
}

t_recv_wait_long_poll() {
  "$SPOOL" init q >/dev/null || fail "init"
  local t0 t1
  t0=$(date +%s%N)
  expect 2 "$SPOOL" recv q --wait 500ms
  t1=$(date +%s%N)
  (((t1 - t0) / 1000000 >= 450)) || fail "recv --wait 500ms returned after $(((t1 - t0) / 1000000)) ms"
  # A sleeping receiver is woken by a send from another process.
  bg "$SPOOL" recv q --wait 20s --json >"$D/polled" 2>"$D/polled.err"
  local pid=$BGPID
  # The sender starts now and waits for its payload on a pipe with the queue open, so that
  # neither its start (hundreds of ms under ASan on a loaded machine) nor the receiver's
  # exit is timed. It gets the payload once the receiver sleeps in its long poll (looked for
  # every 10 ms); a send before would not test the wake. A waiter nobody wakes looks again
  # after its 1 s wait slice, so the bound is under that; the time runs until the receiver
  # has printed the message.
  mkfifo "$D/wake.fifo"
  exec 7<>"$D/wake.fifo"
  bg "$SPOOL" send q <"$D/wake.fifo" 7>&-  # not a writer itself: it must see the end
  local sender=$BGPID
  POLL=0.01 wait_for 10 parked "$pid"
  t0=$(date +%s%N)
  printf wake >&7
  exec 7>&-
  POLL=0.005 wait_for 10 grep -q wake "$D/polled"
  t1=$(date +%s%N)
  wait "$sender" || fail "send"
  wait "$pid"
  eq "exit code of the long poll" "$?" 0
  (((t1 - t0) / 1000000 < 700)) || fail "long poll took $(((t1 - t0) / 1000000)) ms to wake (a woken waiter takes milliseconds)"
  eq "polled payload" "$(jget payload "$D/polled")" wake
}

# SPOOL_IO set but empty (as scripts pass a variable through) is the default backend, not pwrite.
t_empty_spool_io_is_the_default_backend() {
  "$SPOOL" init q >/dev/null || fail "init"
  SPOOL_LOG=info SPOOL_IO= "$SPOOL" send q x >/dev/null 2>"$D/err" || fail "send: $(cat "$D/err")"
  grep -q "I/O backend mmap" "$D/err" || fail "SPOOL_IO= did not pick the default: $(cat "$D/err")"
  SPOOL_LOG=info SPOOL_IO=pwrite "$SPOOL" send q y >/dev/null 2>"$D/err" || fail "send: $(cat "$D/err")"
  grep -q "I/O backend pwrite" "$D/err" || fail "SPOOL_IO=pwrite did not pick pwrite: $(cat "$D/err")"
}

t_binary_roundtrip_plain() {
  "$SPOOL" init q >/dev/null || fail "init"
  { printf '\377\000\n\r'; head -c 100000 /dev/urandom; printf '\000\n\n'; } >blob
  expect 0 "$SPOOL" send q <blob
  expect 0 "$SPOOL" recv q
  cmp blob "$D/out" || fail "payload differs after plain recv"
  expect 0 "$SPOOL" ack q "$(receipt_of)"
  # An empty stdin is one empty message.
  expect 0 "$SPOOL" send q </dev/null
  expect 0 "$SPOOL" recv q
  [[ -s $D/out ]] && fail "empty message came back non-empty"
  return 0
}

t_binary_roundtrip_json_base64() {
  "$SPOOL" init q >/dev/null || fail "init"
  { printf '\377\376'; head -c 50000 /dev/urandom; } >blob
  expect 0 "$SPOOL" send q <blob
  local id
  id=$(cat "$D/out")
  expect 0 "$SPOOL" recv q --json
  eq "lines of recv --json" "$(wc -l <"$D/out")" 1
  grep -q '"payload":' "$D/out" && fail "binary payload given as \"payload\""
  eq "id" "$(jget id)" "$id"
  eq "receive_count" "$(jget receive_count)" 1
  [[ $(jget receipt) == "$id".1.* ]] || fail "receipt: $(jget receipt)"
  [[ $(jget enqueued_at) =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z$ ]] || fail "enqueued_at: $(jget enqueued_at)"
  jget payload_base64 | base64 -d >got || fail "payload_base64 does not decode"
  cmp blob got || fail "payload differs after base64 round trip"
  # Valid UTF-8 comes back as "payload", unescaped.
  printf 'h\303\251llo \342\230\203' >utf8
  expect 0 "$SPOOL" send q <utf8
  expect 0 "$SPOOL" recv q --json
  grep -q '"payload_base64"' "$D/out" && fail "UTF-8 payload was base64-encoded"
  eq "utf-8 payload" "$(jget payload)" "$(cat utf8)"
  if command -v jq >/dev/null; then
    jq -e . "$D/out" >/dev/null || fail "recv --json is not valid JSON: $(cat "$D/out")"
  fi
  return 0
}

t_send_lines() {
  "$SPOOL" init q >/dev/null || fail "init"
  printf 'alpha\nbeta gamma\ndelta\n' >in
  expect 0 "$SPOOL" send q --lines <in
  eq "ids printed" "$(tr '\n' ' ' <"$D/out")" "1 2 3 "
  expect 0 "$SPOOL" peek q -n 10 --json
  eq "messages" "$(wc -l <"$D/out")" 3
  eq "second payload" "$(sed -n 2p "$D/out" | sed 's/.*"payload":"\([^"]*\)".*/\1/')" "beta gamma"
  # More lines than one batch: every line a message, consecutive ids.
  seq 1 2500 >many
  expect 0 "$SPOOL" send q --lines <many
  eq "ids for 2500 lines" "$(wc -l <"$D/out")" 2500
  eq "first id" "$(head -n 1 "$D/out")" 4
  eq "last id" "$(tail -n 1 "$D/out")" 2503
  eq "ready" "$(stat_of ready q)" 2503
  # A last line without a newline is a message too.
  printf 'x\ny' | "$SPOOL" send q --lines >"$D/out" || fail "send --lines"
  eq "ids for unterminated last line" "$(wc -l <"$D/out")" 2
}

t_io_errors_exit_1() {
  "$SPOOL" init q >/dev/null || fail "init"
  # A stdin that cannot be read is an error, not an empty message.
  mkdir adir
  expect 1 "$SPOOL" send q <adir
  err_has "stdin"
  one_line_err
  eq "sent after a failed read" "$(stat_of sent_total q)" 0
  [[ -w /dev/full ]] || return 0
  # A payload that cannot be written out is returned to the queue, with no receipt.
  "$SPOOL" send q precious >/dev/null || fail "send"
  expect_full 1 "$SPOOL" recv q
  grep -q '^receipt:' "$D/err" && fail "receipt printed for a payload that was not written"
  err_has "returned to the queue"
  one_line_err
  eq "ready after a failed write" "$(stat_of ready q)" 1
  expect_full 1 "$SPOOL" recv q --json
  err_has "returned to the queue"
  eq "ready after a failed --json write" "$(stat_of ready q)" 1
  expect_full 1 "$SPOOL" stats q --json
  err_has "No space left"
  expect_full 1 "$SPOOL" peek q
  expect_full 1 "$SPOOL" send q more  # sent, but its id could not be printed
  expect 0 "$SPOOL" recv q
  eq "payload after failed writes" "$(cat "$D/out")" precious
}

t_failed_open_leaves_directory_untouched() {
  # Library bug: Queue::open creates DIR/gate in any writable directory before it finds out
  # that DIR is not a queue, even with create = false (so `spool send /etc x`, run as root,
  # leaves /etc/gate behind).
  mkdir mine
  echo data >mine/file
  "$SPOOL" send mine hello >/dev/null 2>&1
  "$SPOOL" stats mine >/dev/null 2>&1
  eq "files in a directory that is not a queue" "$(ls mine | tr '\n' ' ')" "file "
}

# CLI11 took an argument written [a,b] for a list: a JSON array sent as MESSAGE became two
# messages (and [] none), `sh -c '[ -f x ]'` after work's -- lost its brackets.
t_bracketed_arguments_are_kept() {
  "$SPOOL" init q >/dev/null || fail "init"
  expect 0 "$SPOOL" send q '[1,2]' '[]' '[x]' '[y,z]'
  eq "ids" "$(tr '\n' ' ' <"$D/out")" "1 2 3 4 "
  "$SPOOL" peek q -n 10 --json >"$D/out" || fail "peek"
  eq "payloads" "$(sed -n 's/.*"payload":"\([^"]*\)".*/\1/p' "$D/out" | tr '\n' ' ')" "[1,2] [] [x] [y,z] "
  timeout 20 "$SPOOL" work q --max-messages 1 -- sh -c '[ "$(cat)" = "[1,2]" ]' 2>"$D/err"
  eq "exit code of work" "$?" 0
  eq "acked_total (the test in brackets passed)" "$(stat_of acked_total q)" 1
  expect 1 "$SPOOL" ack q '[1.1.00000000]'
  err_has "[1.1.00000000]"
}

t_too_large_exit_1() {
  "$SPOOL" init q --max-payload 1K >/dev/null || fail "init"
  head -c 2048 /dev/urandom >big
  expect 1 "$SPOOL" send q <big
  err_has "2048"
  err_has "1024"
  one_line_err
  eq "sent after a too-large send" "$(stat_of sent_total q)" 0
  head -c 1024 /dev/urandom >fits
  expect 0 "$SPOOL" send q <fits
  # A batch with one message too large sends none.
  { echo small; head -c 3000 /dev/zero | tr '\0' a; echo; } >batch.txt
  expect 1 "$SPOOL" send q --lines <batch.txt
  eq "sent after a rejected batch" "$(stat_of sent_total q)" 1
}

# ms_since T0: milliseconds since T0 (date +%s%N).
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# delayed_until T0 MS: checks, of the one message, sent (or nacked) at T0 with a delay of MS
# ms, that it is held: a receive gets nothing and stats count it delayed. Each check counts
# only if its command returned before the delay ended: under ASan on a busy machine a few
# CLI runs take that long, and then the message is rightly ready. A receive that got it must
# have returned after the delay; it then leaves its JSON in $D/early and sets EARLY=1 (the
# caller's receive would find nothing).
delayed_until() {
  local t0=$1 ms=$2 d r
  EARLY=0
  run "$SPOOL" recv q --json
  if [[ $RC == 0 ]]; then
    (($(ms_since "$t0") >= ms - 100)) || fail "received $(ms_since "$t0") ms after it was delayed $ms ms"
    cp "$D/out" "$D/early"
    EARLY=1
    return 0
  fi
  eq "exit code of a receive of the delayed message" "$RC" 2
  d=$(stat_of delayed q)
  r=$(stat_of ready q)
  if (($(ms_since "$t0") < ms - 100)); then
    eq "delayed" "$d" 1
    eq "ready" "$r" 0
  fi
}

t_send_delay() {
  "$SPOOL" init q >/dev/null || fail "init"
  local t0 t1
  t0=$(date +%s%N)
  expect 0 "$SPOOL" send q --delay 4s later
  delayed_until "$t0" 4000
  expect 0 "$SPOOL" peek q
  out_has "later"
  ((EARLY)) && cp "$D/early" "$D/out" || expect 0 "$SPOOL" recv q --json --wait 10s
  t1=$(date +%s%N)
  eq "payload" "$(jget payload)" later
  (((t1 - t0) / 1000000 >= 3900)) || fail "a message sent with --delay 4s arrived after $(((t1 - t0) / 1000000)) ms"
  # --wait sleeps until a delay passes.
  expect 0 "$SPOOL" send q --delay 500ms soon
  expect 0 "$SPOOL" recv q --wait 5s
  eq "payload" "$(cat "$D/out")" soon
}

t_lease_lost_exit_3() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q job >/dev/null || fail "send"
  expect 0 "$SPOOL" recv q --visibility 300ms
  local r1 r2
  r1=$(receipt_of)
  sleep 0.5
  expect 0 "$SPOOL" recv q --json
  eq "receive_count of the second delivery" "$(jget receive_count)" 2
  r2=$(jget receipt)
  expect 3 "$SPOOL" ack q "$r1"
  err_has "lease lost"
  one_line_err
  expect 3 "$SPOOL" nack q "$r1"
  expect 3 "$SPOOL" extend q "$r1" 10s
  eq "in_flight (stale receipts change nothing)" "$(stat_of in_flight q)" 1
  expect 0 "$SPOOL" ack q "$r2"
  eq "acked_total" "$(stat_of acked_total q)" 1
  # A late worker that is alone (nobody received the message since) may still ack.
  "$SPOOL" send q job2 >/dev/null || fail "send"
  expect 0 "$SPOOL" recv q --visibility 200ms
  r1=$(receipt_of)
  sleep 0.4
  expect 0 "$SPOOL" ack q "$r1"
}

t_bad_receipts_exit_1() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q a b >/dev/null || fail "send"
  expect 0 "$SPOOL" recv q
  local r tag
  r=$(receipt_of)
  tag=${r##*.}
  expect 1 "$SPOOL" ack q garbage
  err_has "garbage"
  one_line_err
  expect 1 "$SPOOL" nack q 1.x.y
  expect 1 "$SPOOL" extend q not-a-receipt 5s
  expect 1 "$SPOOL" ack q "999999.1.$tag"
  err_has "999999"
  expect 1 "$SPOOL" ack q "1.1.0badc0de"  # another queue's tag
  expect 0 "$SPOOL" ack q "$r"
  expect 1 "$SPOOL" ack q "$r"  # already acked
  err_has "not in the queue"
  # Several receipts at once; an error in one still acks the others.
  expect 0 "$SPOOL" send q c
  expect 0 "$SPOOL" recv q -n 2
  # shellcheck disable=SC2046
  expect 0 "$SPOOL" ack q $(sed -n 's/^receipt: //p' "$D/err")
  eq "ready" "$(stat_of ready q)" 0
  eq "acked" "$(stat_of acked_total q)" 3
}

t_nack_and_nack_delay() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q job >/dev/null || fail "send"
  expect 0 "$SPOOL" recv q
  expect 0 "$SPOOL" nack q "$(receipt_of)"
  expect 0 "$SPOOL" recv q --json
  eq "receive_count after nack" "$(jget receive_count)" 2
  local t0 t1
  t0=$(date +%s%N)
  expect 0 "$SPOOL" nack q "$(jget receipt)" --delay 2s
  delayed_until "$t0" 2000
  ((EARLY)) && cp "$D/early" "$D/out" || expect 0 "$SPOOL" recv q --json --wait 10s
  t1=$(date +%s%N)
  (((t1 - t0) / 1000000 >= 1900)) || fail "nacked with --delay 2s, back after $(((t1 - t0) / 1000000)) ms"
  eq "receive_count after nack --delay" "$(jget receive_count)" 3
  eq "payload" "$(jget payload)" job
}

t_extend_keeps_hidden() {
  "$SPOOL" init q --visibility 300ms >/dev/null || fail "init"
  "$SPOOL" send q job >/dev/null || fail "send"
  expect 0 "$SPOOL" recv q
  local r
  r=$(receipt_of)
  expect 0 "$SPOOL" extend q "$r" 5s
  sleep 0.6
  expect 2 "$SPOOL" recv q
  eq "in_flight" "$(stat_of in_flight q)" 1
  expect 0 "$SPOOL" ack q "$r"
  # Without extend the same wait makes it receivable again.
  "$SPOOL" send q job2 >/dev/null || fail "send"
  expect 0 "$SPOOL" recv q
  sleep 0.6
  expect 0 "$SPOOL" recv q
  eq "payload after lease expiry" "$(cat "$D/out")" job2
}

t_peek() {
  "$SPOOL" init q >/dev/null || fail "init"
  expect 0 "$SPOOL" peek q
  [[ -s $D/out ]] && fail "peek on an empty queue printed something"
  "$SPOOL" send q one two three >/dev/null || fail "send"
  expect 0 "$SPOOL" peek q
  out_has "one"
  grep -q two "$D/out" && fail "peek without -n showed more than one message"
  expect 0 "$SPOOL" peek q -n 10
  out_has "three"
  out_has "--- message 1"
  expect 0 "$SPOOL" peek q -n 10 --json
  eq "peeked messages" "$(wc -l <"$D/out")" 3
  grep -q '"receipt"' "$D/out" && fail "peek --json has receipts"
  eq "receive_count in peek" "$(jget receive_count)" 0
  "$SPOOL" peek q -n 10 >/dev/null
  eq "ready after peeks" "$(stat_of ready q)" 3
  eq "in_flight after peeks" "$(stat_of in_flight q)" 0
  expect 0 "$SPOOL" recv q --json
  eq "receive_count after peeks" "$(jget receive_count)" 1
  expect 0 "$SPOOL" peek q -n 10 --json
  eq "peek shows in-flight messages' counts" "$(grep '"id":1,' "$D/out" | sed 's/.*"receive_count":\([0-9]*\).*/\1/')" 1
}

t_purge() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q 1 2 3 4 5 >/dev/null || fail "send"
  expect 64 "$SPOOL" purge q
  err_has "--yes"
  one_line_err
  eq "ready after refused purge" "$(stat_of ready q)" 5
  expect 0 "$SPOOL" recv q
  expect 0 "$SPOOL" purge q --yes
  err_has "5"
  eq "ready after purge" "$(stat_of ready q)" 0
  eq "in_flight after purge" "$(stat_of in_flight q)" 0
  expect 2 "$SPOOL" recv q
  expect 0 "$SPOOL" send q after
  expect 0 "$SPOOL" recv q
  eq "message sent after purge" "$(cat "$D/out")" after
  # issue 43: --json, as dlq purge --json
  "$SPOOL" send q x y >/dev/null || fail "send"
  expect 0 "$SPOOL" purge q --yes --json
  eq "purge --json" "$(cat "$D/out")" '{"purged":3}'
  [[ ! -s $D/err ]] || fail "purge --json said on stderr: $(cat "$D/err")"
}

t_dlq_list_and_redrive() {
  "$SPOOL" init q --max-receives 1 >/dev/null || fail "init"
  # Message 1 is acked, so that poison (2) becomes dead letter 1.
  "$SPOOL" send q done >/dev/null || fail "send"
  expect 0 "$SPOOL" recv q
  expect 0 "$SPOOL" ack q "$(receipt_of)"
  "$SPOOL" send q poison >/dev/null || fail "send"
  expect 0 "$SPOOL" recv q
  expect 0 "$SPOOL" nack q "$(receipt_of)"
  expect 2 "$SPOOL" recv q
  eq "dead" "$(stat_of dead q)" 1
  eq "ready" "$(stat_of ready q)" 0
  expect 0 "$SPOOL" dlq q list
  out_has "poison"
  out_has "--- message 1 (dead letter of message 2, received 0 times"
  expect 0 "$SPOOL" dlq q list --json
  eq "dead letters listed" "$(wc -l <"$D/out")" 1
  eq "dead letter payload" "$(jget payload)" poison
  eq "dead letter's original id" "$(jget original_id)" 2
  expect 0 "$SPOOL" dlq q list -n 1
  out_has "poison"
  expect 0 "$SPOOL" dlq q redrive
  err_has "1"
  eq "dead after redrive" "$(stat_of dead q)" 0
  eq "ready after redrive" "$(stat_of ready q)" 1
  expect 0 "$SPOOL" dlq q list
  [[ -s $D/out ]] && fail "dlq list not empty after redrive: $(cat "$D/out")"
  expect 0 "$SPOOL" recv q --json
  eq "redriven payload" "$(jget payload)" poison
  eq "redriven receive_count" "$(jget receive_count)" 1
  expect 0 "$SPOOL" dlq q redrive --json
  out_has '"redriven":0'
}

t_dlq_redrive_some_and_purge() {
  "$SPOOL" init q --max-receives 1 >/dev/null || fail "init"
  # One at a time, so that the dead letters are in a known order: a (oldest) to e.
  local b
  for b in a b c d e; do
    "$SPOOL" send q "$b" >/dev/null || fail "send $b"
    expect 0 "$SPOOL" recv q
    expect 0 "$SPOOL" nack q "$(receipt_of)"
    expect 2 "$SPOOL" recv q
  done
  eq "dead" "$(stat_of dead q)" 5
  expect 64 "$SPOOL" dlq q redrive -n 0
  err_has "-n"
  eq "dead after refused redrive -n 0" "$(stat_of dead q)" 5
  expect 0 "$SPOOL" dlq q redrive -n 2 --json
  eq "redrive -n 2 output" "$(cat "$D/out")" '{"redriven":2}'
  eq "dead after redrive -n 2" "$(stat_of dead q)" 3
  eq "ready after redrive -n 2" "$(stat_of ready q)" 2
  expect 0 "$SPOOL" recv q -n 10 --json
  eq "redriven payloads: the oldest two" "$(sed -n 's/.*"payload":"\([^"]*\)".*/\1/p' "$D/out" | sort | tr -d '\n')" ab
  expect 0 "$SPOOL" dlq q list --json
  eq "dead letters left" "$(sed -n 's/.*"payload":"\([^"]*\)".*/\1/p' "$D/out" | tr -d '\n')" cde
  # redrive --id: one named dead letter (d's id in the DLQ), the others stay; an id that is
  # not a dead letter is reported, the rest still move (exit 1).
  local d_id
  d_id=$(sed -n 's/.*"id":\([0-9]*\),.*"payload":"d".*/\1/p' "$D/out")
  [[ -n $d_id ]] || fail "no id for d in: $(cat "$D/out")"
  expect 64 "$SPOOL" dlq q redrive --id "$d_id" -n 1
  expect 64 "$SPOOL" dlq q list --id "$d_id"
  expect 1 "$SPOOL" dlq q redrive --id 999 --id "$d_id" --json
  err_has "no dead letter 999"
  [[ $(cat "$D/out") =~ ^\{\"redriven\":1,\"ids\":\[[0-9]+\]\}$ ]] || fail "redrive --id --json: $(cat "$D/out")"
  eq "dead after redrive --id" "$(stat_of dead q)" 2
  expect 0 "$SPOOL" recv q --json
  out_has '"payload":"d"'
  expect 0 "$SPOOL" ack q "$(jget receipt)"
  expect 0 "$SPOOL" dlq q list --json
  eq "dead letters left after --id" "$(sed -n 's/.*"payload":"\([^"]*\)".*/\1/p' "$D/out" | tr -d '\n')" ce

  expect 64 "$SPOOL" dlq q purge
  err_has "add --yes to confirm"
  one_line_err
  expect 64 "$SPOOL" dlq q purge --yes -n 1
  err_has "-n"
  eq "dead after refused purges" "$(stat_of dead q)" 2
  expect 0 "$SPOOL" dlq q purge --yes --json
  eq "purge --json output" "$(cat "$D/out")" '{"purged":2}'
  eq "dead after purge" "$(stat_of dead q)" 0
  eq "in flight after purge (the queue itself untouched)" "$(stat_of in_flight q)" 2
  expect 0 "$SPOOL" dlq q list
  [[ -s $D/out ]] && fail "dlq list not empty after purge: $(cat "$D/out")"
  expect 0 "$SPOOL" dlq q purge --yes
  err_has "purged 0 dead letters"
  expect 0 "$SPOOL" dlq q redrive
  err_has "redrove 0"
}

t_delete_by_id() {
  "$SPOOL" init q >/dev/null || fail "init"
  expect 0 "$SPOOL" send q one two three four
  eq "ids" "$(tr '\n' ' ' <"$D/out")" "1 2 3 4 "
  expect 0 "$SPOOL" send q --delay 1h later
  eq "delayed id" "$(cat "$D/out")" 5
  expect 0 "$SPOOL" recv q
  eq "received" "$(cat "$D/out")" one
  local r
  r=$(receipt_of)
  eq "ready before" "$(stat_of ready q)" 3
  eq "in flight before" "$(stat_of in_flight q)" 1
  eq "delayed before" "$(stat_of delayed q)" 1

  # In flight (1), ready (3) and delayed (5) at once.
  expect 0 "$SPOOL" delete q 1 3 5
  eq "ready after delete" "$(stat_of ready q)" 2
  eq "in flight after delete" "$(stat_of in_flight q)" 0
  eq "delayed after delete" "$(stat_of delayed q)" 0
  eq "acked_total after delete" "$(stat_of acked_total q)" 3
  expect 1 "$SPOOL" ack q "$r"
  err_has "message 1 is not in the queue"
  expect 0 "$SPOOL" peek q -n 10 --json
  eq "left" "$(sed -n 's/.*"payload":"\([^"]*\)".*/\1/p' "$D/out" | tr '\n' ' ')" "two four "

  # An unknown id is named, and the ids around it are still deleted.
  expect 1 "$SPOOL" delete q 2 99 4
  err_has "message 99 is not in the queue"
  one_line_err
  eq "ready after a delete with an unknown id" "$(stat_of ready q)" 0
  expect 1 "$SPOOL" delete q 2
  err_has "message 2 is not in the queue"
  # The log and the index agree on what was deleted (verify replays the log and recounts).
  expect 0 "$SPOOL" verify q

  # A malformed id is a usage error that deletes nothing.
  "$SPOOL" send q five >/dev/null || fail "send five"
  expect 64 "$SPOOL" delete q 6 x
  err_has "'x'"
  expect 64 "$SPOOL" delete q 0
  expect 64 "$SPOOL" delete q
  eq "ready after refused deletes" "$(stat_of ready q)" 1
  expect 1 "$SPOOL" delete nope 1
  err_has "no such queue"

  # Dead letters by their id in the dead-letter queue, with --dlq.
  "$SPOOL" init d --max-receives 1 >/dev/null || fail "init d"
  "$SPOOL" send d poison >/dev/null || fail "send poison"
  expect 0 "$SPOOL" recv d
  expect 0 "$SPOOL" nack d "$(receipt_of)"
  expect 2 "$SPOOL" recv d
  expect 0 "$SPOOL" dlq d list --json
  local dead_id
  dead_id=$(jget id)
  [[ -n $dead_id ]] || fail "no dead letter id: $(cat "$D/out")"
  eq "dead before delete --dlq" "$(stat_of dead d)" 1
  expect 0 "$SPOOL" delete d --dlq "$dead_id"
  eq "dead after delete --dlq" "$(stat_of dead d)" 0
  expect 1 "$SPOOL" delete d --dlq "$dead_id"
  err_has "message $dead_id is not in the queue"
}

t_stats_json_fields() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q 1 2 3 4 5 6 >/dev/null || fail "send"
  "$SPOOL" send q --delay 1h later >/dev/null || fail "send --delay"
  expect 0 "$SPOOL" recv q -n 2
  local r
  r=$(receipt_of)
  expect 0 "$SPOOL" ack q "$r"
  expect 0 "$SPOOL" stats q --json
  eq "lines" "$(wc -l <"$D/out")" 1
  local f
  # Issue 24: docs/cli.md's table names every field stats --json prints.
  if [[ -r $CLI_DOC ]]; then
    for f in $(grep -o '"[a-z_]*":' "$D/out" | tr -d '":'); do
      grep -qE "^\| (\`[a-z_]+\`, )*\`$f\`" "$CLI_DOC" || fail "docs/cli.md's stats table lacks $f"
    done
  fi
  for f in ready in_flight delayed dead oldest_ready_age_s sent_total acked_total disk_bytes segments; do
    grep -q "\"$f\":" "$D/out" || fail "stats --json lacks $f: $(cat "$D/out")"
  done
  eq "ready" "$(jget ready)" 4
  eq "in_flight" "$(jget in_flight)" 1
  eq "delayed" "$(jget delayed)" 1
  eq "dead" "$(jget dead)" 0
  eq "sent_total" "$(jget sent_total)" 7
  eq "acked_total" "$(jget acked_total)" 1
  (($(jget segments) >= 1)) || fail "segments: $(jget segments)"
  (($(jget disk_bytes) > 0)) || fail "disk_bytes: $(jget disk_bytes)"
  [[ $(jget oldest_ready_age_s) =~ ^[0-9.e+-]+$ ]] || fail "oldest_ready_age_s: $(jget oldest_ready_age_s)"
  if command -v jq >/dev/null; then
    jq -e . "$D/out" >/dev/null || fail "stats --json is not valid JSON"
  fi
  expect 0 "$SPOOL" stats q
  out_has "ready"
  out_has "in flight"
}

t_stats_recommended_workers() {
  "$SPOOL" init q >/dev/null || fail "init"
  seq 1 10 | "$SPOOL" send q --lines >/dev/null || fail "send"
  expect 0 "$SPOOL" stats q --json
  grep -q recommended_workers "$D/out" && fail "recommended_workers without --rate/--target"
  expect 0 "$SPOOL" stats q --json --rate 2 --target 2s  # ceil(10 / 4)
  eq "recommended_workers" "$(jget recommended_workers)" 3
  expect 0 "$SPOOL" stats q --json --rate 0.5 --target 4s  # ceil(10 / 2)
  eq "recommended_workers" "$(jget recommended_workers)" 5
  expect 0 "$SPOOL" stats q --json --rate 100 --target 1m
  eq "recommended_workers" "$(jget recommended_workers)" 1
  expect 0 "$SPOOL" stats q --rate 2 --target 2s
  out_has "workers needed 3"
  "$SPOOL" purge q --yes 2>/dev/null || fail "purge"
  expect 0 "$SPOOL" stats q --json --rate 2 --target 2s
  eq "recommended_workers of an empty queue" "$(jget recommended_workers)" 0
}

t_stats_prometheus() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q a b c >/dev/null || fail "send"
  expect 0 "$SPOOL" stats q --prometheus
  out_has '# TYPE spool_messages gauge'
  out_has 'spool_messages{queue="q",state="ready"} 3'
  out_has 'spool_messages{queue="q",state="in_flight"} 0'
  out_has 'spool_messages{queue="q",state="delayed"} 0'
  out_has 'spool_messages{queue="q",state="dead"} 0'
  out_has 'spool_sent_total{queue="q"} 3'
  out_has 'spool_bytes{queue="q"} 3'
  # A nack and the counters it moves.
  "$SPOOL" recv q >/dev/null 2>"$D/recv.err" || fail "recv"
  "$SPOOL" nack q "$(sed -n 's/^receipt: //p' "$D/recv.err")" || fail "nack"
  expect 0 "$SPOOL" stats q --prometheus
  out_has 'spool_nacked_total{queue="q"} 1'
  out_has '# TYPE spool_expired_total counter'
  out_has '# TYPE spool_dead_lettered_total counter'
  # The whole output passes a strict parser of the exposition format, also with a queue
  # path that needs escaping in a label value.
  python3 "$PROM_CHECK" <"$D/out" || fail "invalid exposition format: $(python3 "$PROM_CHECK" <"$D/out")"
  mkdir 'odd"dir\' && "$SPOOL" init 'odd"dir\/q' >/dev/null || fail "init odd"
  expect 0 "$SPOOL" stats 'odd"dir\/q' --prometheus
  out_has 'queue="odd\"dir\\/q"'
  python3 "$PROM_CHECK" <"$D/out" || fail "invalid exposition format: $(python3 "$PROM_CHECK" <"$D/out")"
  expect 0 "$SPOOL" stats q --prometheus --rate 1 --target 1s
  out_has 'spool_recommended_workers{queue="q"} 3'
  # Issue 24: two output formats at once printed Prometheus text and ignored --json.
  expect 64 "$SPOOL" stats q --prometheus --json
  err_has "choose one"
  [[ -s $D/out ]] && fail "printed something: $(cat "$D/out")"
  return 0
}

t_stats_watch_stops_on_sigint() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q a >/dev/null || fail "send"
  expect 0 timeout --preserve-status -k 5 -s INT 2 "$SPOOL" stats q --watch --json
  local n
  n=$(grep -c '"ready":1' "$D/out")
  ((n >= 2)) || fail "stats --watch printed $n snapshots in 2 s: $(cat "$D/out")"
  expect 0 timeout --preserve-status -k 5 -s INT 1.5 "$SPOOL" stats q --watch
  out_has "ready"
  # Rates between refreshes, while something sends.
  bg bash -c "while :; do '$SPOOL' send q x >/dev/null; sleep 0.05; done"
  expect 0 timeout --preserve-status -k 5 -s INT 2.5 "$SPOOL" stats q --watch
  grep -qE '^rates +sent [1-9][0-9]*/s' "$D/out" || fail "no send rate shown: $(cat "$D/out")"
}

# Issue 48: spool stats (without --watch) caught SIGTERM and SIGINT for --watch's sake, so one
# blocked in the open of a dead-letter queue whose gate another process holds ignored them.
t_stats_ends_on_sigterm_while_it_waits() {
  "$SPOOL" init q --max-receives 1 --visibility 100ms >/dev/null || fail "init"
  "$SPOOL" send q x >/dev/null || fail "send"
  "$SPOOL" recv q >/dev/null 2>&1 || fail "recv"
  sleep 0.2
  "$SPOOL" recv q >/dev/null 2>&1  # dead-letters it: q/dlq exists
  [[ -e q/dlq/gate ]] || fail "no dead-letter queue"
  # A writer holding the dead-letter queue's gate (bash execs sleep: the lock stays with it).
  bg bash -c 'exec 9>>q/dlq/gate; flock -x 9; exec sleep 30'
  sleep 0.3
  "$SPOOL" stats q >/dev/null 2>&1 &
  local pid=$! i
  sleep 0.5
  kill -0 "$pid" 2>/dev/null || fail "stats did not wait for the gate (the premise)"
  kill -TERM "$pid"
  for ((i = 0; i < 30; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid"
    wait "$pid" 2>/dev/null
    fail "spool stats ignored SIGTERM while it waited"
  fi
  wait "$pid" 2>/dev/null || true  # killed by the signal: 143
}

# Issue 43: stats of several queues in one call; what the directory takes as du counts it
# (the dead-letter queue and the index included), by part; --watch says when each refresh
# was taken; sizes in units that fit ("5 B", not "0.0 MiB").
t_stats_several_queues_du_and_watch_time() {
  "$SPOOL" init q --max-receives 1 >/dev/null && "$SPOOL" init r >/dev/null || fail "init"
  "$SPOOL" send q hello >/dev/null && "$SPOOL" send r a b >/dev/null || fail "send"
  timeout 20 "$SPOOL" work q --max-messages 1 -- false 2>/dev/null  # one dead letter: q/dlq exists
  expect 0 "$SPOOL" stats q --json
  eq "dir_bytes is what du -sB1 counts" "$(jget dir_bytes)" "$(du -sB1 q | cut -f1)"
  eq "dlq_bytes is what du -sB1 counts of q/dlq" "$(jget dlq_bytes)" "$(du -sB1 q/dlq | cut -f1)"
  eq "index_bytes" "$(jget index_bytes)" "$(du -B1 q/index | cut -f1)"
  expect 0 "$SPOOL" stats r
  out_has "payload        2 B"
  grep -qE "^on disk        [0-9.]+ KiB in all, as du counts: segments [0-9.]+ KiB, index [0-9.]+ KiB, dead-letter queue 0 B, other " "$D/out" ||
    fail "no on-disk line: $(cat "$D/out")"
  # several queues: each in turn; one that is not a queue is reported, the others still shown
  expect 1 "$SPOOL" stats q nothere r --json
  eq "objects" "$(wc -l <"$D/out")" 2
  eq "first" "$(jget queue)" q
  eq "second" "$(sed -n 2p "$D/out" | sed -n 's/.*"queue":"\([^"]*\)".*/\1/p')" r
  err_has "nothere"
  expect 0 "$SPOOL" stats q r
  eq "queue lines" "$(grep -c '^queue ' "$D/out")" 2
  expect 64 "$SPOOL" stats q r --prometheus
  # --watch: a time line above each refresh (JSON: a time field)
  expect 0 timeout --preserve-status -k 5 -s INT 1.5 "$SPOOL" stats q r --watch
  grep -qE '^time           20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z$' "$D/out" || fail "no time line: $(cat "$D/out")"
  expect 0 timeout --preserve-status -k 5 -s INT 1.5 "$SPOOL" stats q --watch --json
  grep -q '"time":"20' "$D/out" || fail "no time field: $(cat "$D/out")"
}

t_work_1000_exactly_once() {
  "$SPOOL" init q --visibility 5s >/dev/null || fail "init"
  seq 1 1000 | "$SPOOL" send q --lines >/dev/null || fail "send"
  : >ids
  bg "$SPOOL" work q -j 4 -- sh -c 'echo $SPOOL_MESSAGE_ID >> ids' 2>"$D/work.err"
  local pid=$BGPID
  # Poll cheaply: on a small machine every extra process slows the workers down.
  written() { [[ $(lines ids) -ge 1000 ]]; }
  POLL=0.5 wait_for 100 written
  acked() { [[ $(stat_of acked_total q) == 1000 ]]; }
  wait_for 10 acked
  stop_work "$pid" TERM
  eq "lines written" "$(wc -l <ids)" 1000
  eq "duplicates" "$(sort ids | uniq -d | wc -l)" 0
  eq "distinct ids" "$(sort -u ids | wc -l)" 1000
  eq "ids 1..1000" "$(sort -n ids | head -n 1) $(sort -n ids | tail -n 1)" "1 1000"
  eq "ready" "$(stat_of ready q)" 0
  eq "in_flight" "$(stat_of in_flight q)" 0
  eq "delayed" "$(stat_of delayed q)" 0
  expect 2 "$SPOOL" recv q
  [[ -s $D/work.err ]] && echo "work stderr: $(head -c 1000 "$D/work.err")"
  return 0
}

t_work_payload_and_environment() {
  "$SPOOL" init q >/dev/null || fail "init"
  { printf '\377\000'; head -c 20000 /dev/urandom; } >blob
  "$SPOOL" send q <blob >id || fail "send"
  # shellcheck disable=SC2016
  bg "$SPOOL" work q -- sh -c 'cat > got; echo "$SPOOL_MESSAGE_ID $SPOOL_RECEIVE_COUNT $SPOOL_RECEIPT $SPOOL_QUEUE" > env.txt;
    grep ^SigIgn: /proc/self/status > sigign'
  local pid=$BGPID
  acked() { [[ $(stat_of acked_total q) == 1 ]]; }
  wait_for 10 acked
  stop_work "$pid" INT
  cmp blob got || fail "command's stdin differs from the payload"
  local id count receipt queue
  read -r id count receipt queue <env.txt
  eq "SPOOL_QUEUE (absolute)" "$queue" "$(realpath q)"
  eq "SPOOL_MESSAGE_ID" "$id" "$(cat id)"
  eq "SPOOL_RECEIVE_COUNT" "$count" 1
  [[ $receipt == "$id".1.* ]] || fail "SPOOL_RECEIPT: '$receipt'"
  # The command gets the default SIGPIPE action (spool work itself ignores SIGPIPE).
  local mask
  mask=$(awk '{print $2}' sigign)
  (((0x$mask & 0x1000) == 0)) || fail "SIGPIPE is ignored in the command (SigIgn $mask)"
}

# Issue 43: spool's options end at the command: `spool work q grep -v x` (no --) runs
# `grep -v x`, whose -v used to be taken for spool's --verbose. Options of spool's before
# the command, with values apart or attached, still count; -- still works.
t_work_options_end_at_the_command() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q keep skip-x >/dev/null || fail "send"
  timeout 20 "$SPOOL" work q --max-messages 2 -j 1 --visibility=30s sh -c 'grep -v x >> out; true' 2>"$D/err"
  eq "exit code of work" "$?" 0
  eq "grep -v's output" "$(cat out)" "keep"
  "$SPOOL" send q a >/dev/null || fail "send"
  timeout 20 "$SPOOL" work q -j1 --max-messages 1 grep -c -v x >"$D/out" 2>"$D/err"
  eq "exit code of work" "$?" 0
  eq "grep -c -v x, a command's own flags" "$(cat "$D/out")" 1
  grep -q "message 3" "$D/err" && fail "grep's -v was taken for spool's --verbose: $(cat "$D/err")"
  "$SPOOL" send q b >/dev/null || fail "send"
  timeout 20 "$SPOOL" work q -v --max-messages 1 -- cat >"$D/out" 2>"$D/err"
  eq "exit code of work with --" "$?" 0
  eq "cat's output" "$(cat "$D/out")" b
}

# Issue 43: the man page and docs/cli.md cannot fall behind the CLI. Every command that
# `spool --help` lists (and every command of `spool dlq`) and every flag its own --help
# shows must be named in docs/man/spool.1 (as roff writes it: \- for -) and in docs/cli.md.
t_man_page_and_cli_md_name_every_command_and_flag() {
  local man=${CLI_DOC%/cli.md}/man/spool.1 c f missing=()
  [[ -r $man && -r $CLI_DOC ]] || { echo "# NOTE: $man or $CLI_DOC not found: not checked"; return 0; }
  sed 's/\\-/-/g; s/\\f[BIRP]//g' "$man" >"$D/man.txt"
  expect 0 "$SPOOL" --help
  local -a cmds
  mapfile -t cmds < <(sed -n '/^Subcommands:/,/^$/s/^  \([a-z]*\) .*/\1/p' "$D/out")
  ((${#cmds[@]} > 10)) || fail "spool --help lists only ${#cmds[*]} commands"
  expect 0 "$SPOOL" dlq --help
  for c in $(sed -n '/^Subcommands:/,/^$/s/^  \([a-z]*\) .*/\1/p' "$D/out"); do cmds+=("dlq $c"); done
  for c in "${cmds[@]}"; do
    # shellcheck disable=SC2086
    expect 0 "$SPOOL" $c --help
    # The command's synopsis lines in spool.1 (".B dlq DIR list [-n N] ...") and its section
    # of cli.md ("### spool dlq" up to the next "### ").
    grep -E "^\.B ${c%% *} " "$D/man.txt" >"$D/head" || true
    if [[ $c == *" "* ]]; then grep -F " ${c#* } " "$D/head" >"$D/head2"; mv "$D/head2" "$D/head"; fi
    [[ -s $D/head ]] || missing+=("spool.1: command '$c'")
    awk -v h="### spool ${c%% *}" '$0 == h { on = 1; next } /^### / { on = 0 } on' "$CLI_DOC" >"$D/section"
    [[ -s $D/section ]] || missing+=("cli.md: command '$c'")
    # Flags: the names at the start of each line of the Options section ("-j,--jobs N ...").
    for f in $(sed -n '/^Options:/,/^$/s/^  \(-[^ ]*\).*/\1/p' "$D/out" | tr ',' ' '); do
      case $f in -h | --help) continue ;; esac
      grep -qF -- "$f" "$D/head" || missing+=("spool.1: $c $f")
      grep -qF -- "$f" "$D/section" || missing+=("cli.md: $c $f")
    done
  done
  ((${#missing[@]} == 0)) || fail "not documented: ${missing[*]}"
}

# Issue 43: `spool` alone and `spool help` list the commands (as git and redis-cli do);
# `spool help CMD` is `spool CMD --help`.
t_spool_alone_and_spool_help_list_the_commands() {
  expect 64 "$SPOOL"
  out_has "Subcommands:"
  out_has "Usage: spool [OPTIONS] SUBCOMMAND"
  out_has "work"
  one_line_err
  grep -q "a command is required" "$D/err" || fail "spool alone said: $(cat "$D/err")"
  expect 0 "$SPOOL" help
  out_has "Subcommands:"
  out_has "spool help COMMAND"
  expect 0 "$SPOOL" help work
  out_has "--max-runtime"
  out_has "Usage: spool work [OPTIONS]"
  expect 64 "$SPOOL" help nosuch
  grep -q "unknown command 'nosuch'" "$D/err" || fail "spool help nosuch: $(cat "$D/err")"
}

# Issue 43: `spool work -v` says why it exits, also when it is stopped while idle (a signal
# with no command running used to exit without a word), and when --until-empty ends it.
t_work_verbose_says_why_it_exits_when_idle() {
  "$SPOOL" init q >/dev/null || fail "init"
  bg "$SPOOL" work q -v -- true 2>"$D/idle.err"
  local pid=$BGPID
  sleep 0.5
  stop_work "$pid" TERM
  grep -q "SIGTERM with no command running; exiting" "$D/idle.err" || fail "work -v stopped while idle said: $(cat "$D/idle.err")"
  timeout 20 "$SPOOL" work q -v --until-empty --grace 200ms -- true 2>"$D/empty.err" || fail "work --until-empty failed"
  grep -q "the queue has been empty for 0.2s; exiting" "$D/empty.err" || fail "work -v --until-empty said: $(cat "$D/empty.err")"
}

# Issue 43: --help says what a flag takes (DUR, SIZE, N...), not CLI11's TEXT or UINT.
t_help_names_what_flags_take() {
  local c bad=""
  expect 0 "$SPOOL" help send
  out_has "--delay DUR"
  out_has "--priority N"
  expect 0 "$SPOOL" help init
  out_has "--segment-size SIZE"
  for c in $("$SPOOL" help | awk '/^Subcommands:/ {on=1; next} on && /^  [a-z]/ {print $1} on && /^[^ ]/ {exit}'); do
    [[ $c == serve ]] && continue  # spool-serve's own help
    bad+=$("$SPOOL" help "$c" | awk -v c="$c" '/^Options:/ {on=1; next} on && /^[^ ]/ {exit}
      on && /^  -/ && $2 ~ /^(TEXT|UINT|INT|FLOAT)( |$|:UINT)/ {print c ": " $1 " " $2 "; "}')
  done
  [[ -z $bad ]] || fail "flags still shown with CLI11's type names: $bad"
}

# Issue 43: `spool work` ends with a summary (how many messages, how fast, and what became of
# them), and on a terminal keeps a live line of progress; not on a pipe or a file.
t_work_prints_a_summary_and_a_live_line_on_a_terminal() {
  "$SPOOL" init q --max-receives 1 >/dev/null || fail "init"
  "$SPOOL" send q 1 2 3 4 5 6 >/dev/null || fail "send"
  timeout 30 "$SPOOL" work q --until-empty --grace 200ms -- sh -c 'read x; [ "$x" != 3 ]' \
    2>"$D/err" || fail "work failed: $(cat "$D/err")"
  grep -qE '^spool work: 6 messages in [0-9.]+s, [0-9.e+]+/s: 5 acked, 0 failed \(to retry\), 1 dead-lettered$' "$D/err" ||
    fail "no summary: $(cat "$D/err")"
  grep -q $'\r' "$D/err" && fail "a live line on a file: $(cat -A "$D/err")"
  # a failure that is retried later
  "$SPOOL" init r >/dev/null && "$SPOOL" send r x >/dev/null || fail "init r"
  timeout 30 "$SPOOL" work r --max-messages 1 -- false 2>"$D/err"
  grep -qE '^spool work: 1 message in .*: 0 acked, 1 failed \(to retry\), 0 dead-lettered$' "$D/err" ||
    fail "no summary of a retry: $(cat "$D/err")"
  # On a terminal (script(1) gives one): the line is redrawn in place while commands run.
  command -v script >/dev/null || fail "script(1) (util-linux) is needed to give spool a terminal"
  "$SPOOL" send q 1 2 3 4 >/dev/null || fail "send"
  script -qec "timeout 30 $SPOOL work q -j 2 --until-empty --grace 500ms -- sh -c 'sleep 0.4'" /dev/null >tty.out ||
    fail "work under script: $(cat -A tty.out)"
  grep -qaF $'\r\033[Kspool work: 0 messages in ' tty.out || fail "no live line: $(cat -A tty.out)"
  grep -qaE '; 2 running' tty.out || fail "the live line does not show the running commands: $(cat -A tty.out)"
  grep -qaE 'spool work: 4 messages in [0-9.]+s, [0-9.e+]+/s: 4 acked' tty.out || fail "no summary: $(cat -A tty.out)"
}

# Issue 43: list stops at -n N (default 100) and says, on stderr, how many it did not show
# and the command for the next page (--after the last id shown).
t_list_says_how_many_were_not_shown() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q a b c d e >/dev/null || fail "send"
  expect 0 "$SPOOL" list q -n 2
  eq "rows (header and 2)" "$(lines "$D/out")" 3
  eq "the more line" "$(cat "$D/err")" "spool: 2 shown, 3 more; next page: spool list q -n 2 --after 2"
  expect 0 "$SPOOL" list q -n 2 --after 2
  eq "second page" "$(awk 'NR > 1 {printf "%s ", $1}' "$D/out")" "3 4 "
  eq "its more line" "$(cat "$D/err")" "spool: 2 shown, 1 more; next page: spool list q -n 2 --after 4"
  expect 0 "$SPOOL" list q -n 2 --after 4
  eq "last page" "$(awk 'NR > 1 {printf "%s ", $1}' "$D/out")" "5 "
  [[ -s $D/err ]] && fail "the last page said: $(cat "$D/err")"
  expect 0 "$SPOOL" list q -n 5
  [[ -s $D/err ]] && fail "list of all said: $(cat "$D/err")"
  expect 0 "$SPOOL" list q -n 1 --state delayed
  [[ -s $D/err ]] && fail "list of no delayed message said: $(cat "$D/err")"
  expect 64 "$SPOOL" list q --after x
  return 0
}

# Issue 43: paging through 250 messages in several states by following each page's
# "next page" command visits every message exactly once, in id order.
t_list_pages_with_after_visit_each_message_once() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q $(seq 1 250) >/dev/null || fail "send"
  "$SPOOL" recv q -n 7 >/dev/null 2>&1 || fail "recv"           # 1-7 in flight
  "$SPOOL" send q --delay 1h --priority 3 late >/dev/null || fail "send"  # 251, delayed
  local cmd="spool list q -n 40" seen=() pages=0 first_err=
  while [[ -n $cmd ]] && ((pages < 20)); do
    # shellcheck disable=SC2086
    expect 0 "$SPOOL" ${cmd#spool }
    ((pages++ == 0)) && first_err=$(cat "$D/err")
    mapfile -t -O "${#seen[@]}" seen < <(awk 'NR > 1 {print $1}' "$D/out")
    cmd=$(sed -n 's/.*; next page: //p' "$D/err")
  done
  eq "first page's line" "$first_err" "spool: 40 shown, 211 more; next page: spool list q -n 40 --after 40"
  eq "pages" "$pages" 7
  eq "rows seen" "${#seen[@]}" 251
  eq "each once, in id order" "$(printf '%s\n' "${seen[@]}" | sort -n -u | wc -l) $(printf '%s\n' "${seen[@]}" | sort -n -c && echo sorted)" "251 sorted"
  eq "first and last" "${seen[0]} ${seen[250]}" "1 251"
}

# Issue 43: a new queue is private to its owner under the usual umask 022 (any local user
# could peek every payload); --mode, or a directory that already lets its group write, says
# otherwise.
t_a_new_queue_is_private_by_default() {
  (umask 022 && "$SPOOL" init q && "$SPOOL" send q secret >/dev/null) || fail "init, send"
  eq "the queue directory" "$(stat -c %a q)" 700
  local f
  for f in q/spool.conf $(find q/segments -type f); do eq "mode of $f" "$(stat -c %a "$f")" 600; done
  (umask 022 && "$SPOOL" init readable --mode 0644) || fail "init --mode 0644"
  eq "with --mode 0644" "$(stat -c %a readable)" 755
  mkdir shared && chmod 2770 shared
  (umask 022 && "$SPOOL" init shared) || fail "init in a group's directory"
  eq "a group's directory keeps its mode" "$(stat -c %a shared)" 2770
  eq "and its files follow it" "$(stat -c %a shared/spool.conf)" 660
}

t_work_failure_nacks_with_backoff() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q bad >/dev/null || fail "send"
  : >counts
  # shellcheck disable=SC2016
  bg "$SPOOL" work q -- sh -c 'echo $SPOOL_RECEIVE_COUNT >> counts; exit 1' 2>"$D/work.err"
  local pid=$BGPID
  two() { (($(wc -l <counts) >= 2)); }
  wait_for 10 two
  local second_run_at; second_run_at=$(date +%s%N)
  stop_work "$pid" TERM
  # Nacked with a 2 s backoff, so delayed now; unless this (loaded, sanitized) run took
  # the whole 2 s to get here, and then it must be ready again.
  local delayed; delayed=$(stat_of delayed q)
  if [[ $delayed != 1 ]]; then
    local ms=$((($(date +%s%N) - second_run_at) / 1000000))
    ((ms >= 2000)) || fail "delayed: got '$delayed', want 1 (${ms} ms after the second failure, inside its 2 s backoff)"
    eq "ready after the 2 s backoff" "$(stat_of ready q)" 1
  fi
  eq "receive counts of the retries" "$(head -n 2 counts | tr '\n' ' ')" "1 2 "
  grep -qE "status 1 after [0-9.]+s; retry in 1s" "$D/work.err" || fail "no 1s backoff: $(cat "$D/work.err")"
  grep -q "retry in 2s" "$D/work.err" || fail "no 2s backoff: $(cat "$D/work.err")"
  eq "acked_total" "$(stat_of acked_total q)" 0
  eq "in_flight" "$(stat_of in_flight q)" 0
}

t_work_renews_lease() {
  "$SPOOL" init q --visibility 600ms >/dev/null || fail "init"
  "$SPOOL" send q slow >/dev/null || fail "send"
  : >runs
  # The command runs until the test creates the file "go".
  bg "$SPOOL" work q -- sh -c 'echo run >> runs; while [ ! -e go ]; do sleep 0.1; done; echo done >> runs'
  local pid=$BGPID
  started() { [[ -s runs ]]; }
  wait_for 10 started
  sleep 1.3  # more than twice the visibility
  expect 2 "$SPOOL" recv q
  eq "in_flight while the command runs" "$(stat_of in_flight q)" 1
  touch go
  acked() { [[ $(stat_of acked_total q) == 1 ]]; }
  wait_for 10 acked
  stop_work "$pid" TERM
  eq "runs" "$(tr '\n' ' ' <runs)" "run done "
}

# stats names the processes whose leases are bound to their life, with the leases each holds
# now: for spool work, the commands it runs. A CLI recv binds nothing.
t_stats_shows_holders() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q 1 2 3 4 5 >/dev/null || fail "send"
  expect 0 "$SPOOL" recv q
  : >runs
  # (A lease of 1h: no renewal by extend during the test.)
  bg "$SPOOL" work q -j 3 --visibility 1h -- sh -c 'echo run >> runs; while [ ! -e go ]; do sleep 0.1; done'
  local pid=$BGPID
  three() { [[ $(lines runs) == 3 ]]; }
  wait_for 10 three
  expect 0 "$SPOOL" stats q --json
  # With the time since its last renewal (its last receive; issue 44): the commands
  # started within the last few seconds, and the clock runs on.
  out_has "\"holders\":[{\"in_flight\":3,\"pid\":$pid,\"renewed_ago_s\":"
  local ago
  ago=$(jget renewed_ago_s)
  awk -v a="$ago" 'BEGIN { exit !(a >= 0 && a < 10) }' || fail "renewed_ago_s $ago"
  eq "in_flight (3 bound, 1 not)" "$(jget in_flight)" 4
  sleep 0.3
  expect 0 "$SPOOL" stats q --json
  awk -v a="$ago" -v b="$(jget renewed_ago_s)" 'BEGIN { exit !(b >= a + 0.2) }' || fail "renewed_ago_s did not grow"
  expect 0 "$SPOOL" stats q
  grep -qE "pid $pid: 3 \(renewed [0-9.]+s ago\)" "$D/out" || fail "human stats: $(cat "$D/out")"
  expect 0 "$SPOOL" stats q --prometheus
  out_has "spool_holder_in_flight{queue=\"q\",pid=\"$pid\"} 3"
  touch go
  acked() { [[ $(stat_of acked_total q) == 4 ]]; }
  wait_for 10 acked
  expect 0 "$SPOOL" stats q --json
  out_has '"holders":[]'
  stop_work "$pid" TERM
  expect 0 "$SPOOL" stats q
  ! grep -q "held by" "$D/out" || fail "a holder shown with none: $(cat "$D/out")"
  # An extend renews too: spool work's keeper extends a 900ms lease every 300ms, so 2.5 s
  # after the receive its holder renewed well under a second ago.
  "$SPOOL" send q slow >/dev/null || fail "send"
  bg "$SPOOL" work q --visibility 900ms -- sh -c 'echo run >> runs; sleep 4'
  pid=$BGPID
  four() { [[ $(lines runs) == 4 ]]; }
  wait_for 10 four
  sleep 2.5
  expect 0 "$SPOOL" stats q --json
  out_has "\"pid\":$pid,\"renewed_ago_s\":"
  awk -v a="$(jget renewed_ago_s)" 'BEGIN { exit !(a >= 0 && a < 0.9) }' || fail "not renewed by extend: $(cat "$D/out")"
  stop_work "$pid" TERM
}

t_work_max_runtime() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q hang >/dev/null || fail "send"
  bg "$SPOOL" work q --visibility 2s --max-runtime 300ms -- sleep 30 2>"$D/work.err"
  local pid=$BGPID
  stopped() { grep -q "max-runtime" "$D/work.err"; }
  wait_for 10 stopped
  stop_work "$pid" TERM
  eq "acked_total" "$(stat_of acked_total q)" 0
  eq "in_flight" "$(stat_of in_flight q)" 0
}

# gone WHAT FILE...: fails if a process whose pid is in FILE (one a line) still runs, or one
# whose process group is listed there has a member left.
gone() {
  local what=$1 f p
  shift
  for f in "$@"; do
    for p in $(cat "$f"); do
      alive "$p" && fail "$what: process $p still runs: $(tr '\0' ' ' <"/proc/$p/cmdline")"
      pgrep -g "$p" >/dev/null && fail "$what: process group $p still has members: $(pgrep -a -g "$p")"
    done
  done
  return 0
}

# The command a process tree: a background grandchild in its group, one that left the group
# (setsid), and sleep in the foreground. Appends the shell's pid (= its group) to group and
# the grandchildren's pids to kids.
# shellcheck disable=SC2016
TREE='echo $$ >> group; sleep 300 & echo $! >> kids; setsid sleep 300 & echo $! >> kids; sleep 300'

# Issue 24: --max-runtime signalled only the shell; its sleep ran on with ppid 1 while the
# message was delivered again: two runs of one message at once.
t_work_max_runtime_stops_grandchildren() {
  "$SPOOL" init q --max-receives 1 >/dev/null || fail "init"
  "$SPOOL" send q hang >/dev/null || fail "send"
  : >group
  : >kids
  bg "$SPOOL" work q --max-runtime 500ms -- sh -c "$TREE" 2>"$D/work.err"
  local pid=$BGPID
  stopped() { grep -q "max-runtime" "$D/work.err"; }
  wait_for 10 stopped
  # The outcome is logged only once every process of the command is gone.
  eq "grandchildren started" "$(lines kids)" 2
  gone "after --max-runtime" group kids
  stop_work "$pid" TERM
  # What a command leaves behind when it exits is stopped with it too.
  "$SPOOL" send q job >/dev/null || fail "send"
  : >kids
  # shellcheck disable=SC2016
  bg "$SPOOL" work q -- sh -c 'sleep 300 & echo $! >> kids; setsid sleep 300 & echo $! >> kids; exit 0'
  pid=$BGPID
  acked() { [[ $(stat_of acked_total q) == 1 ]]; }
  wait_for 10 acked
  eq "grandchildren started" "$(lines kids)" 2
  gone "after the command exited 0" kids
  stop_work "$pid" TERM
}

# Issue 24: peek showed leased and delayed messages like ready ones. list gives every
# message's state (with the lease or delay end, and the holder of a bound lease) and
# filters by it; show gives one message by id; dead letters are listed as dead.
t_list_and_show_states() {
  "$SPOOL" init q --max-receives 1 --visibility 1s >/dev/null || fail "init"
  "$SPOOL" send q dies >/dev/null || fail "send"
  "$SPOOL" recv q >/dev/null 2>&1 || fail "recv"
  # Its lease ends after 1 s; the next receive finds it delivered max_receives times.
  sleep 1.2
  expect 2 "$SPOOL" recv q
  # A move no caller asked for is a warning (issue 43: logged once, by the library).
  err_has "message 1 moved to the dead-letter queue (max_receives after 1 deliveries)"
  expect 0 "$SPOOL" send q held ready1 --attribute k=v
  expect 0 "$SPOOL" send q --delay 1h later
  expect 0 "$SPOOL" send q --priority 200 --group gq grouped
  : >"$D/started"
  bg "$SPOOL" work q -j 1 -- sh -c 'echo started >> "$0"; sleep 300' "$D/started"
  local pid=$BGPID
  started() { [[ $(lines "$D/started") == 1 ]]; }
  wait_for 10 started
  expect 0 "$SPOOL" list q
  eq "header" "$(head -n 1 "$D/out" | tr -s ' ')" "ID STATE RECEIVES BYTES PRI AGE DUE HOLDER ORIGINAL GROUP"
  eq "rows" "$(lines "$D/out")" 6
  # id state receives bytes pri age due holder original group
  eq "in flight, bound to spool work" "$(awk '$1 == 2 {print $2, $3, $4, $5, $8}' "$D/out")" "in_flight 1 4 128 $pid"
  [[ $(awk '$1 == 2 {print $7}' "$D/out") =~ ^20[0-9-]+T[0-9:.]+Z$ ]] || fail "no lease end: $(cat "$D/out")"
  [[ $(awk '$1 == 2 {print $6}' "$D/out") =~ ^[0-9.]+[smhd]$ ]] || fail "no age: $(cat "$D/out")"
  eq "ready" "$(awk '$1 == 3 {print $2, $3, $4, $5, $7, $8, $9, $10}' "$D/out")" "ready 0 6 128 - - - -"
  eq "delayed" "$(awk '$1 == 4 {print $2, $3, $4, $8}' "$D/out")" "delayed 0 5 -"
  eq "priority and group" "$(awk '$1 == 5 {print $2, $5, $10}' "$D/out")" "ready 200 gq"
  # The dead letter under its id in the dead-letter queue, naming its original id.
  eq "dead" "$(awk '$2 == "dead" {print $1, $4, $9}' "$D/out")" "1 4 1"
  expect 0 "$SPOOL" list q --state in_flight,delayed --json
  eq "filtered" "$(lines "$D/out")" 2
  eq "first filtered" "$(jget state)" in_flight
  eq "holder in JSON" "$(jget holder_pid)" "$pid"
  expect 0 "$SPOOL" list q --state ready,dead --after 3 --json
  eq "priority in JSON" "$(jget priority)" 200
  eq "group in JSON" "$(jget group)" gq
  [[ $(jget age_s) =~ ^[0-9.]+(e-[0-9]+)?$ ]] || fail "no age_s: $(cat "$D/out")"
  eq "original id in JSON" "$(jget original_id <(sed -n 2p "$D/out"))" 1
  expect 0 "$SPOOL" list q --state dead
  eq "only the dead letter" "$(awk 'NR > 1 {print $1, $2}' "$D/out")" "1 dead"
  expect 0 "$SPOOL" list q -n 1 --state ready
  eq "-n" "$(awk 'NR > 1 {print $1}' "$D/out")" 3
  expect 64 "$SPOOL" list q --state leased
  # show: one message, whatever its state, nothing received.
  expect 0 "$SPOOL" show q 4
  out_has "state: delayed"
  out_has "receive_count: 0"
  eq "payload after the separator" "$(sed -n '/^---$/{n;p}' "$D/out")" later
  expect 0 "$SPOOL" show q 3
  out_has "attribute: k=v"
  expect 0 "$SPOOL" show q 3 --json
  eq "show JSON state" "$(jget state)" ready
  eq "show JSON payload" "$(jget payload)" ready1
  expect 0 "$SPOOL" show q 2
  out_has "holder_pid: $pid"
  expect 0 "$SPOOL" show q --dlq 1
  out_has "state: dead"
  eq "dead letter's payload" "$(sed -n '/^---$/{n;p}' "$D/out")" dies
  expect 1 "$SPOOL" show q 99
  err_has "message 99 is not in the queue"
  one_line_err
  # Issue 43: a dead-lettered message's id names its dead letter.
  expect 1 "$SPOOL" show q 1
  err_has "message 1 is not in the queue: it was dead-lettered, as dead letter 1 (spool show q --dlq 1)"
  one_line_err
  # A queue that never dead-lettered has no dead-letter queue, and list makes none.
  "$SPOOL" init fresh >/dev/null || fail "init fresh"
  "$SPOOL" send fresh one >/dev/null || fail "send fresh"
  expect 0 "$SPOOL" list fresh
  eq "fresh rows" "$(lines "$D/out")" 2
  [[ -e fresh/dlq ]] && fail "list created fresh/dlq"
  # Neither list nor show received anything.
  eq "still delayed" "$(stat_of delayed q)" 1
  eq "still ready" "$(stat_of ready q)" 2
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null || true
}

# Issue 24: a kill -9 of spool work killed the command (parent-death signal) but not what
# the command had started.
t_work_sigkill_stops_grandchildren() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q a b >/dev/null || fail "send"
  : >group
  : >kids
  bg "$SPOOL" work q -j 2 -- sh -c "$TREE"
  local pid=$BGPID
  started() { [[ $(lines kids) == 4 ]]; }
  wait_for 10 started
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null
  still() { ! (gone "" group kids) >/dev/null 2>&1; }
  local i
  for ((i = 0; i < 50; i++)); do
    still || break
    sleep 0.1
  done
  gone "5 s after kill -9 of spool work" group kids
}

# Issue 24: scripts polled `stats --json` to know when a worker had drained the queue.
t_work_until_empty_exits_once_drained() {
  "$SPOOL" init q >/dev/null || fail "init"
  seq 1 5 | "$SPOOL" send q --lines >/dev/null || fail "send"
  # A delayed message is work to come: --until-empty must wait for it, not exit at once.
  "$SPOOL" send q --delay 1500ms late >/dev/null || fail "send --delay"
  local t0=$SECONDS
  timeout 20 "$SPOOL" work q --until-empty --grace 300ms -- sh -c 'cat >> done; echo >> done' \
    >"$D/out" 2>"$D/err"
  eq "exit code of work --until-empty" "$?" 0
  eq "acked_total" "$(stat_of acked_total q)" 6
  grep -qx late done || fail "exited before the delayed message was due: $(cat done)"
  ((SECONDS - t0 < 10)) || fail "took $((SECONDS - t0)) s"
  # An empty queue: exits after the grace time, not at once and not never.
  local t1
  t1=$(date +%s%N)
  timeout 20 "$SPOOL" work q --until-empty --grace 700ms -- true
  eq "exit code on an empty queue" "$?" 0
  local ms=$((($(date +%s%N) - t1) / 1000000))
  ((ms >= 700)) || fail "exited after ${ms} ms, before the 700 ms grace"
  # A message sent during the grace time is taken, and the grace starts again.
  (sleep 0.4 && "$SPOOL" send q during >/dev/null) &
  timeout 20 "$SPOOL" work q --until-empty --grace 1s -- sh -c 'cat >> done; echo >> done'
  eq "exit code" "$?" 0
  wait
  grep -qx during done || fail "the message sent during the grace time was not taken"
  expect 64 "$SPOOL" work q --grace 1s -- true
  err_has "--grace goes with --until-empty"
  expect 64 "$SPOOL" work q --until-empty --grace soon -- true
}

t_work_max_messages() {
  "$SPOOL" init q >/dev/null || fail "init"
  seq 1 10 | "$SPOOL" send q --lines >/dev/null || fail "send"
  timeout 20 "$SPOOL" work q --max-messages 3 -j 4 -- sh -c 'cat >> done; echo >> done'
  eq "exit code of work --max-messages 3" "$?" 0
  eq "messages run" "$(lines done)" 3
  eq "acked_total" "$(stat_of acked_total q)" 3
  eq "ready" "$(stat_of ready q)" 7
  eq "in_flight" "$(stat_of in_flight q)" 0
  # With --until-empty, whichever comes first.
  timeout 20 "$SPOOL" work q --max-messages 100 --until-empty --grace 200ms -- true
  eq "exit code" "$?" 0
  eq "acked_total" "$(stat_of acked_total q)" 10
  expect 64 "$SPOOL" work q --max-messages 0 -- true
  expect 64 "$SPOOL" work q --max-messages 1K -- true
}

# Issue 24: -v logs each message's outcome and duration; giving up on a message (its last
# delivery) was silent, the dead-lettering only visible in stats.
t_work_verbose_and_dead_letter_warning() {
  "$SPOOL" init q --max-receives 2 >/dev/null || fail "init"
  "$SPOOL" send q good bad >/dev/null || fail "send"
  timeout 20 "$SPOOL" work q -v --until-empty --grace 200ms -- sh -c '[ "$(cat)" = good ]' \
    >"$D/out" 2>"$D/err"
  eq "exit code" "$?" 0
  grep -qE "$WORK_LOG"'info: message 1: command exited with status 0 after [0-9]+\.[0-9]{3}s; acked$' "$D/err" ||
    fail "no outcome line for message 1: $(cat "$D/err")"
  grep -qE "$WORK_LOG"'warning: message 2: command exited with status 1 after [0-9.]+s; retry in 1s$' "$D/err" ||
    fail "no retry line for message 2: $(cat "$D/err")"
  grep -qE "$WORK_LOG"'warning: message 2: .*delivery 2 of max_receives 2: it goes to the dead-letter queue' "$D/err" ||
    fail "no dead-letter warning: $(cat "$D/err")"
  # Issue 43: the move is logged once (the library's own line about it was a second, in
  # another format).
  eq "lines about the move" "$(grep -c 'dead-letter queue' "$D/err")" 1
  # The library logs in the same format, named "spool" (SPOOL_LOG=info shows its backend).
  SPOOL_LOG=info "$SPOOL" stats q >/dev/null 2>"$D/lib.err" || fail "stats: $(cat "$D/lib.err")"
  grep -qE "${WORK_LOG/spool work/spool}"'info: I/O backend ' "$D/lib.err" ||
    fail "the library's log line is not in the one format: $(cat "$D/lib.err")"
  grep -q "empty for 0.2s; exiting" "$D/err" || fail "no note on exiting: $(cat "$D/err")"
  eq "dead" "$(stat_of dead q)" 1
  # The dead letter keeps its history and the command's failure.
  expect 0 "$SPOOL" dlq q list --json
  eq "reason" "$(jget spool.dead.reason)" max_receives
  eq "original id" "$(jget spool.dead.original_id)" 2
  eq "receive count" "$(jget spool.dead.receive_count)" 2
  eq "exit status" "$(jget spool.work.exit_status)" 1
  eq "failure" "$(jget spool.work.failure)" "command exited with status 1"
  # Quiet by default: no line for a message that succeeds; the warning stays.
  "$SPOOL" dlq q redrive 2>/dev/null || fail "redrive"
  "$SPOOL" send q good >/dev/null || fail "send"
  timeout 20 "$SPOOL" work q --until-empty --grace 200ms -- sh -c '[ "$(cat)" = good ]' 2>"$D/err"
  eq "exit code" "$?" 0
  grep -q "; acked" "$D/err" && fail "an acked message was logged without -v: $(cat "$D/err")"
  grep -q "dead-letter queue" "$D/err" || fail "no dead-letter warning without -v: $(cat "$D/err")"
  eq "dead" "$(stat_of dead q)" 1
}

# most_at_once FILE: the most commands running at once, from the "+" (start) and "-" (end)
# lines they appended to FILE.
most_at_once() { awk '{ n += ($1 == "+") ? 1 : -1; if (n > m) m = n } END { print m + 0 }' "$1"; }
# targets FILE: the targets `spool work -v --autoscale` logged in FILE, in order.
targets() { sed -n 's/^.* spool work\[[0-9]*\] info: autoscale: target \([0-9]*\) (.*/\1/p' "$1"; }

# --autoscale runs as many commands as the ready backlog needs to wait at most --latency,
# between 1 and -j: more while the backlog is large, fewer as it drains, one for a small one.
t_work_autoscale() {
  "$SPOOL" init q >/dev/null || fail "init"
  seq 1 80 | "$SPOOL" send q --lines >/dev/null || fail "send"
  : >runs
  # A command handles about 8 messages/s: 80 want more than 8 for a 500 ms latency, at first.
  bg "$SPOOL" work q --autoscale --latency 500ms -j 8 -v -- sh -c 'echo + >> runs; sleep 0.1; echo - >> runs' \
    2>"$D/work.err"
  local pid=$BGPID
  # Drained, and the target back at 1 after rising.
  shrunk() {
    [[ $(stat_of ready q) == 0 && $(targets "$D/work.err" | tail -n 1) == 1 ]] &&
      (($(targets "$D/work.err" | sort -n | tail -n 1) > 1))
  }
  POLL=0.3 wait_for 20 shrunk
  stop_work "$pid" TERM
  eq "acked_total" "$(stat_of acked_total q)" 80
  local most peak
  most=$(most_at_once runs)
  peak=$(targets "$D/work.err" | sort -n | tail -n 1)
  ((most > 1 && most <= 8)) || fail "at most $most commands at once, want 2 to 8: $(cat "$D/work.err")"
  ((peak > 1 && peak <= 8)) || fail "peak target $peak, want 2 to 8: $(cat "$D/work.err")"
  eq "first target (nothing measured yet)" "$(targets "$D/work.err" | head -n 1)" 1
  grep -qE "$WORK_LOG"'info: autoscale: target [0-9]+ \(ready [0-9]+, [0-9.]+ messages/s per command, --latency 0\.5s\)$' \
    "$D/work.err" || fail "no target line with a measured rate: $(cat "$D/work.err")"
  # A small backlog: 4 messages at a given 5/s per command fit one command's second.
  seq 1 4 | "$SPOOL" send q --lines >/dev/null || fail "send"
  : >runs
  timeout 20 "$SPOOL" work q --autoscale --latency 1s --rate 5 -j 8 -v --until-empty --grace 200ms -- \
    sh -c 'echo + >> runs; sleep 0.2; echo - >> runs' 2>"$D/err"
  eq "exit code" "$?" 0
  eq "runs" "$(grep -c + runs)" 4
  eq "most at once for a small backlog" "$(most_at_once runs)" 1
  eq "targets for a small backlog" "$(targets "$D/err" | sort -u)" 1
  # Usage errors: one line each, exit 64.
  local args
  for args in "--autoscale -j 4" "--autoscale --latency 0 -j 4" "--autoscale --latency 1s" \
    "--autoscale --latency 1s -j 1" "--autoscale --latency 1s -j 4 --rate 0" "--autoscale --latency 1s -j 4 --rate x" \
    "--latency 1s -j 4" "--rate 2 -j 4"; do
    # shellcheck disable=SC2086
    expect 64 "$SPOOL" work q $args -- true
    one_line_err
  done
  expect 64 "$SPOOL" work q --autoscale -j 4 -- true
  err_has "--autoscale needs --latency"
  expect 64 "$SPOOL" work q --autoscale --latency 1s -j 4 --rate -2 -- true
  err_has "bad rate '-2' for --rate"
  expect 64 "$SPOOL" work q --autoscale --latency 1s -- true
  err_has "--autoscale needs -j MAX"
  expect 64 "$SPOOL" work q --rate 2 -- true
  err_has "--rate goes with --autoscale"
}

# dlq_attr KEY: attribute KEY of the first dead letter `spool dlq q list --json` printed
# to $D/out, exactly (empty if it has none; "BASE64:..." if it is not UTF-8).
dlq_attr() {
  python3 -c 'import json, sys
d = json.loads(open(sys.argv[1]).readline())
v = d["attributes"].get(sys.argv[2])
b = d.get("attributes_base64", {}).get(sys.argv[2])
sys.stdout.write(v if v is not None else "BASE64:" + b if b is not None else "")' "$D/out" "$1"
}

# A dead letter from spool work carries the tail of the last run's stderr, which still
# reaches spool work's stderr whole.
t_work_dead_letter_keeps_stderr_tail() {
  "$SPOOL" init q --max-receives 1 >/dev/null || fail "init"
  "$SPOOL" send q many >/dev/null || fail "send"
  # shellcheck disable=SC2016
  timeout 20 "$SPOOL" work q --until-empty --grace 200ms -- \
    sh -c 'i=1; while [ $i -le 200 ]; do echo "line $i of the output" >&2; i=$((i + 1)); done; exit 3' \
    >"$D/out" 2>"$D/err"
  eq "exit code" "$?" 0
  eq "lines of the command on spool work's stderr" "$(grep -c '^line [0-9]* of the output$' "$D/err")" 200
  eq "first and last" "$(grep -m1 '^line' "$D/err") / $(grep '^line' "$D/err" | tail -n 1)" \
    "line 1 of the output / line 200 of the output"
  expect 0 "$SPOOL" dlq q list --json
  eq "exit status" "$(jget spool.work.exit_status)" 3
  local tail
  tail=$(dlq_attr spool.work.stderr)
  [[ $tail == *$'line 199 of the output\nline 200 of the output' ]] || fail "the tail lacks the last lines: '$tail'"
  [[ $tail == *"line 1 of the output"* ]] && fail "the tail holds the first line: '$tail'"
  ((${#tail} > 400 && ${#tail} <= 512)) || fail "tail of ${#tail} bytes, want the last 512 (less its cut line)"
  # A tail that cuts a two-byte character in two starts after it: UTF-8 output stays UTF-8
  # (602 bytes: 'a', 300 times U+00E9, 'b'; the last 512 start with the second half of one).
  "$SPOOL" dlq q purge --yes 2>/dev/null || fail "purge"
  "$SPOOL" send q utf8 >/dev/null || fail "send"
  timeout 20 "$SPOOL" work q --until-empty --grace 200ms -- \
    sh -c 'printf a >&2; i=0; while [ $i -lt 300 ]; do printf "\303\251" >&2; i=$((i + 1)); done; printf b >&2; exit 1' \
    2>/dev/null
  expect 0 "$SPOOL" dlq q list --json
  local want
  want="$(printf '\303\251%.0s' $(seq 255))b"
  eq "a tail cut inside a character" "$(dlq_attr spool.work.stderr)" "$want"
  # Nothing on stderr: no such attribute.
  "$SPOOL" dlq q purge --yes 2>/dev/null || fail "purge"
  "$SPOOL" send q quiet >/dev/null || fail "send"
  timeout 20 "$SPOOL" work q --until-empty --grace 200ms -- false 2>/dev/null
  expect 0 "$SPOOL" dlq q list --json
  eq "failure" "$(jget spool.work.failure)" "command exited with status 1"
  grep -q spool.work.stderr "$D/out" && fail "an empty stderr became an attribute: $(cat "$D/out")"
  return 0
}

t_work_sigterm_waits_for_commands() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q job >/dev/null || fail "send"
  # The command runs until the test creates the file "go".
  bg "$SPOOL" work q -- sh -c 'echo started > st; while [ ! -e go ]; do sleep 0.1; done; echo finished > fin' \
    2>"$D/work.err"
  local pid=$BGPID
  started() { [[ -s st ]]; }
  wait_for 10 started
  kill -TERM "$pid"
  sleep 0.5
  alive "$pid" || fail "spool work exited before its command finished"
  touch go
  wait_exit "$pid" "spool work after SIGTERM"
  eq "command output" "$(cat fin 2>/dev/null)" finished
  eq "acked_total" "$(stat_of acked_total q)" 1
  grep -q "waiting for 1 running command" "$D/work.err" || fail "no note on stopping: $(cat "$D/work.err")"
}

t_work_ctrl_c_lets_commands_finish() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q job >/dev/null || fail "send"
  # A terminal's Ctrl-C signals the whole foreground process group; setsid gives spool work
  # a group of its own to stand in for it.
  bg setsid "$SPOOL" work q -- sh -c 'echo started > st; while [ ! -e go ]; do sleep 0.1; done; echo finished > fin'
  local pid=$BGPID
  started() { [[ -s st ]]; }
  wait_for 10 started
  kill -INT -- "-$pid" || fail "kill the process group"
  sleep 0.5
  alive "$pid" || fail "spool work exited before its command finished"
  touch go
  wait_exit "$pid" "spool work after SIGINT to its process group"
  eq "command output" "$(cat fin 2>/dev/null)" finished
  eq "acked_total" "$(stat_of acked_total q)" 1
}

t_work_second_signal_stops_commands() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q job >/dev/null || fail "send"
  bg "$SPOOL" work q -- sh -c 'echo started > st; exec sleep 30' 2>"$D/work.err"
  local pid=$BGPID
  started() { [[ -s st ]]; }
  wait_for 10 started
  kill -TERM "$pid"
  sleep 0.3
  alive "$pid" || fail "spool work exited before its command finished"
  stop_work "$pid" TERM
  grep -q "second" "$D/work.err" || fail "no note of the second signal: $(cat "$D/work.err")"
  eq "acked_total" "$(stat_of acked_total q)" 0
  eq "in_flight" "$(stat_of in_flight q)" 0
}

t_work_sigkill_loses_nothing() {
  "$SPOOL" init q --visibility 1s >/dev/null || fail "init"
  seq 1 12 | "$SPOOL" send q --lines >/dev/null || fail "send"
  : >pids
  # shellcheck disable=SC2016
  bg "$SPOOL" work q -j 4 -- sh -c 'echo $$ >> pids; exec sleep 30'
  local pid=$BGPID
  four() { [[ $(stat_of in_flight q) == 4 && $(wc -l <pids) == 4 ]]; }
  wait_for 10 four
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null
  # Its commands die with it (they would otherwise run on after their leases ran out).
  local p i
  for ((i = 0; i < 50; i++)); do
    local any=0
    for p in $(cat pids); do alive "$p" && any=1; done
    ((any == 0)) && break
    sleep 0.1
  done
  for p in $(cat pids); do alive "$p" && fail "command $p outlived the SIGKILLed spool work"; done
  # One snapshot: the leases may run out between two.
  "$SPOOL" stats q --json >"$D/stats.json" || fail "spool stats q failed"
  eq "messages lost (ready + in flight)" \
    "$(($(jget ready "$D/stats.json") + $(jget in_flight "$D/stats.json")))" 12
  : >ids
  # shellcheck disable=SC2016
  bg "$SPOOL" work q -j 4 -- sh -c 'echo $SPOOL_MESSAGE_ID >> ids'
  pid=$BGPID
  all() { [[ $(stat_of acked_total q) == 12 ]]; }
  wait_for 15 all
  stop_work "$pid" TERM
  eq "distinct ids processed" "$(sort -u ids | wc -l)" 12
  eq "ready" "$(stat_of ready q)" 0
  eq "in_flight" "$(stat_of in_flight q)" 0
}

t_backpressure_limits() {
  "$SPOOL" init q --max-ready 2 >/dev/null || fail "init"
  expect 0 "$SPOOL" send q a b
  expect 75 "$SPOOL" send q c  # issue 43: EX_TEMPFAIL, try again later, as pull --once
  err_has "queue full"
  err_has "max_ready is 2"
  one_line_err
  # --wait gives up after its time when nobody makes room.
  local t0=$SECONDS
  expect 75 "$SPOOL" send q c --wait 300ms
  err_has "queue full"
  # ... and succeeds as soon as a consumer makes room.
  (sleep 0.5 && "$SPOOL" recv q >/dev/null 2>&1) &
  expect 0 "$SPOOL" send q c --wait 20s
  wait
  eq "waiting messages" "$(stat_of ready q)" 2
  expect 64 "$SPOOL" init q2 --max-ready 10K
  err_has "bad count '10K' for --max-ready"
  "$SPOOL" init q3 --max-bytes 1K >/dev/null || fail "init q3"
  head -c 1000 /dev/zero | "$SPOOL" send q3 >/dev/null || fail "send 1000 bytes"
  expect 75 "$SPOOL" send q3 "$(head -c 100 /dev/zero | tr '\0' x)"
  err_has "max_bytes is 1024"
  ((SECONDS - t0 < 15)) || fail "took too long"
}

# spool init --retention-max-bytes / --retention-max-age are stored with the queue: later
# commands (which take no such flag) drop what they say, counted as expired_total.
t_init_retention_flags() {
  "$SPOOL" init q --retention-max-bytes 1000 >/dev/null || fail "init"
  local i body
  body=$(head -c 200 /dev/zero | tr '\0' r)
  for i in 1 2 3 4 5 6 7 8 9 10; do "$SPOOL" send q "$body" >/dev/null || fail "send $i"; done
  eq "ready under --retention-max-bytes 1000" "$(stat_of ready q)" 5
  eq "expired_total" "$(stat_of expired_total q)" 5
  # 3 s: "new" must still be younger than the limit when recv runs, which under a sanitizer
  # on a loaded machine came more than 300 ms after its send (both were dropped then).
  "$SPOOL" init q2 --retention-max-age 3s >/dev/null || fail "init q2"
  "$SPOOL" send q2 old >/dev/null || fail "send old"
  sleep 3.2  # a lower bound only: the message is older than 3 s from here on
  "$SPOOL" send q2 new >/dev/null || fail "send new"
  expect 0 "$SPOOL" recv q2
  out_has new
  expect 2 "$SPOOL" recv q2
  eq "expired_total under --retention-max-age 3s" "$(stat_of expired_total q2)" 1
  expect 64 "$SPOOL" init q3 --retention-max-bytes lots
}

# Issue 24: send --lines (and several MESSAGE arguments) went as one batch, so on a queue
# with max_ready the whole input was refused, even with --wait.
t_send_batches_fit_max_ready() {
  "$SPOOL" init q --max-ready 4 >/dev/null || fail "init"
  : >done
  # shellcheck disable=SC2016
  bg "$SPOOL" work q --max-messages 25 -- sh -c 'cat >> done; echo >> done'
  local pid=$BGPID
  seq 1 20 | timeout 30 "$SPOOL" send q --lines --wait 10s >"$D/out" 2>"$D/err"
  eq "exit code of send --lines --wait" "$?" 0
  eq "ids printed" "$(lines "$D/out")" 20
  timeout 30 "$SPOOL" send q a b c d e --wait 10s >"$D/out" 2>"$D/err"
  eq "exit code of send with 5 arguments --wait" "$?" 0
  eq "ids printed" "$(lines "$D/out")" 5
  wait_exit "$pid" "spool work --max-messages 25"
  eq "messages processed" "$(lines done)" 25
  eq "order kept" "$(head -n 3 done | tr '\n' ' ')" "1 2 3 "
  # max_bytes bounds a batch's bytes the same way.
  "$SPOOL" init qb --max-bytes 100 >/dev/null || fail "init qb"
  bg "$SPOOL" work qb --max-messages 10 -- true
  pid=$BGPID
  printf '%040d\n' $(seq 1 10) | timeout 30 "$SPOOL" send qb --lines --wait 10s >"$D/out" 2>"$D/err"
  eq "exit code of send to max_bytes 100, 10 x 40 bytes" "$?" 0
  wait_exit "$pid" "spool work qb"
  # --batch N is honoured and checked.
  "$SPOOL" init q2 >/dev/null || fail "init q2"
  seq 1 5 | "$SPOOL" send q2 --lines --batch 2 >/dev/null || fail "send --batch 2"
  eq "sent" "$(stat_of sent_total q2)" 5
  expect 64 "$SPOOL" send q2 x --batch 0
  expect 64 "$SPOOL" send q2 x --batch many
  # Without --wait a full queue still fails at once, after what fitted was sent.
  expect 75 "$SPOOL" send q a b c d e f
  err_has "queue full"
  eq "ids printed before the refusal" "$(lines "$D/out")" 4
}

# Issue 24: a refused init left a directory that later commands called "not a spool queue".
t_failed_init_leaves_nothing() {
  expect 64 "$SPOOL" init q --segment-size 1K
  err_has "segment"
  [[ -e q ]] && fail "a refused init left q behind: $(ls -A q)"
  expect 1 "$SPOOL" send q x
  err_has "no such queue; create it with: spool init q"
  mkdir empty
  expect 64 "$SPOOL" init empty --segment-size 1K
  eq "files left in an empty directory by a refused init" "$(ls -A empty)" ""
  expect 0 "$SPOOL" init q
  expect 0 "$SPOOL" init empty
}

# Issue 24: spool-dump with no arguments printed nothing and exited 0.
t_spool_dump_usage() {
  local dump
  dump=$(dirname "$SPOOL")/spool-dump
  [[ -x $dump ]] || fail "no spool-dump beside $SPOOL"
  expect 64 "$dump"
  err_has "usage: spool-dump"
  err_has "no SEGMENT_FILE"
  expect 64 "$dump" --bogus
  err_has "unknown option '--bogus'"
  expect 0 "$dump" --help
  out_has "usage: spool-dump"
  out_has "Example:"
}

# seg_syncs CMD...: runs CMD (it must exit 0; output in $D/out, $D/err) under strace and
# prints how many fsync/fdatasync calls it made on segment files.
seg_syncs() {
  command -v strace >/dev/null || fail "strace is needed to see the syncs (scripts/deps.sh --test installs it)"
  # LeakSanitizer cannot run under ptrace (it exits with "fatal error" in an ASan build):
  # leaks are not what this looks at.
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    strace -f -qq -y -e trace=fsync,fdatasync -o "$D/strace" "$@" >"$D/out" 2>"$D/err" ||
    fail "$* failed: $(cat "$D/err")"
  grep -cE '^[0-9]+ +f(data)?sync\([0-9]+<[^>]*/segments/[0-9]+\.seg>\) = 0' "$D/strace"
}

# On a --sync never queue a plain send or ack syncs nothing; --durable makes each one sync
# its segment before it returns (seen by strace, not only its exit code).
t_send_and_ack_durable() {
  "$SPOOL" init q --sync never >/dev/null || fail "init"
  expect 0 "$SPOOL" send q warm-up  # creates the segment (synced however the queue is set)
  eq "fdatasyncs of a plain send" "$(seg_syncs "$SPOOL" send q plain)" 0
  local n
  n=$(seg_syncs "$SPOOL" send q --durable hello)
  ((n >= 1)) || fail "send --durable made no fdatasync of its segment: $(cat "$D/strace")"
  eq "id" "$(cat "$D/out")" 3
  expect 0 "$SPOOL" recv q -n 2
  local receipts
  mapfile -t receipts < <(sed -n 's/^receipt: //p' "$D/err")
  eq "receipts" "${#receipts[@]}" 2
  eq "fdatasyncs of a plain ack" "$(seg_syncs "$SPOOL" ack q "${receipts[0]}")" 0
  n=$(seg_syncs "$SPOOL" ack q --durable "${receipts[1]}")
  ((n >= 1)) || fail "ack --durable made no fdatasync of its segment: $(cat "$D/strace")"
  eq "acked_total" "$(stat_of acked_total q)" 2
}

# Issue 26: attributes set with -a come back in recv/peek --json (and on stderr of a plain
# recv); bad ones are usage errors naming the problem.
t_send_attributes_shown_by_recv_and_peek() {
  "$SPOOL" init q >/dev/null || fail "init"
  expect 0 "$SPOOL" send q -a color=red -a trace.id=a-1 -a 'eq=x=y' hello world
  eq "ids" "$(tr '\n' ' ' <"$D/out")" "1 2 "
  expect 0 "$SPOOL" send q plain
  expect 0 "$SPOOL" peek q -n 3 --json
  eq "first line" "$(sed -n 1p "$D/out" | grep -o '"attributes":{[^}]*}')" '"attributes":{"color":"red","eq":"x=y","trace.id":"a-1"}'
  eq "second line" "$(sed -n 2p "$D/out" | grep -o '"payload":"[a-z]*"')" '"payload":"world"'
  eq "plain message" "$(sed -n 3p "$D/out" | grep -o '"attributes":{[^}]*}')" '"attributes":{}'
  expect 0 "$SPOOL" recv q --json
  out_has '"attributes":{"color":"red","eq":"x=y","trace.id":"a-1"}'
  out_has '"receipt":"1.1.'
  expect 0 "$SPOOL" recv q
  eq "payload" "$(cat "$D/out")" "world"
  err_has "attribute: color=red"
  expect 64 "$SPOOL" send q -a 'bad key=1' x
  err_has "attribute key 'bad key' may hold only letters, digits"
  expect 64 "$SPOOL" send q -a novalue x
  err_has "-a takes KEY=VALUE"
  expect 64 "$SPOOL" send q -a k=1 -a k=2 x
  err_has "names the attribute 'k' twice"
  expect 64 "$SPOOL" send q -a "k=$(head -c 1100 /dev/zero | tr '\0' v)" x
  err_has "value of 1100 bytes"
  eq "sent_total" "$(stat_of sent_total q)" 3
}

# --priority: recv takes the most urgent first, in another process than the sender; recv and
# peek --json and show print it; out of range is a usage error that sends nothing.
t_send_priority_orders_recv() {
  "$SPOOL" init q >/dev/null || fail "init"
  expect 0 "$SPOOL" send q bulk1 bulk2 --priority 200
  expect 0 "$SPOOL" send q plain
  expect 0 "$SPOOL" send q --priority 0 urgent
  expect 0 "$SPOOL" peek q -n 1 --json
  out_has '"priority":200'
  expect 0 "$SPOOL" show q 4
  out_has "priority: 0"
  local got="" i
  for i in 1 2 3 4; do
    expect 0 "$SPOOL" recv q --json
    got+="$(grep -o '"payload":"[a-z0-9]*"' "$D/out" | cut -d'"' -f4)/$(grep -o '"priority":[0-9]*' "$D/out" | cut -d: -f2) "
    "$SPOOL" ack q "$(grep -o '"receipt":"[^"]*"' "$D/out" | cut -d'"' -f4)" || fail "ack"
  done
  eq "order" "$got" "urgent/0 plain/128 bulk1/200 bulk2/200 "
  expect 64 "$SPOOL" send q --priority 256 x
  err_has "--priority must be 0 (most urgent) to 255"
  eq "sent_total" "$(stat_of sent_total q)" 4
}

# Issue 26: a group's messages are received one at a time in send order, across spool
# processes and a deleted index; recv --json names the group, stats counts the blocked.
t_send_group_orders_recv() {
  "$SPOOL" init q >/dev/null || fail "init"
  expect 0 "$SPOOL" send q --group order-17 created paid
  expect 0 "$SPOOL" send q --group order-18 created18
  expect 0 "$SPOOL" send q --group order-17 shipped
  eq "blocked" "$(stat_of blocked q)" 2
  expect 0 "$SPOOL" list q --state blocked --json
  out_has '"state":"blocked"'
  expect 0 "$SPOOL" show q 2
  out_has "state: blocked"
  out_has "group: order-17"
  rm q/index
  expect 0 "$SPOOL" recv q --json -n 10
  out_has '"group":"order-17"'
  out_has '"payload":"created"'
  out_has '"payload":"created18"'
  out_lacks '"payload":"paid"'
  local r1
  r1="$(grep '"payload":"created"' "$D/out" | grep -o '"receipt":"[^"]*"' | cut -d'"' -f4)"
  expect 2 "$SPOOL" recv q --json
  "$SPOOL" ack q "$r1" || fail "ack"
  expect 0 "$SPOOL" recv q --json
  out_has '"payload":"paid"'
  expect 64 "$SPOOL" send q --group "$(head -c 129 /dev/zero | tr '\0' g)" x
  err_has "group key of 129 bytes"
}

# A second send with the same --dedup-id prints the first id, says on stderr (or in --json)
# that it was a duplicate and queues nothing, also after the message was acked and after the
# index was deleted; the window is a stored setting.
t_send_dedup_id() {
  local dup_line="duplicate: dedup id order-1 was sent within the queue's dedup window as message 1; nothing was queued"
  "$SPOOL" init q --dedup-window 10m >/dev/null || fail "init"
  grep -qx 'dedup_window_ms = 600000' q/spool.conf || fail "window not stored: $(cat q/spool.conf)"
  expect 0 "$SPOOL" send q --dedup-id order-1 first
  eq "id" "$(cat "$D/out")" 1
  [[ ! -s $D/err ]] || fail "a new message said something on stderr: $(cat "$D/err")"
  expect 0 "$SPOOL" send q --dedup-id order-1 second
  eq "duplicate id" "$(cat "$D/out")" 1
  eq "duplicate note" "$(cat "$D/err")" "$dup_line"
  expect 0 "$SPOOL" send q --dedup-id order-2 other
  eq "new id" "$(cat "$D/out")" 2
  [[ ! -s $D/err ]] || fail "a new message said something on stderr: $(cat "$D/err")"
  eq "dedup_ids" "$(stat_of dedup_ids q)" 2
  expect 0 "$SPOOL" stats q --prometheus
  out_has 'spool_dedup_ids{queue="q"} 2'
  expect 0 "$SPOOL" recv q
  expect 0 "$SPOOL" ack q "$(receipt_of)"
  rm q/index
  expect 0 "$SPOOL" send q --dedup-id order-1 third
  eq "after ack and rebuild" "$(cat "$D/out")" 1
  eq "duplicate note after ack and rebuild" "$(cat "$D/err")" "$dup_line"
  eq "sent_total" "$(stat_of sent_total q)" 2
  # --json: the id and whether it was a duplicate, nothing on stderr.
  expect 0 "$SPOOL" send q --dedup-id order-1 --json fourth
  eq "json duplicate" "$(cat "$D/out")" '{"duplicate":true,"id":1}'
  [[ ! -s $D/err ]] || fail "--json said something on stderr: $(cat "$D/err")"
  expect 0 "$SPOOL" send q --dedup-id order-3 --json fifth
  eq "json new" "$(cat "$D/out")" '{"duplicate":false,"id":3}'
  expect 0 "$SPOOL" send q --json six seven
  eq "json batch" "$(cat "$D/out")" $'{"duplicate":false,"id":4}\n{"duplicate":false,"id":5}'
  eq "sent_total after the json sends" "$(stat_of sent_total q)" 5
  expect 64 "$SPOOL" send q --dedup-id x a b
  err_has "--dedup-id names one message"
  expect 64 "$SPOOL" send q --dedup-id "$(head -c 129 /dev/zero | tr '\0' d)" a
  err_has "dedup id of 129 bytes"
  expect 64 "$SPOOL" init q2 --dedup-window 0s
  err_has "dedup_window_ms = 0 is out of range"
  expect 64 "$SPOOL" init q3 --dedup-window soon
  [[ ! -e q2 && ! -e q3 ]] || fail "a refused init left a directory"
}

# Issue 26: replay after ack (init --keep-acked, replay, stats), across an index rebuild.
t_replay_after_ack() {
  "$SPOOL" init q --keep-acked 24h >/dev/null || fail "init"
  grep -qx 'keep_acked_ms = 86400000' q/spool.conf || fail "keep_acked not stored: $(cat q/spool.conf)"
  "$SPOOL" init q2 >/dev/null || fail "init q2"
  grep -q keep_acked q2/spool.conf && fail "keep_acked written for a queue without it"
  expect 0 "$SPOOL" send q -a color=blue first
  expect 0 "$SPOOL" send q second
  expect 0 "$SPOOL" recv q -n 2 --json
  sed -n 's/.*"receipt":"\([^"]*\)".*/\1/p' "$D/out" | xargs "$SPOOL" ack q || fail "ack"
  eq "kept_acked" "$(stat_of kept_acked q)" 2
  eq "kept_acked_bytes" "$(stat_of kept_acked_bytes q)" 11
  expect 0 "$SPOOL" stats q --json
  eq "keep_acked_ms" "$(jget keep_acked_ms)" 86400000
  expect 0 "$SPOOL" stats q --prometheus
  out_has 'spool_kept_acked{queue="q"} 2'
  expect 0 "$SPOOL" stats q
  out_has "kept acked     2"
  rm q/index  # the log is the truth: the next command rebuilds the index from it
  expect 0 "$SPOOL" replay q --since 1h --until 30m --json
  eq "replayed before --until" "$(jget replayed)" 0
  expect 0 "$SPOOL" replay q --since 1h --json
  eq "replayed" "$(jget replayed)" 2
  eq "missing" "$(jget missing)" 0
  expect 0 "$SPOOL" recv q -n 2 --json
  out_has '"color":"blue"'
  out_has '"spool.replay.original_id":"1"'
  out_has '"spool.replay.original_id":"2"'
  out_has '"spool.replay.acked_at":"'
  grep -q '"payload":"first"' "$D/out" || fail "first not replayed: $(cat "$D/out")"
  expect 0 "$SPOOL" replay q --since 1h --to q2
  out_has "replayed 2 acked messages into q2"
  eq "ready in q2" "$(stat_of ready q2)" 2
  expect 64 "$SPOOL" replay q --since 1h --until 2h
  err_has "--until must be less than --since"
  expect 64 "$SPOOL" replay q
  expect 64 "$SPOOL" replay q --since soon
  expect 1 "$SPOOL" replay q --since 1h --to nowhere
  err_has "nowhere"
  expect 64 "$SPOOL" init q3 --keep-acked 721h
  err_has "keep_acked_ms = 2595600000 is out of range"
  [[ ! -e q3 ]] || fail "a refused init left a directory"
}

t_progress_bar_only_on_a_terminal() {
  command -v script >/dev/null || fail "script(1) (util-linux) is needed to give spool a terminal"
  "$SPOOL" init q --segment-size 64K >/dev/null || fail "init"
  seq -f "%0100g" 1 3000 | "$SPOOL" send q --lines >/dev/null || fail "send"
  "$SPOOL" recv q -n 3000 --json >msgs || fail "recv"
  # Ack 70% of each segment: on-demand compaction (at most half live) then has work that
  # the automatic one (at most a quarter live) left alone.
  sed -n 's/.*"receipt":"\([^"]*\)".*/\1/p' msgs | awk -F. '$1 % 10 < 7' | xargs "$SPOOL" ack q || fail "ack"
  # Not a terminal: nothing on stderr.
  expect 0 "$SPOOL" verify q
  [[ ! -s $D/err ]] || fail "verify wrote to a non-terminal stderr: $(cat "$D/err")"
  # A terminal (script gives one): the bar is drawn, then cleared.
  script -qec "$SPOOL compact q" /dev/null >tty.out || fail "compact under script"
  grep -q 'compact \[#' tty.out || fail "no progress bar: $(cat -v tty.out)"
  grep -q 'removed [1-9]' tty.out || fail "compact removed nothing: $(cat -v tty.out)"
  script -qec "$SPOOL verify q" /dev/null >tty.out || fail "verify under script"
  grep -q 'verify \[#' tty.out || fail "no progress bar: $(cat -v tty.out)"
}

# Issue 43: on a terminal the receipt starts a line of its own ("helloreceipt: ..." before);
# into a pipe the payload stays byte for byte, nothing added.
t_recv_receipt_on_its_own_line_on_a_terminal() {
  "$SPOOL" init q >/dev/null || fail "init"
  printf 'hello' | "$SPOOL" send q >/dev/null || fail "send"
  printf 'there' | "$SPOOL" send q >/dev/null || fail "send"
  script -qec "$SPOOL recv q" /dev/null >tty.out || fail "recv under script"
  grep -qa $'^hello\r$' tty.out || fail "the payload has no line of its own: $(cat -v tty.out)"
  grep -qa '^receipt: ' tty.out || fail "the receipt does not start a line: $(cat -v tty.out)"
  "$SPOOL" recv q >payload 2>/dev/null || fail "recv into a file"
  eq "a payload into a file, byte for byte" "$(od -An -c payload | tr -d ' ')" "there"
}

t_work_sigkill_releases_leases_at_once() {
  "$SPOOL" init q --visibility 60s >/dev/null || fail "init"
  "$SPOOL" send q job >/dev/null || fail "send"
  bg "$SPOOL" work q -- sh -c 'echo started > st; exec sleep 30'
  local pid=$BGPID
  started() { [[ -s st ]]; }
  wait_for 10 started
  kill -KILL "$pid"
  local t0
  t0=$(date +%s%N)
  expect 0 "$SPOOL" recv q --wait 5s --json
  local ms=$((($(date +%s%N) - t0) / 1000000))
  ((ms < 3000)) || fail "the message came back after ${ms} ms, not long before its 60 s lease ended"
  eq "receive_count" "$(jget receive_count)" 2
}

t_work_errors() {
  "$SPOOL" init q >/dev/null || fail "init"
  expect 1 "$SPOOL" work q -- /nonexistent/command
  err_has "/nonexistent/command"
  one_line_err
  expect 1 "$SPOOL" work q -- no-such-command-spool-test
  err_has "not found"
}

# Issue 23: a command started with 0, 1 or 2 closed must not have a queue file take that
# number (`gate` became stdout: recv wrote the payload into it and exited 0). Commands whose
# output is the data refuse a closed stdout before touching the queue; the others write to
# /dev/null; send refuses a closed stdin rather than send an empty message.
t_closed_std_fds_never_reach_queue_files() {
  "$SPOOL" init q >/dev/null || fail "init"
  "$SPOOL" send q precious-payload >/dev/null || fail "send"
  local cmd
  for cmd in "recv q" "recv q --json" "peek q" "stats q" "stats q --json" "dlq q list"; do
    # shellcheck disable=SC2086
    "$SPOOL" $cmd >&- 2>"$D/err"
    RC=$?
    eq "exit code of '$cmd' with stdout closed" "$RC" 64
    err_has "standard output is closed"
    one_line_err
  done
  eq "ready after recv with stdout closed" "$(stat_of ready q)" 1
  eq "in flight after recv with stdout closed" "$(stat_of in_flight q)" 0
  grep -rlF precious-payload q --exclude-dir=segments >"$D/hits"
  eq "queue files (outside segments/) holding the payload" "$(cat "$D/hits")" ""
  # stdin closed: no MESSAGE, so nothing to send.
  "$SPOOL" send q <&- >"$D/out" 2>"$D/err"
  eq "exit code of send with stdin closed" "$?" 64
  err_has "standard input is closed"
  eq "sent after send with stdin closed" "$(stat_of sent_total q)" 1
  "$SPOOL" send q from-args <&- >"$D/out" 2>"$D/err" || fail "send MESSAGE with stdin closed: $(cat "$D/err")"
  eq "sent with MESSAGE and stdin closed" "$(stat_of sent_total q)" 2
  # Other commands run, their output going nowhere rather than into a queue file.
  "$SPOOL" send q more >&- 2>"$D/err" || fail "send with stdout closed: $(cat "$D/err")"
  eq "sent with stdout closed" "$(stat_of sent_total q)" 3
  "$SPOOL" verify q >&- 2>"$D/err" || fail "verify with stdout closed: $(cat "$D/err")"
  "$SPOOL" ack q 1.1.00000000 2>&-
  eq "exit code of a bad ack with stderr closed" "$?" 1
  "$SPOOL" stats q --json 2>&- >"$D/out" || fail "stats with stderr closed"
  out_has '"ready":3'
  grep -rlE 'segments|spool:|receipt' q --exclude-dir=segments >"$D/hits"
  eq "queue files holding CLI output" "$(cat "$D/hits")" ""
  expect 0 "$SPOOL" recv q
  eq "payload after it all" "$(cat "$D/out")" precious-payload
  # spool-dump (beside spool in a build tree): the dump is its output.
  local dump
  dump=$(dirname "$SPOOL")/spool-dump
  if [[ -x $dump ]]; then
    "$dump" q/segments/*.seg >&- 2>"$D/err"
    eq "exit code of spool-dump with stdout closed" "$?" 2
    err_has "standard output is closed"
  else
    echo "# NOTE: no spool-dump beside $SPOOL: its closed-stdout case is not checked"
  fi
}

# ---------------------------------------------------------------- runner

# issue 48: arguments that were taken as something else. An empty --dedup-id or --group was
# as good as none; `show q -1` read message 18446744073709551615; a lease or a delay past a
# year overflowed its deadline (a second receive got the leased message too, and a message
# delayed that long was ready at once). Each is refused now, and nothing is sent or leased.
t_out_of_range_arguments_are_refused() {
  "$SPOOL" init q >/dev/null || fail "init"
  expect 64 "$SPOOL" send q --dedup-id '' hi
  err_has "--dedup-id must be 1 to 128 bytes"
  expect 64 "$SPOOL" send q --group '' hi
  err_has "--group must be 1 to 128 bytes"
  expect 64 "$SPOOL" show q -1
  err_has "bad count '-1' for ID"
  expect 64 "$SPOOL" show q 0
  expect 64 "$SPOOL" send q --delay 8761h hi
  err_has "more than a year"
  eq "sent by refused sends" "$(stat_of sent_total q)" 0
  "$SPOOL" send q hi >/dev/null || fail "send"
  expect 1 "$SPOOL" recv q --visibility 2562047h
  err_has "visibility of 9223369200000 ms is more than a year"
  expect 0 "$SPOOL" recv q --visibility 8760h
  expect 2 "$SPOOL" recv q
  # A newline in an attribute value forged a "receipt:" line on recv's stderr, which the
  # docs' `sed -n 's/^receipt: //p'` recipe then picked up as well.
  "$SPOOL" send q -a $'note=x\nreceipt: 9.9.forged' -a 'path=C:\dir' body >/dev/null || fail "send"
  expect 0 "$SPOOL" recv q
  eq "receipts on stderr" "$(sed -n 's/^receipt: //p' "$D/err" | wc -l)" 1
  err_has 'attribute: note=x\nreceipt: 9.9.forged'
  err_has 'attribute: path=C:\\dir'
}

# Issue 46: two services read one stream. `billing` reads the queue itself, `audit` a
# subscription: each gets every message, with leases and receipts of its own, from one
# stored copy; `sub list`, `stats` and `--sub` on the reading commands show it.
t_subscriptions_two_services_read_one_stream() {
  "$SPOOL" init q >/dev/null || fail "init"
  expect 0 "$SPOOL" send q early
  expect 0 "$SPOOL" sub add q audit
  err_has "added subscription 'audit'"
  expect 0 "$SPOOL" sub add q replayer --from start
  err_has "it gets 1 message, from message 1 on"
  expect 1 "$SPOOL" sub add q audit
  err_has "exists already"
  expect 64 "$SPOOL" sub add q
  expect 1 "$SPOOL" sub add q 'bad name'
  err_has "only letters, digits"
  expect 0 "$SPOOL" send q one two
  expect 0 "$SPOOL" sub list q --json
  eq "subscriptions" "$(lines "$D/out")" 2
  eq "audit holds what was sent after it" "$(jget messages <(grep '"audit"' "$D/out"))" 2
  eq "replayer holds every message" "$(jget messages <(grep '"replayer"' "$D/out"))" 3
  # The queue's own readers (billing) drain it; the subscriptions keep theirs.
  expect 0 "$SPOOL" recv q -n 10 --json
  eq "billing got all three" "$(lines "$D/out")" 3
  local r
  for r in $(sed -n 's/.*"receipt":"\([^"]*\)".*/\1/p' "$D/out"); do
    expect 0 "$SPOOL" ack q "$r"
  done
  expect 0 "$SPOOL" recv q --sub audit
  eq "audit's first" "$(cat "$D/out")" one
  local audit_receipt
  audit_receipt=$(receipt_of)
  # A receipt is its view's: the queue's own readers cannot ack audit's lease.
  expect 1 "$SPOOL" ack q "$audit_receipt"
  err_has "belongs to another queue"
  expect 0 "$SPOOL" list q --sub audit
  eq "audit's list" "$(awk 'NR > 1 {print $1, $2}' "$D/out" | tr '\n' ' ')" "2 in_flight 3 ready "
  expect 0 "$SPOOL" show q 3 --sub audit
  out_has "two"
  expect 0 "$SPOOL" ack q "$audit_receipt" --sub audit
  expect 0 "$SPOOL" peek q --sub replayer -n 5
  out_has "early"
  # spool work on a subscription: runs once per message of that subscription only.
  expect 0 "$SPOOL" work q --sub replayer --until-empty -- sh -c 'cat >> "$0"; echo >> "$0"' "$D/seen"
  eq "replayer's worker saw every message" "$(tr '\n' ' ' <"$D/seen")" "early one two "
  expect 0 "$SPOOL" stats q
  out_has "subscription   audit: 1 message, 0 in flight"
  out_has "subscription   replayer: 0 messages, 0 in flight"
  expect 0 "$SPOOL" stats q --sub audit --json
  eq "audit's ready" "$(jget ready)" 1
  eq "named" "$(jget subscription)" audit
  # One stored copy: one MSG record per message in the log, whatever the subscriptions.
  "$(dirname "$SPOOL")/spool-dump" q/segments/*.seg >"$D/dump" || fail "spool-dump"
  eq "MSG records" "$(grep -c ' MSG ' "$D/dump")" 3
  expect 1 "$SPOOL" recv q --sub nobody
  err_has "no subscription 'nobody'"
  expect 0 "$SPOOL" sub rm q audit
  err_has "removed subscription 'audit'"
  expect 1 "$SPOOL" recv q --sub audit
  expect 0 "$SPOOL" sub list q
  out_has "replayer"
  out_lacks "audit"
}

# Issue 46: a subscription that receives nothing while the queue's own readers drain it
# holds back the segments only its messages keep: `sub list --json` and `stats --sub` say
# how much; once it drains, nothing.
t_a_stalled_subscription_shows_the_disk_it_holds_back() {
  "$SPOOL" init q --segment-size 16K >/dev/null || fail "init"
  expect 0 "$SPOOL" sub add q stalled
  local body i args=()
  body=$(head -c 1000 /dev/zero | tr '\0' x)
  for i in $(seq 40); do args+=("$body"); done
  expect 0 "$SPOOL" send q "${args[@]}"
  expect 0 "$SPOOL" work q --until-empty -- true
  expect 0 "$SPOOL" sub list q --json
  local held
  held=$(jget held_back_bytes)
  [ "$held" -gt 16000 ] || fail "held back by the stalled subscription: '$held' bytes, expected a segment or more"
  expect 0 "$SPOOL" stats q --sub stalled --json
  eq "stats --sub says the same" "$(jget held_back_bytes)" "$held"
  expect 0 "$SPOOL" stats q
  out_has "subscription   stalled: 40 messages, 0 in flight, 0 expired, holds back"
  expect 0 "$SPOOL" work q --sub stalled --until-empty -- true
  expect 0 "$SPOOL" sub list q --json
  eq "held back once drained" "$(jget held_back_bytes)" 0
}

# A subscription's dead letters (issue 46): listed, redriven and purged with --sub, and a
# redrive goes back to the subscription they died in only; replay --sub likewise.
t_subscriptions_dead_letters_redrive_and_replay_per_subscription() {
  # The queue's own readers have no max_receives; s1 and s2 have theirs (1).
  "$SPOOL" init q >/dev/null || fail "init"
  expect 0 "$SPOOL" sub add q s1 --max-receives 1
  expect 0 "$SPOOL" sub add q s2 --max-receives 1
  expect 0 "$SPOOL" sub list q --json
  eq "s1's own max_receives" "$(jget max_receives)" 1
  expect 0 "$SPOOL" send q poison
  expect 0 "$SPOOL" recv q --sub s1
  expect 0 "$SPOOL" nack q "$(receipt_of)" --sub s1
  expect 2 "$SPOOL" recv q --sub s1
  expect 0 "$SPOOL" dlq q list --sub s1 --json
  eq "s1's dead letters" "$(lines "$D/out")" 1
  eq "s1's dead letter" "$(jget payload)" poison
  expect 0 "$SPOOL" dlq q list --sub s2
  eq "s2's dead letters" "$(lines "$D/out")" 0
  # The queue's own view and s2 take theirs: a redrive must not bring it back to them.
  local v
  expect 0 "$SPOOL" recv q
  expect 0 "$SPOOL" nack q "$(receipt_of)"
  for v in s2 default; do
    if [[ $v == default ]]; then expect 0 "$SPOOL" recv q; else expect 0 "$SPOOL" recv q --sub "$v"; fi
    out_has poison
    if [[ $v == default ]]; then expect 0 "$SPOOL" ack q "$(receipt_of)"; else expect 0 "$SPOOL" ack q "$(receipt_of)" --sub "$v"; fi
  done
  expect 0 "$SPOOL" dlq q redrive --sub s2 --json
  out_has '"redriven":0'
  expect 64 "$SPOOL" dlq q redrive --sub s1 --id 1
  expect 0 "$SPOOL" dlq q redrive --sub s1 --json
  out_has '"redriven":1'
  expect 2 "$SPOOL" recv q --sub s2
  expect 2 "$SPOOL" recv q
  expect 0 "$SPOOL" recv q --sub s1
  out_has poison
  expect 0 "$SPOOL" ack q "$(receipt_of)" --sub s1
  # Replay after ack of s2: s2's ack, back to s2 alone.
  expect 0 "$SPOOL" replay q --sub s2 --since 1h --json
  eq "replayed" "$(jget replayed)" 1
  expect 2 "$SPOOL" recv q --sub s1
  expect 2 "$SPOOL" recv q
  expect 0 "$SPOOL" recv q --sub s2
  out_has poison
  expect 0 "$SPOOL" nack q "$(receipt_of)" --sub s2
  expect 2 "$SPOOL" recv q --sub s2
  expect 0 "$SPOOL" dlq q purge --sub s1 --yes --json
  out_has '"purged":0'
  expect 0 "$SPOOL" dlq q purge --sub s2 --yes --json
  out_has '"purged":1'
  expect 0 "$SPOOL" dlq q list
  eq "dead letters left" "$(lines "$D/out")" 0
}

# Issue 48: an attribute key that is not UTF-8 in a stored record (a send refuses one; the
# test forges one, checksum and all) made recv, peek and show --json abort (nlohmann's
# type_error 316, exit 134), recv after leasing. Each prints valid JSON, the key escaped as
# the "attribute:" lines escape it (k\xff), and the received message can be acked.
t_a_stored_key_that_is_not_utf8_is_escaped_in_json() {
  "$SPOOL" init q >/dev/null && "$SPOOL" send q -a kk=v forged >/dev/null || fail "init, send"
  /usr/bin/python3 "$FORGE_KEY" q 1 kk 'k\xff' || fail "forge_attr_key.py"
  json_has_key() {
    /usr/bin/python3 -c 'import json, sys; sys.exit(json.load(sys.stdin)["attributes"] != {"k\\xff": "v"})' \
      <"$D/out" || fail "$1: not valid JSON with the key escaped (k\\xff): $(cat "$D/out")"
  }
  expect 0 "$SPOOL" peek q --json
  json_has_key "peek --json"
  expect 0 "$SPOOL" show q 1 --json
  json_has_key "show --json"
  expect 0 "$SPOOL" show q 1
  out_has 'attribute: k\xff=v'
  expect 0 "$SPOOL" recv q --json
  json_has_key "recv --json"
  expect 0 "$SPOOL" ack q "$(jget receipt)"
  eq "acked" "$(stat_of acked_total q)" 1
}

TESTS=(
  t_verify_summary_in_words
  t_counts_in_words
  t_parser_errors_in_spools_words
  t_help_and_version
  t_subscriptions_two_services_read_one_stream
  t_a_stalled_subscription_shows_the_disk_it_holds_back
  t_subscriptions_dead_letters_redrive_and_replay_per_subscription
  t_out_of_range_arguments_are_refused
  t_a_stored_key_that_is_not_utf8_is_escaped_in_json
  t_usage_errors_exit_64
  t_bad_durations_exit_64
  t_bad_sizes_exit_64
  t_init
  t_near_empty_queue_is_small_and_segments_grow
  t_not_a_queue_exit_1
  t_send_recv_ack_text
  t_recv_wait_long_poll
  t_empty_spool_io_is_the_default_backend
  t_recv_receipt_on_its_own_line_on_a_terminal
  t_binary_roundtrip_plain
  t_binary_roundtrip_json_base64
  t_send_lines
  t_bracketed_arguments_are_kept
  t_work_options_end_at_the_command
  t_man_page_and_cli_md_name_every_command_and_flag
  t_spool_alone_and_spool_help_list_the_commands
  t_work_verbose_says_why_it_exits_when_idle
  t_help_names_what_flags_take
  t_work_prints_a_summary_and_a_live_line_on_a_terminal
  t_list_says_how_many_were_not_shown
  t_list_pages_with_after_visit_each_message_once
  t_a_new_queue_is_private_by_default
  t_too_large_exit_1
  t_io_errors_exit_1
  t_send_delay
  t_lease_lost_exit_3
  t_bad_receipts_exit_1
  t_nack_and_nack_delay
  t_extend_keeps_hidden
  t_peek
  t_purge
  t_dlq_list_and_redrive
  t_dlq_redrive_some_and_purge
  t_delete_by_id
  t_list_and_show_states
  t_stats_json_fields
  t_stats_shows_holders
  t_stats_recommended_workers
  t_stats_prometheus
  t_stats_ends_on_sigterm_while_it_waits
  t_stats_watch_stops_on_sigint
  t_stats_several_queues_du_and_watch_time
  t_work_1000_exactly_once
  t_work_payload_and_environment
  t_work_failure_nacks_with_backoff
  t_work_renews_lease
  t_work_max_runtime
  t_work_max_runtime_stops_grandchildren
  t_work_until_empty_exits_once_drained
  t_work_max_messages
  t_work_verbose_and_dead_letter_warning
  t_work_dead_letter_keeps_stderr_tail
  t_work_autoscale
  t_work_sigkill_stops_grandchildren
  t_work_sigterm_waits_for_commands
  t_work_ctrl_c_lets_commands_finish
  t_work_second_signal_stops_commands
  t_work_sigkill_loses_nothing
  t_work_sigkill_releases_leases_at_once
  t_backpressure_limits
  t_init_retention_flags
  t_send_batches_fit_max_ready
  t_failed_init_leaves_nothing
  t_spool_dump_usage
  t_send_and_ack_durable
  t_progress_bar_only_on_a_terminal
  t_send_attributes_shown_by_recv_and_peek
  t_send_priority_orders_recv
  t_send_group_orders_recv
  t_send_dedup_id
  t_replay_after_ack
  t_work_errors
  t_failed_open_leaves_directory_untouched
  t_closed_std_fds_never_reach_queue_files
)

run_tests kill_bg
