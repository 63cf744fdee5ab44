#!/usr/bin/env bash
# End-to-end test of `spool pull` (docs/beyond-one-host.md) against a real nats-server with
# JetStream: every test starts its own server on 127.0.0.1 (a free port, a store dir of its
# own), publishes into a work-queue stream with tests/nats_drain.cc, pulls into a local
# queue, kills what the test says, and checks that every message is in the queue exactly
# once and the stream ends empty.
#
#   bash tests/pull_test.sh SPOOL NATS_DRAIN NATS_SERVER
#
# Output is TAP, as tests/forward_test.sh.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/tap.sh"
source "$(dirname "${BASH_SOURCE[0]}")/nats.sh"

nats_test_args pull "$@"

# ---------------------------------------------------------------- helpers

publish() { "$DRAIN" "$URL" JOBS publish jobs "$@" >/dev/null || fail "publish $*"; }
stream_count() { "$DRAIN" "$URL" JOBS count 2>/dev/null || echo -1; }
stream_is() { (($(stream_count) == $1)); }
sent_at_least() { (($(qstat sent_total) >= $1)); }
acked_is() { (($(qstat acked_total) == $1)); }
# ack_pending CONSUMER: the consumer's NumAckPending (delivered, not acked).
ack_pending() { "$DRAIN" "$URL" JOBS consumer "$1" | cut -d' ' -f2; }
consumer_deleted() {
  "$DRAIN" "$URL" JOBS delete-consumer down 2>/dev/null || ! "$DRAIN" "$URL" JOBS consumer down >/dev/null 2>&1
}
deleted_under_pull() {
  grep -q "is gone from stream" "$D/pull.err" && return 0
  "$DRAIN" "$URL" JOBS delete-consumer down 2>/dev/null
  return 1
}
consumer_is() { [[ $("$DRAIN" "$URL" JOBS consumer down 2>/dev/null) == "$1" ]]; }  # "NumPending NumAckPending"
ack_pending_is() { [[ $(ack_pending down 2>/dev/null) == "$1" ]]; }

# pull ARGS...: `spool pull q` from the test's server and stream, stderr in $D/pull.err;
# pull_bg ARGS...: the same in the background, its pid in PULL.
pull() { timeout 60 "$SPOOL" pull q --nats "$URL" --stream JOBS --consumer down "$@" 2>>"$D/pull.err"; }
pull_bg() {
  bg "$SPOOL" pull q --nats "$URL" --stream JOBS --consumer down "$@" 2>>"$D/pull.err"
  PULL=$BGPID
}
# The same, for a test that deletes the consumer or the stream under the pull: libnats leaks
# a status message there now and then (tests/lsan-libnats.supp says which).
pull_bg_through_deletion() {
  LSAN_OPTIONS=${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$(dirname "${BASH_SOURCE[0]}")/lsan-libnats.supp pull_bg "$@"
}

# in_queue_once N: the queue holds exactly N messages, payloads 1..N, each once, each with
# the attributes nats.stream JOBS, nats.subject jobs, Nats-Msg-Id m-PAYLOAD and a nats.seq
# of its own.
in_queue_once() {
  eq "sent into the queue" "$(qstat sent_total)" "$1"
  "$SPOOL" peek q -n "$(($1 + 10))" --json >"$D/peek" || fail "peek"
  eq "messages in the queue" "$(wc -l <"$D/peek")" "$1"
  sed -n 's/.*"payload":"\([0-9]*\)".*/\1/p' "$D/peek" | sort -n >"$D/payloads"
  seq 1 "$1" | cmp -s - "$D/payloads" || fail "payloads are not 1..$1: $(seq 1 "$1" | diff - "$D/payloads" | head -5)"
  eq "distinct stream sequences" "$(grep -o '"nats.seq":"[0-9]*"' "$D/peek" | sort -u | wc -l)" "$1"
  local bad
  bad=$(grep -v '"nats.stream":"JOBS"' "$D/peek" | head -2)
  bad+=$(grep -v '"nats.subject":"jobs"' "$D/peek" | head -2)
  bad+=$(awk -F'"payload":"' '{ split($2, p, "\""); if (index($0, "\"Nats-Msg-Id\":\"m-" p[1] "\"") == 0) print }' "$D/peek" | head -2)
  [[ -z $bad ]] || fail "messages without their attributes: $bad"
}

# ---------------------------------------------------------------- tests

# Issue 27. The first run is SIGKILLed right after its 5th batch is on disk here and before
# that batch is acked to JetStream (a crash point): those 100 are redelivered after AckWait
# and must not be queued again. The second run is killed with kill -9 from outside at some
# moment, the third sees the server stopped and restarted on its store.
t_10000_exactly_once_across_kill_9_and_server_restart() {
  "$SPOOL" init q || fail "init"
  start_server
  publish 1 10000
  eq "in the stream" "$(stream_count)" 10000
  SPOOL_CRASHPOINT=pull.after_sync:5 pull -j 100 --ack-wait 2s
  eq "exit code at the crash point" "$?" 137
  eq "queued before the crash" "$(qstat sent_total)" 500
  grep -q "created consumer down on stream JOBS" "$D/pull.err" || fail "no 'created consumer': $(cat "$D/pull.err")"
  pull_bg -j 100
  wait_for 30 sent_at_least 2500
  kill -KILL "$PULL"
  wait "$PULL" 2>/dev/null
  echo "# kill -9 with $(qstat sent_total) of 10000 queued"
  pull_bg -j 100
  wait_for 30 sent_at_least 6000
  # A clean restart (SIGTERM): after a SIGKILL, nats-server 2.9.10 can keep in a work-queue
  # stream messages its consumer had recorded as acked (docs/beyond-one-host.md).
  kill -TERM "$SERVER"
  wait "$SERVER"
  start_server
  wait_for 60 sent_at_least 10000
  wait_for 30 stream_is 0
  stop "$PULL" "spool pull"
  grep -q "lost the connection" "$D/pull.err" || fail "no warning of the outage: $(cat "$D/pull.err")"
  grep -q "reconnected" "$D/pull.err" || fail "no reconnect line: $(cat "$D/pull.err")"
  echo "# $(grep -c 'pulled' "$D/pull.err") summaries; last: $(grep pulled "$D/pull.err" | tail -1)"
  # The crash point's batch came back and was recognised (by the queue's dedup window). By
  # the line each batch with redeliveries prints: the summaries of the killed pullers are lost.
  local dups
  dups=$(sed -n 's/.*acked \([0-9]*\) redelivered message(s) already in the queue$/\1/p' "$D/pull.err" | awk '{ s += $1 } END { print s + 0 }')
  ((dups >= 100)) || fail "only $dups redelivered messages were recognised: $(cat "$D/pull.err")"
  in_queue_once 10000
  eq "in the stream at the end" "$(stream_count)" 0
}

# Back-pressure: a queue of max_ready 500 takes 500; the puller holds one batch (its AckWait
# renewed, so it is not redelivered) and fetches no more, the rest stays in the stream, and
# nothing is dropped. SIGTERM while waiting returns the batch to the stream at once. Then a
# consumer makes room and everything arrives once.
t_full_queue_holds_the_rest_in_the_stream() {
  "$SPOOL" init q --max-ready 500 || fail "init"
  start_server
  publish 1 2000
  pull_bg -j 100 --ack-wait 2s
  wait_for 20 grep -q "fetching no more" "$D/pull.err"
  # Longer than AckWait: a batch held without renewal would be redelivered meanwhile.
  sleep 3
  # Batches of 100 (fetches are normally full ones): 500 queued, the 6th held.
  local queued held
  queued=$(qstat sent_total)
  held=$(ack_pending down)
  echo "# full: $queued queued, $held held by the puller"
  ((queued <= 500 && queued == $(qstat ready))) || fail "queued $queued, ready $(qstat ready) (max_ready 500)"
  ((held > 0 && held <= 100 && queued + held > 500)) || fail "held $held with $queued queued: not one batch (-j 100) waiting for room"
  # Issue 44: spool top shows the pull's lag, the consumer's pending messages (those not
  # fetched yet), from the status file it writes (q/bridge.PID).
  "$SPOOL" top . --depth 1 --once >"$D/top" || fail "top failed"
  grep -qE "^q .* pull [1-9][0-9]*\$" "$D/top" || fail "top shows no pull lag: $(cat "$D/top")"
  grep -q '"kind":"pull"' "q/bridge.$PULL" || fail "status: $(cat "q/bridge.$PULL")"
  wait_for 10 stream_is $((2000 - queued))
  local start=$SECONDS
  stop "$PULL" "spool pull waiting for room"
  ((SECONDS - start <= 5)) || fail "took $((SECONDS - start)) s to stop"
  grep -q "$held returned to the stream" "$D/pull.err" || fail "summary: $(cat "$D/pull.err")"
  eq "in the stream after SIGTERM" "$(stream_count)" $((2000 - queued))
  pull_bg -j 100 --ack-wait 2s
  # The consumer: receive and ack 250 at a time until all 2000 are through.
  : >"$D/got"
  local round
  for ((round = 0; round < 200; round++)); do
    acked_is 2000 && break
    "$SPOOL" recv q -n 250 --json --wait 2s >"$D/batch" 2>/dev/null || continue
    sed -n 's/.*"payload":"\([0-9]*\)".*/\1/p' "$D/batch" >>"$D/got"
    # shellcheck disable=SC2046
    "$SPOOL" ack q $(sed -n 's/.*"receipt":"\([^"]*\)".*/\1/p' "$D/batch") || fail "ack"
    (($(qstat ready) <= 500)) || fail "the queue holds $(qstat ready) ready, over max_ready 500"
  done
  acked_is 2000 || fail "only $(qstat acked_total) of 2000 acked"
  wait_for 20 stream_is 0
  pull_lag_0() { "$SPOOL" top . --depth 1 --once | grep -qE "^q .* pull 0\$"; }
  wait_for 10 pull_lag_0
  stop "$PULL" "spool pull"
  sort -n "$D/got" | cmp -s - <(seq 1 2000) || fail "received: $(sort -n "$D/got" | diff - <(seq 1 2000) | head -5)"
  eq "sent into the queue" "$(qstat sent_total)" 2000
}

# Headers become attributes: the fixed four first, then the rest by name while they fit in
# 16 pairs; what does not fit is counted, and the message is queued all the same.
t_headers_become_attributes() {
  "$SPOOL" init q || fail "init"
  start_server
  local big i
  big=$(head -c 1500 /dev/zero | tr '\0' x)
  local -a headers=("Big=$big" "bad/key=1")
  for i in $(seq -w 1 18); do headers+=("H$i=v$i"); done
  publish 1 1 "${headers[@]}"
  pull --once || fail "pull --once exited $?: $(cat "$D/pull.err")"
  "$SPOOL" peek q --json >"$D/peek" || fail "peek"
  echo "# $(cat "$D/peek")"
  local attrs
  attrs=$(grep -o '"attributes":{[^}]*}' "$D/peek")
  for want in '"nats.stream":"JOBS"' '"nats.seq":"1"' '"nats.subject":"jobs"' '"Nats-Msg-Id":"m-1"' \
    '"H01":"v01"' '"H11":"v11"' '"nats.headers-dropped":"9"'; do
    [[ $attrs == *"$want"* ]] || fail "no $want in $attrs"
  done
  for lost in '"H12"' '"Big"' '"bad/key"'; do
    [[ $attrs == *"$lost"* ]] && fail "$lost should not fit: $attrs"
  done
  eq "attributes" "$(grep -o '":"' <<<"$attrs" | wc -l)" 16
  grep -q '"payload":"1"' "$D/peek" || fail "payload lost"
  grep -q "header(s) did not fit" "$D/pull.err" || fail "no warning about headers: $(cat "$D/pull.err")"
  eq "in the stream" "$(stream_count)" 0
}

# The server down when pull starts: one warning, then it pulls once the server is up.
t_server_down_at_start() {
  "$SPOOL" init q || fail "init"
  start_server
  publish 1 100
  kill -TERM "$SERVER"
  wait "$SERVER"
  pull_bg
  wait_for 10 grep -q "cannot reach NATS" "$D/pull.err"
  sleep 1
  eq "warnings while unreachable" "$(grep -c "cannot reach" "$D/pull.err")" 1
  start_server
  wait_for 30 sent_at_least 100
  wait_for 10 stream_is 0
  stop "$PULL" "spool pull"
  in_queue_once 100
}

t_errors_are_one_line() {
  "$SPOOL" init q || fail "init"
  start_server
  publish 1 10
  local rc
  "$SPOOL" pull q --nats "$URL" --stream NOPE --consumer c 2>"$D/err"
  eq "exit code without the stream" "$?" 1
  eq "error lines" "$(wc -l <"$D/err")" 1
  grep -q "no stream NOPE" "$D/err" || fail "$(cat "$D/err")"
  "$SPOOL" init q2 --dedup-window 10s || fail "init q2"
  "$SPOOL" pull q2 --nats "$URL" --stream JOBS --consumer c --ack-wait 30s 2>"$D/err"
  eq "exit code for a dedup window shorter than 2 x AckWait" "$?" 1
  grep -q "dedup window (10000 ms) is shorter than twice consumer c's AckWait (30000 ms)" "$D/err" || fail "$(cat "$D/err")"
  "$SPOOL" pull q --nats "$URL" --stream JOBS --consumer c --filter other 2>"$D/err"
  eq "exit code for a consumer with another filter" "$?" 1
  grep -q "consumer c filters nothing, not other" "$D/err" || fail "$(cat "$D/err")"
  "$SPOOL" pull q --nats http://127.0.0.1:1 --stream JOBS --consumer c 2>"$D/err"
  eq "exit code for a bad URL" "$?" 1
  grep -q "bad --nats URL" "$D/err" || fail "$(cat "$D/err")"
  local args
  for args in "-j 0" "--ack-wait 0" "--ack-wait x" "--filter a.b*" "--consumer a.b"; do
    # shellcheck disable=SC2086
    "$SPOOL" pull q --nats "$URL" --stream JOBS --consumer c $args 2>"$D/err"
    eq "exit code for '$args'" "$?" 64
  done
  "$SPOOL" pull nowhere --nats "$URL" --stream JOBS --consumer c 2>"$D/err"
  eq "exit code for a missing queue" "$?" 1
  eq "queued by failed starts" "$(qstat sent_total)" 0
  eq "in the stream after failed starts" "$(stream_count)" 10
}

# Credentials as spool forward takes them; no output and no command line shows the password.
t_credentials_never_shown() {
  local user=puller pw=pw-Qm27-not-for-eyes
  "$SPOOL" init q || fail "init"
  start_server --user "$user" --pass "$pw"
  local auth_url=nats://$user:$pw@127.0.0.1:$PORT
  URL=$auth_url publish 1 100
  pull --once
  eq "exit code without credentials" "$?" 1
  grep -q "Authorization Violation" "$D/pull.err" || fail "$(cat "$D/pull.err")"
  SPOOL_NATS_USER=$user SPOOL_NATS_PASSWORD=$pw pull --once || fail "pull with the environment: $(cat "$D/pull.err")"
  eq "queued" "$(qstat sent_total)" 100
  URL=$auth_url publish 101 200
  bg "$SPOOL" pull q --nats "$auth_url" --stream JOBS --consumer down 2>"$D/url.err" >"$D/url.out"
  PULL=$BGPID
  wait_for 20 sent_at_least 200
  cmdline_lacks "$PULL" "$pw"
  stop "$PULL" "spool pull"
  grep -qF "at nats://***@127.0.0.1:$PORT" "$D/url.err" || fail "URL not shown redacted: $(cat "$D/url.err")"
  no_secret "$pw" "$D/pull.err" "$D/url.err" "$D/url.out"
  in_queue_once 200
  eq "in the stream" "$(URL=$auth_url stream_count)" 0
}

# (once: 20 s at most. The --once before exit code 75 waited for ever for room, and for each
# refused message's 60 s nak delay, again and again.)
once() { timeout 20 "$SPOOL" pull "$@" --nats "$URL" --stream JOBS --consumer down --once --ack-wait 2s; }

# --once takes what fits now and exits; it never waits for room (nobody may make any: a
# script that runs pull --once and then its workers would wait for ever). A queue of
# max_ready 50 and 200 in the stream: exit 75 at once, 50 queued, the batch in hand returned
# to the stream (not held), 150 left there; each run after room is made takes the next 50,
# the last exits 0.
t_once_into_a_full_queue_exits_75() {
  "$SPOOL" init q --max-ready 50 || fail "init"
  start_server
  publish 1 200
  local start=$SECONDS rc round
  once q -j 10 2>>"$D/pull.err"
  rc=$?
  echo "# --once into a full queue: exit $rc after $((SECONDS - start)) s"
  eq "exit code of --once into a full queue" "$rc" 75
  ((SECONDS - start <= 10)) || fail "took $((SECONDS - start)) s"
  eq "queued" "$(qstat ready)" 50
  grep -q -- "--once: stopped, the queue has no room" "$D/pull.err" || fail "no reason given: $(cat "$D/pull.err")"
  grep -q "10 returned to the stream" "$D/pull.err" || fail "summary: $(cat "$D/pull.err")"
  eq "in the stream" "$(stream_count)" 150
  : >"$D/got"
  for ((round = 0; round < 8; round++)); do
    "$SPOOL" recv q -n 50 --json >"$D/batch" 2>/dev/null || fail "recv"
    sed -n 's/.*"payload":"\([0-9]*\)".*/\1/p' "$D/batch" >>"$D/got"
    # shellcheck disable=SC2046
    "$SPOOL" ack q $(sed -n 's/.*"receipt":"\([^"]*\)".*/\1/p' "$D/batch") || fail "ack"
    start=$SECONDS
    once q -j 10 2>>"$D/pull.err"
    rc=$?
    ((SECONDS - start <= 10)) || fail "run $round took $((SECONDS - start)) s"
    [[ $rc == 0 ]] && break
    eq "exit code of run $round" "$rc" 75
  done
  eq "exit code of the last run" "$rc" 0
  eq "runs after the first" "$((round + 1))" 3
  "$SPOOL" recv q -n 50 --json >"$D/batch" 2>/dev/null || fail "recv"
  sed -n 's/.*"payload":"\([0-9]*\)".*/\1/p' "$D/batch" >>"$D/got"
  sort -n "$D/got" | cmp -s - <(seq 1 200) || fail "received: $(sort -n "$D/got" | diff - <(seq 1 200) | head -5)"
  eq "sent into the queue" "$(qstat sent_total)" 200
  eq "in the stream at the end" "$(stream_count)" 0
}

# --once and messages the queue can never take (over its max_payload): exit 1 in moments,
# not after their nak delay; they stay in the stream. A second run soon after waits for their
# delay (5 s with --once), no longer.
t_once_does_not_wait_out_refused_messages() {
  "$SPOOL" init q --max-payload 2 || fail "init"
  start_server
  publish 95 105  # 95..99 fit in 2 bytes, 100..105 do not
  local start=$SECONDS rc
  once q -j 2 2>"$D/once.err"
  rc=$?
  echo "# --once with 6 messages over max_payload: exit $rc after $((SECONDS - start)) s"
  ((SECONDS - start <= 8)) || fail "took $((SECONDS - start)) s: $(cat "$D/once.err")"
  eq "exit code with refused messages" "$rc" 1
  grep -qF -- "--once: 6 messages the queue can never take are left in the stream" "$D/once.err" ||
    fail "no reason given: $(cat "$D/once.err")"
  eq "queued" "$(qstat sent_total)" 5
  eq "left in the stream" "$(stream_count)" 6
  start=$SECONDS
  once q -j 2 2>"$D/once.err"
  rc=$?
  echo "# the run after: exit $rc after $((SECONDS - start)) s"
  ((SECONDS - start <= 15)) || fail "took $((SECONDS - start)) s: $(cat "$D/once.err")"
  eq "exit code of the run after" "$rc" 1
  eq "queued" "$(qstat sent_total)" 5
  eq "left in the stream" "$(stream_count)" 6
}

# "Reconnects for ever" covers the consumer too. The consumer deleted under a running pull
# (as `nats consumer rm` does) while it pulls 1,000: created again as it was, with a line
# saying so, and pulling goes on; a batch whose acks went to the deleted consumer comes again
# and is recognised.
t_consumer_deleted_is_created_again() {
  "$SPOOL" init q || fail "init"
  start_server
  publish 1 1000
  pull_bg_through_deletion -j 10 --ack-wait 2s  # small batches, each synced: the deletion comes mid-way
  wait_for 20 sent_at_least 200
  # (nats-server 2.9 now and then reports a delete done and keeps the consumer: the pull
  # then fetched on from it. Deleted again until the pull says it found it gone.)
  POLL=0.5 wait_for 15 deleted_under_pull
  echo "# consumer deleted with $(qstat sent_total) queued"
  wait_for 15 sent_at_least 1000  # (found out at the first empty fetch: about 1 s)
  wait_for 10 stream_is 0
  stop "$PULL" "spool pull"
  grep -q "consumer down is gone from stream JOBS (deleted?); creating it again" "$D/pull.err" ||
    fail "no line saying so: $(cat "$D/pull.err")"
  grep -q "created consumer down on stream JOBS again, as it was (AckWait 2000 ms)" "$D/pull.err" ||
    fail "no line saying so: $(cat "$D/pull.err")"
  echo "# last: $(tail -1 "$D/pull.err")"
  in_queue_once 1000
}

# On a stream that keeps what was acked (limits retention), the consumer deleted under a
# running pull is created again from its ack floor, not after the last message this process
# acked (which skipped what it had refused, naked below that): the refused messages are
# delivered again, and those already queued are recognised, not queued twice.
t_consumer_deleted_on_a_limits_stream_starts_at_its_ack_floor() {
  "$SPOOL" init q --max-payload 2 || fail "init"
  start_server
  NATS_DRAIN_RETENTION=limits publish 100 105  # sequences 1-6: too large for the queue
  NATS_DRAIN_RETENTION=limits publish 1 9      # sequences 7-15
  pull_bg_through_deletion -j 5 --ack-wait 2s
  wait_for 20 sent_at_least 9
  wait_for 10 ack_pending_is 6  # the six refused, naked with a delay
  # (nats-server 2.9 fails a delete now and then: "unlinkat ...: directory not empty".)
  wait_for 10 consumer_deleted
  wait_for 20 grep -q "created consumer down on stream JOBS again" "$D/pull.err"
  # All 15 delivered again: the 6 refused again (awaiting their nak delay), the 9 acked;
  # with the old start (after the last acked) nothing came: 0 pending, 0 awaiting ack.
  wait_for 20 consumer_is "0 6"
  stop "$PULL" "spool pull"
  eq "sent into the queue" "$(qstat sent_total)" 9
  # Each creation delivers the nine again (a delete that reported failure may have deleted
  # it, and the retry then deletes the one created again): nine per line saying so.
  local again
  again=$(grep -c "created consumer down on stream JOBS again" "$D/pull.err")
  grep -q "($((9 * again)) already in the queue)" "$D/pull.err" ||
    fail "the nine were not recognised on each of $again creations: $(tail -2 "$D/pull.err" | tr '\n' ' ')"
}

# And the stream: deleted and created again under a running pull (its sequences start again
# at 1), pull waits for it, sets the consumer up again, and queues the new stream's messages
# under new dedup ids, none taken for an old one already queued.
t_stream_deleted_and_created_again() {
  "$SPOOL" init q || fail "init"
  start_server
  publish 1 100
  pull_bg_through_deletion -j 10 --ack-wait 2s
  wait_for 20 sent_at_least 100
  "$DRAIN" "$URL" JOBS delete-stream || fail "delete the stream"
  sleep 0.5
  publish 101 200  # creates the stream again: sequences 1..100
  wait_for 20 sent_at_least 200
  wait_for 10 stream_is 0
  stop "$PULL" "spool pull"
  grep -q "stream JOBS is gone" "$D/pull.err" || fail "no line saying so: $(cat "$D/pull.err")"
  grep -q "stream JOBS was created again" "$D/pull.err" || fail "no line saying so: $(cat "$D/pull.err")"
  echo "# last: $(tail -1 "$D/pull.err")"
  "$SPOOL" peek q -n 300 --json >"$D/peek" || fail "peek"
  eq "messages in the queue" "$(wc -l <"$D/peek")" 200
  sed -n 's/.*"payload":"\([0-9]*\)".*/\1/p' "$D/peek" | sort -n | cmp -s - <(seq 1 200) || fail "payloads are not 1..200"
  # The new stream's messages (payloads 101..200) carry its sequences, 1..100.
  local bad
  bad=$(awk '{ match($0, /"nats.seq":"[0-9]*"/); seq = substr($0, RSTART + 12, RLENGTH - 13)
               match($0, /"payload":"[0-9]*"/); p = substr($0, RSTART + 11, RLENGTH - 12)
               if ((p + 0 > 100 ? p - 100 : p + 0) != seq + 0) print }' "$D/peek" | head -3)
  [[ -z $bad ]] || fail "messages with another sequence: $bad"
}

TESTS=(
  t_10000_exactly_once_across_kill_9_and_server_restart
  t_full_queue_holds_the_rest_in_the_stream
  t_once_into_a_full_queue_exits_75
  t_once_does_not_wait_out_refused_messages
  t_consumer_deleted_is_created_again
  t_consumer_deleted_on_a_limits_stream_starts_at_its_ack_floor
  t_stream_deleted_and_created_again
  t_headers_become_attributes
  t_server_down_at_start
  t_errors_are_one_line
  t_credentials_never_shown
)

run_tests kill_bg
