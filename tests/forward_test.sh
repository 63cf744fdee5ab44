#!/usr/bin/env bash
# End-to-end test of `spool forward` (docs/beyond-one-host.md) against a real nats-server
# with JetStream: every test starts its own server on 127.0.0.1 (a free port, a store dir of
# its own), kills it or the forwarder where the test says, and reads the stream back with
# tests/nats_drain.cc to check that every message arrived exactly once.
#
#   bash tests/forward_test.sh SPOOL NATS_DRAIN NATS_SERVER
#
# Output is TAP, as tests/cli_test.sh. Each test runs in a subshell in its own directory;
# the processes it starts are killed when it ends, pass or fail.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/tap.sh"

if [[ $# -ne 3 || ! -x $1 || ! -x $2 || ! -x $3 ]]; then
  echo "usage: $0 PATH_TO_SPOOL PATH_TO_NATS_DRAIN PATH_TO_NATS_SERVER" >&2
  exit 2
fi
SPOOL=$(abs "$1")
DRAIN=$(abs "$2")
NATS_SERVER=$(abs "$3")
export LC_ALL=C

ROOT=$(mktemp -d "${TMPDIR:-/tmp}/spool-forward-test.XXXXXX")
trap 'rm -rf "$ROOT"' EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- helpers

# stop PID WHAT: SIGTERM, then fails unless it exits 0 within 15 s.
stop() {
  kill -TERM "$1" || fail "$2 is not running"
  local i
  for ((i = 0; i < 150; i++)); do
    alive "$1" || break
    sleep 0.1
  done
  wait "$1"
  eq "exit code of $2 after SIGTERM" "$?" 0
}

# The test's server: PORT and URL are chosen once per test, so a restart keeps the address.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }
# free_port: a port in 20000..59999 on which nothing listens (a refused connection).
free_port() {
  local PORT
  while :; do
    PORT=$((20000 + RANDOM % 40000))
    port_open || break
  done
  echo "$PORT"
}
start_server() {
  bg "$NATS_SERVER" -js -a 127.0.0.1 -p "$PORT" -sd "$D/store" -l "$D/nats.log"
  SERVER=$BGPID
  wait_for 10 port_open
}
kill_server() {
  kill -KILL "$SERVER"
  wait "$SERVER" 2>/dev/null
}

# send_range Q FROM TO: sends the numbers FROM..TO, one message each.
send_range() { seq "$2" "$3" | "$SPOOL" send "$1" --lines >/dev/null || fail "send $2..$3"; }

# feed Q N: sends 1..N in batches of 250, ten batches a second, so that a test can break
# things while messages are still arriving.
feed() {
  local i
  for ((i = 0; i < $2; i += 250)); do
    send_range "$1" $((i + 1)) $((i + 250 < $2 ? i + 250 : $2))
    sleep 0.1
  done
}

stream_count() { "$DRAIN" "$URL" JOBS count 2>/dev/null || echo 0; }
count_at_least() { (($(stream_count) >= $1)); }
count_is() { (($(stream_count) == $1)); }
# qstat FIELD [Q]: one field of `spool stats --json`.
qstat() { "$SPOOL" stats "${2:-q}" --json | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }
queue_empty() {
  "$SPOOL" stats q --json >"$D/stats.json" || fail "stats failed"
  grep -q '"delayed":0[,}]' "$D/stats.json" && grep -q '"in_flight":0[,}]' "$D/stats.json" &&
    grep -q '"ready":0[,}]' "$D/stats.json"
}
leased() { (($(qstat in_flight) > 0)); }

# forward ARGS...: `spool forward q` to the test's server and stream, stderr in $D/fwd.err;
# forward_bg ARGS...: the same in the background, its pid in FWD.
forward() { timeout 60 "$SPOOL" forward q --nats "$URL" --subject jobs --stream JOBS "$@" 2>>"$D/fwd.err"; }
forward_bg() {
  bg "$SPOOL" forward q --nats "$URL" --subject jobs --stream JOBS "$@" 2>>"$D/fwd.err"
  FWD=$BGPID
}

# exactly_once N: the stream holds N messages, their Spool-Ids are 1..N with payload = id,
# Nats-Msg-Id <queue uid>-<id>, Spool-Receive-Count set and Spool-Enqueued-At ISO 8601.
# Drains the stream.
exactly_once() {
  eq "messages in the stream" "$(stream_count)" "$1"
  "$DRAIN" "$URL" JOBS drain >"$D/drained" || fail "drain failed"
  eq "messages drained" "$(wc -l <"$D/drained")" "$1"
  cut -d' ' -f1 "$D/drained" | sort -n >"$D/ids"
  seq 1 "$1" | cmp -s - "$D/ids" || fail "Spool-Ids are not 1..$1: $(seq 1 "$1" | diff - "$D/ids" | head -5)"
  local uid bad
  uid=$(sed -n 's/^uid = //p' q/spool.conf)
  bad=$(awk -v uid="$uid" '$5 != $1 || $4 != uid "-" $1 || $2 !~ /^[0-9]+$/' "$D/drained" | head -3)
  bad+=$(cut -d' ' -f3 "$D/drained" | grep -Ev '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$' | head -3)
  [[ -z $bad ]] || fail "bad messages in the stream: $bad"
}

# ---------------------------------------------------------------- tests

t_forward_10000_exactly_once() {
  "$SPOOL" init q || fail "init"
  send_range q 1 10000
  start_server
  forward --once || fail "forward exited $?: $(cat "$D/fwd.err")"
  grep -q "forwarded 10000 messages (0 already" "$D/fwd.err" || fail "summary: $(cat "$D/fwd.err")"
  grep -q "created stream JOBS" "$D/fwd.err" || fail "no 'created stream' line: $(cat "$D/fwd.err")"
  eq "acked locally" "$(qstat acked_total)" 10000
  queue_empty || fail "queue not empty after --once"
  exactly_once 10000
  eq "first deliveries" "$(awk '$2 != 1' "$D/drained" | wc -l)" 0
}

# A resend of messages the stream already has (here: from a copy of the queue, same uid and
# ids, as after a forwarder crash between PubAck and local ack) is dropped by the stream.
t_resend_is_deduplicated() {
  "$SPOOL" init q || fail "init"
  send_range q 1 1000
  cp -a q q2 || fail "copy"
  start_server
  forward --once || fail "forward exited $?"
  timeout 60 "$SPOOL" forward q2 --nats "$URL" --subject jobs --once 2>"$D/fwd2.err" || fail "second forward failed"
  grep -q "forwarded 1000 messages (1000 already in the stream)" "$D/fwd2.err" || fail "summary: $(cat "$D/fwd2.err")"
  exactly_once 1000
}

t_server_killed_and_restarted() {
  "$SPOOL" init q || fail "init"
  start_server
  forward_bg --ack-timeout 2s
  bg feed q 10000
  local feeder=$BGPID
  wait_for 20 count_at_least 500
  # Stopped first, so that PubAcks stop coming and the kill catches a full window of
  # publishes whose fate the forwarder cannot know.
  kill -STOP "$SERVER"
  wait_for 10 leased
  sleep 0.5
  kill_server
  # The queue takes messages while the server is down (the feeder keeps sending).
  local before
  before=$(qstat sent_total)
  sleep 1.5
  (($(qstat sent_total) > before)) || fail "nothing was sent while the server was down"
  start_server
  wait "$feeder" || fail "feeding the queue failed"
  wait_for 60 count_is 10000
  wait_for 20 queue_empty
  stop "$FWD" forwarder
  grep -q "lost the connection" "$D/fwd.err" || fail "no warning of the outage: $(cat "$D/fwd.err")"
  grep -q "reconnected" "$D/fwd.err" || fail "no reconnect line: $(cat "$D/fwd.err")"
  grep -q " 0 publish retries" "$D/fwd.err" && fail "nothing was in flight when the server died: $(cat "$D/fwd.err")"
  exactly_once 10000
}

# Killed with a full window in flight (a backlog is waiting): some messages are in the
# stream but not acked locally, and come back to the next forwarder at once.
t_forwarder_killed_and_restarted() {
  "$SPOOL" init q || fail "init"
  send_range q 1 10000
  start_server
  # A short lease: killed while holding the index lock, its leases are not released at once
  # (the index is rebuilt from the log, which does not know the owner) but run out.
  forward_bg --ack-timeout 2s
  wait_for 20 count_at_least 1
  kill -KILL "$FWD"
  wait "$FWD" 2>/dev/null
  echo "# killed with $(stream_count) of 10000 in the stream"
  # The killed forwarder's leases are back at once (bind_leases), or after 8 s: --once
  # waits for them.
  forward --once || fail "restarted forward exited $?: $(tail -3 "$D/fwd.err")"
  echo "# restarted forwarder: $(grep forwarded "$D/fwd.err" | tail -1)"
  queue_empty || fail "queue not empty"
  exactly_once 10000
}

t_server_down_at_start() {
  "$SPOOL" init q || fail "init"
  send_range q 1 1000
  forward_bg
  wait_for 10 grep -q "cannot reach NATS" "$D/fwd.err"
  send_range q 1001 2000  # the queue is independent of the server
  sleep 1.5
  eq "warnings while unreachable" "$(grep -c "cannot reach" "$D/fwd.err")" 1
  eq "acked before the server was up" "$(qstat acked_total)" 0
  start_server
  wait_for 30 count_is 2000
  wait_for 10 queue_empty
  stop "$FWD" forwarder
  grep -q "forwarded 2000 messages" "$D/fwd.err" || fail "summary: $(cat "$D/fwd.err")"
  exactly_once 2000
}

# SIGTERM while PubAcks do not come (the server is stopped): exits 0 within the bound, and
# every unconfirmed message is back in the queue; they arrive once when forwarded again.
t_sigterm_returns_unconfirmed() {
  "$SPOOL" init q || fail "init"
  start_server
  forward_bg --ack-timeout 3s
  wait_for 10 grep -q "forwarding q" "$D/fwd.err"
  kill -STOP "$SERVER"
  send_range q 1 500
  wait_for 10 leased
  local start=$SECONDS
  stop "$FWD" forwarder
  ((SECONDS - start <= 6)) || fail "took $((SECONDS - start)) s to stop"
  eq "acked" "$(qstat acked_total)" 0
  eq "leased after the stop" "$(qstat in_flight)" 0
  eq "waiting in the queue" $(($(qstat ready) + $(qstat delayed))) 500
  kill -CONT "$SERVER"
  forward --once || fail "forward exited $?"
  exactly_once 500
}

t_errors_are_one_line() {
  "$SPOOL" init q || fail "init"
  send_range q 1 10
  local rc
  "$SPOOL" forward q --nats http://127.0.0.1:1 --subject jobs 2>"$D/err"
  rc=$?
  eq "exit code for a bad URL" "$rc" 1
  eq "error lines" "$(wc -l <"$D/err")" 1
  grep -q "bad --nats URL" "$D/err" || fail "$(cat "$D/err")"
  "$SPOOL" forward q --nats "nats://127.0.0.1:99999" --subject jobs 2>"$D/err"
  eq "exit code for a bad port" "$?" 1
  start_server
  "$SPOOL" forward q --nats "$URL" --subject jobs --once 2>"$D/err"
  eq "exit code without a stream" "$?" 1
  eq "error lines" "$(wc -l <"$D/err")" 1
  grep -q "no JetStream stream captures subject jobs" "$D/err" || fail "$(cat "$D/err")"
  "$SPOOL" forward q --nats "$URL" --subject other --stream OTHER --once 2>/dev/null || fail "create OTHER"
  "$SPOOL" forward q --nats "$URL" --subject jobs --stream OTHER --once 2>"$D/err"
  eq "exit code for a stream without the subject" "$?" 1
  grep -q "stream OTHER does not capture subject jobs" "$D/err" || fail "$(cat "$D/err")"
  "$SPOOL" forward q --nats "$URL" --subject jobs --stream JOBS --once 2>/dev/null || fail "create JOBS"
  "$SPOOL" forward q --nats "$URL" --subject other --stream JOBS --once 2>"$D/err"
  eq "exit code for a subject of another stream" "$?" 1
  grep -q "subject other belongs to stream OTHER, not JOBS" "$D/err" || fail "$(cat "$D/err")"
  "$SPOOL" forward q --nats "$URL" --subject other --stream THIRD --once 2>"$D/err"
  eq "exit code for a stream that cannot be created" "$?" 1
  eq "error lines" "$(wc -l <"$D/err")" 1
  grep -q "cannot create stream THIRD" "$D/err" || fail "$(cat "$D/err")"
  # A server without JetStream.
  local port2
  port2=$(free_port)
  bg "$NATS_SERVER" -a 127.0.0.1 -p "$port2" -l "$D/plain.log"
  PORT=$port2 wait_for 10 port_open
  "$SPOOL" forward q --nats "nats://127.0.0.1:$port2" --subject jobs --once 2>"$D/err"
  eq "exit code without JetStream" "$?" 1
  grep -q "JetStream is not enabled" "$D/err" || fail "$(cat "$D/err")"
  eq "nothing acked by failed starts" "$(qstat acked_total)" 10
  local args
  for args in "--subject a.* " "--subject a -j 0" "--subject a --ack-timeout 0" "--subject a --ack-timeout x"; do
    # shellcheck disable=SC2086
    "$SPOOL" forward q --nats "$URL" $args 2>"$D/err"
    eq "exit code for '$args'" "$?" 64
  done
  "$SPOOL" forward nowhere --nats "$URL" --subject jobs 2>"$D/err"
  eq "exit code for a missing queue" "$?" 1
}

TESTS=(
  t_forward_10000_exactly_once
  t_resend_is_deduplicated
  t_server_killed_and_restarted
  t_forwarder_killed_and_restarted
  t_server_down_at_start
  t_sigterm_returns_unconfirmed
  t_errors_are_one_line
)

# Each test gets its own server address, kept across the restarts it does.
tap_before_each() {
  PORT=$(free_port)
  URL=nats://127.0.0.1:$PORT
}
# A passing test's "# " lines (its figures) are shown too.
tap_after_pass() { grep '^# ' "$ROOT/$1.log"; }
run_tests kill_bg
