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
source "$(dirname "${BASH_SOURCE[0]}")/nats.sh"

nats_test_args forward "$@"

# ---------------------------------------------------------------- helpers

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

# Issue 43: a message's attributes travel as headers of the same names (a value with a
# control byte base64, under Spool-B64-KEY), and spool pull makes attributes of them again.
t_attributes_survive_forward_then_pull() {
  "$SPOOL" init q && "$SPOOL" init p || fail "init"
  start_server
  "$SPOOL" send q -a trace=7f3a -a tenant=acme -a "multi=line one"$'\n'"line two" hello >/dev/null || fail "send"
  forward --once || fail "forward --once: $(cat "$D/fwd.err")"
  timeout 60 "$SPOOL" pull p --nats "$URL" --stream JOBS --consumer down --once 2>"$D/pull.err" ||
    fail "pull --once: $(cat "$D/pull.err")"
  "$SPOOL" recv p --json >"$D/got" || fail "recv"
  grep -q '"payload":"hello"' "$D/got" || fail "payload: $(cat "$D/got")"
  local want
  for want in '"trace":"7f3a"' '"tenant":"acme"' '"multi":"line one\nline two"' '"Spool-Id":"1"'; do
    grep -qF "$want" "$D/got" || fail "attribute $want did not arrive: $(cat "$D/got")"
  done
  grep -q 'Spool-B64' "$D/got" && fail "the base64 header arrived as is: $(cat "$D/got")"
  return 0
}

# Issue 43: forward --once with the server out of reach gives up after --give-up (it waited
# for ever), with an error, and the messages stay in the queue.
t_once_gives_up_when_unreachable() {
  "$SPOOL" init q || fail "init"
  send_range q 1 10
  local start=$SECONDS
  timeout 30 "$SPOOL" forward q --nats "nats://127.0.0.1:$PORT" --subject jobs --stream JOBS --once --give-up 2s \
    2>"$D/fwd.err"
  eq "exit code" "$?" 1
  ((SECONDS - start <= 6)) || fail "gave up after $((SECONDS - start)) s"
  grep -q "giving up after 2s (--give-up)" "$D/fwd.err" || fail "no error: $(cat "$D/fwd.err")"
  eq "still ready" "$(qstat ready)" 10
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

# Issue 44: a running forwarder writes q/bridge.PID about once a second, which spool top
# shows as the queue's BRIDGE LAG (messages not yet forwarded): 0, then 500 while the
# server is stopped, then 0 again; gone when the forwarder stops, ignored once it is killed.
t_top_shows_bridge_lag() {
  "$SPOOL" init q || fail "init"
  start_server
  forward_bg --ack-timeout 2s
  wait_for 10 grep -q "forwarding q" "$D/fwd.err"
  lag_is() {
    "$SPOOL" top . --depth 1 --once >"$D/top" || fail "top failed"
    grep -qE "^q .* $1\$" "$D/top"
  }
  wait_for 10 lag_is "fwd 0"
  kill -STOP "$SERVER"
  send_range q 1 500
  wait_for 10 lag_is "fwd 500"
  grep -q '"kind":"forward".*"moved":0,' "q/bridge.$FWD" || fail "status: $(cat "q/bridge.$FWD")"
  kill -CONT "$SERVER"
  wait_for 30 lag_is "fwd 0"
  wait_for 10 grep -q '"moved":500,' "q/bridge.$FWD"
  grep -q "\"pid\":$FWD," "q/bridge.$FWD" || fail "status: $(cat "q/bridge.$FWD")"
  stop "$FWD" forwarder
  [[ -e q/bridge.$FWD ]] && fail "the status file outlived the forwarder"
  lag_is "-" || fail "top: $(cat "$D/top")"
  forward_bg
  wait_for 10 lag_is "fwd 0"
  kill -KILL "$FWD"
  wait "$FWD" 2>/dev/null
  [[ -e q/bridge.$FWD ]] || fail "no status file left by the killed forwarder"
  lag_is "-" || fail "top shows a killed forwarder: $(cat "$D/top")"
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

# fwd ARGS...: spool forward q --subject jobs --stream JOBS ARGS... (--nats among them),
# stdout in $D/fwd.out, stderr in $D/fwd.err (both kept, for no_secret), exit code in RC.
fwd() {
  echo "--- spool forward $*" >>"$D/fwd.cmds"
  timeout 60 "$SPOOL" forward q --subject jobs --stream JOBS "$@" >>"$D/fwd.out" 2>"$D/last.err"
  RC=$?
  cat "$D/last.err" >>"$D/fwd.err"
}
last_err_has() { grep -qF -- "$1" "$D/last.err" || fail "stderr lacks '$1': $(cat "$D/last.err")"; }

# Issue 23: credentials were possible only in the URL, so they showed in ps and on stderr.
# A server with a user and password: the forwarder gets the password from a file or from the
# environment, and no output of it, nor its command line, ever shows the password; a URL
# with credentials is shown redacted.
t_credentials_by_file_and_environment_never_shown() {
  local user=spooler pw=pw-9f3Kq7-not-for-eyes
  "$SPOOL" init q || fail "init"
  start_server --user "$user" --pass "$pw"
  local auth_url=nats://$user:$pw@127.0.0.1:$PORT  # for nats_drain only
  send_range q 1 100
  # No credentials: refused at once (not retried for ever), saying what to check.
  fwd --nats "$URL" --once
  eq "exit code without credentials" "$RC" 1
  last_err_has "Authorization Violation"
  last_err_has "check the credentials"
  # A file of USER:PASSWORD.
  printf '%s:%s\n' "$user" "$pw" >creds
  chmod 644 creds
  fwd --nats "$URL" --once --creds-file creds
  eq "exit code for a world-readable --creds-file" "$RC" 1
  last_err_has "chmod 600 creds"
  chmod 600 creds
  fwd --nats "$URL" --once --creds-file creds
  eq "exit code with --creds-file (stderr: $(cat "$D/last.err"))" "$RC" 0
  last_err_has "forwarded 100 messages"
  eq "in the stream after --creds-file" "$(URL=$auth_url stream_count)" 100
  # The environment, with the forwarder running (so its command line can be read).
  send_range q 101 200
  bg env SPOOL_NATS_USER="$user" SPOOL_NATS_PASSWORD="$pw" \
    "$SPOOL" forward q --nats "$URL" --subject jobs --stream JOBS 2>"$D/env.err" >"$D/env.out"
  FWD=$BGPID
  URL=$auth_url wait_for 20 count_is 200
  cmdline_lacks "$FWD" "$pw"
  stop "$FWD" forwarder
  grep -q "forwarded 100 messages" "$D/env.err" || fail "env forwarder: $(cat "$D/env.err")"
  # A wrong password is refused, and not printed either.
  SPOOL_NATS_USER=$user SPOOL_NATS_PASSWORD=wrong-pw-Zx81 fwd --nats "$URL" --once
  eq "exit code for a wrong password" "$RC" 1
  last_err_has "Authorization Violation"
  no_secret wrong-pw-Zx81 "$D/last.err"
  # Credentials in the URL still work, with a warning; the URL is shown as nats://***@.
  send_range q 201 300
  bg "$SPOOL" forward q --nats "$auth_url" --subject jobs --stream JOBS 2>"$D/url.err" >"$D/url.out"
  FWD=$BGPID
  URL=$auth_url wait_for 20 count_is 300
  wait_for 10 grep -q "forwarding q" "$D/url.err"
  cmdline_lacks "$FWD" "$pw"
  stop "$FWD" forwarder
  grep -qF "at nats://***@127.0.0.1:$PORT" "$D/url.err" || fail "URL not shown redacted: $(cat "$D/url.err")"
  grep -q "can be seen by other users" "$D/url.err" || fail "no warning about a URL password: $(cat "$D/url.err")"
  # A URL with credentials that cannot be reached is redacted in the warning too.
  bg "$SPOOL" forward q --nats "nats://$user:$pw@127.0.0.1:1" --subject jobs 2>"$D/unreach.err" >"$D/unreach.out"
  FWD=$BGPID
  wait_for 10 grep -q "cannot reach NATS" "$D/unreach.err"
  cmdline_lacks "$FWD" "$pw"
  stop "$FWD" "forwarder to an unreachable server"
  grep -qF "cannot reach NATS at nats://***@127.0.0.1:1 " "$D/unreach.err" ||
    fail "unreachable URL not redacted: $(cat "$D/unreach.err")"
  # Two ways at once is a usage error naming both; half a pair in the environment too.
  SPOOL_NATS_PASSWORD=$pw fwd --nats "$URL" --once --creds-file creds
  eq "exit code for --creds-file and the environment" "$RC" 64
  last_err_has "credentials given two ways (--creds-file and SPOOL_NATS_USER/SPOOL_NATS_PASSWORD)"
  SPOOL_NATS_PASSWORD=$pw fwd --nats "$URL" --once
  eq "exit code for a password without a user" "$RC" 64
  last_err_has "SPOOL_NATS_USER is not"
  fwd --nats "$auth_url" --once --creds-file creds
  eq "exit code for --creds-file and a URL with credentials" "$RC" 64
  # Bad files.
  : >empty
  chmod 600 empty
  fwd --nats "$URL" --once --creds-file empty
  eq "exit code for an empty --creds-file" "$RC" 1
  last_err_has "empty"
  printf 'a:b\nc:d\n' >twolines
  printf -- '-----BEGIN NATS USER JWT-----\neyJ0eXAi\n------END NATS USER JWT------\n' >user.creds
  printf ':%s\n' "$pw" >nouser
  chmod 600 twolines user.creds nouser
  fwd --nats "$URL" --once --creds-file twolines
  eq "exit code for a --creds-file of two lines" "$RC" 1
  last_err_has "more than one line"
  fwd --nats "$URL" --once --creds-file user.creds
  eq "exit code for a NATS .creds file" "$RC" 1
  last_err_has "a NATS .creds file"
  fwd --nats "$URL" --once --creds-file nouser
  eq "exit code for a --creds-file without a user" "$RC" 1
  last_err_has "no user name before the ':'"
  fwd --nats "$URL" --once --creds-file nowhere
  eq "exit code for a missing --creds-file" "$RC" 64
  last_err_has "nowhere"
  no_secret "$pw" "$D/fwd.err" "$D/fwd.out" "$D/env.err" "$D/env.out" "$D/url.err" "$D/url.out" \
    "$D/unreach.err" "$D/unreach.out"
  URL=$auth_url exactly_once 300
}

# A token server: SPOOL_NATS_TOKEN, and a --creds-file holding a token.
t_token_by_environment_and_file() {
  local token=tok-Aq93-never-printed
  "$SPOOL" init q || fail "init"
  start_server --auth "$token"
  local auth_url=nats://$token@127.0.0.1:$PORT
  send_range q 1 50
  SPOOL_NATS_TOKEN=$token fwd --nats "$URL" --once
  eq "exit code with SPOOL_NATS_TOKEN (stderr: $(cat "$D/last.err"))" "$RC" 0
  send_range q 51 100
  printf '%s\n' "$token" >tokfile
  chmod 600 tokfile
  fwd --nats "$URL" --once --creds-file tokfile
  eq "exit code with a token file (stderr: $(cat "$D/last.err"))" "$RC" 0
  fwd --nats "$auth_url" --once
  eq "exit code with the token in the URL" "$RC" 0
  grep -qF "nats://***@127.0.0.1:$PORT" "$D/fwd.err" || fail "token URL not redacted: $(cat "$D/fwd.err")"
  SPOOL_NATS_TOKEN=wrong-tok-7Hh fwd --nats "$URL" --once
  eq "exit code for a wrong token" "$RC" 1
  no_secret "$token" "$D/fwd.err" "$D/fwd.out"
  no_secret wrong-tok-7Hh "$D/fwd.err" "$D/fwd.out"
  URL=$auth_url exactly_once 100
}

# make_cert NAME EXTENSIONS: NAME.pem and NAME.key, signed by ca.pem (EC P-256, 2 days).
make_cert() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=spool-test-$1" \
    -keyout "$1.key" -out "$1.csr" 2>>"$D/openssl.err" || fail "openssl req $1: $(cat "$D/openssl.err")"
  printf '%s\n' "$2" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out "$1.pem" \
    -extfile "$1.ext" 2>>"$D/openssl.err" || fail "openssl x509 $1: $(cat "$D/openssl.err")"
}

# TLS with a CA of the test's own, and a server that verifies client certificates: the
# forwarder needs --tls-ca for the server and --tls-cert/--tls-key for itself.
t_tls_ca_and_client_certificate() {
  if ! command -v openssl >/dev/null; then
    echo "# SKIP: TLS NOT TESTED: openssl is not installed (scripts/deps.sh --test installs it)"
    return 0
  fi
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=spool-test-ca \
    -days 2 -keyout ca.key -out ca.pem 2>>"$D/openssl.err" || fail "openssl CA: $(cat "$D/openssl.err")"
  make_cert server $'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth'
  make_cert client 'extendedKeyUsage=clientAuth'
  "$SPOOL" init q || fail "init"
  send_range q 1 200
  start_server --tls --tlscert server.pem --tlskey server.key --tlsverify --tlscacert ca.pem
  fwd --nats "$URL" --once
  eq "exit code without --tls-ca" "$RC" 1
  last_err_has "--tls-ca"
  fwd --nats "$URL" --once --tls-ca ca.pem
  eq "exit code without a client certificate" "$RC" 1
  last_err_has "client certificate"
  fwd --nats "$URL" --once --tls-ca ca.pem --tls-cert client.pem
  eq "exit code for --tls-cert without --tls-key" "$RC" 64
  last_err_has "--tls-cert requires --tls-key"
  fwd --nats "$URL" --once --tls-ca missing.pem
  eq "exit code for a missing --tls-ca" "$RC" 64
  last_err_has "missing.pem"
  fwd --nats "$URL" --once --tls-ca client.key
  eq "exit code for a --tls-ca that is no certificate" "$RC" 1
  last_err_has "cannot load --tls-ca client.key"
  # The server's name is checked too: a certificate for another host is refused.
  make_cert other 'subjectAltName=DNS:other.example'
  local port=$PORT
  PORT=$(free_port)
  bg "$NATS_SERVER" -js -a 127.0.0.1 -p "$PORT" -sd "$D/store2" -l "$D/nats2.log" --tls --tlscert other.pem --tlskey other.key
  wait_for 10 port_open
  fwd --nats "nats://127.0.0.1:$PORT" --once --tls-ca ca.pem
  eq "exit code for a certificate of another host" "$RC" 1
  last_err_has "IP address mismatch"
  PORT=$port
  eq "acked before TLS was right" "$(qstat acked_total)" 0
  fwd --nats "$URL" --once --tls-ca ca.pem --tls-cert client.pem --tls-key client.key
  eq "exit code with TLS (stderr: $(cat "$D/last.err"))" "$RC" 0
  last_err_has "forwarded 200 messages"
  # Acked locally only once JetStream confirmed each (nats_drain speaks no TLS).
  eq "acked over TLS" "$(qstat acked_total)" 200
  queue_empty || fail "queue not empty after --once over TLS"
}

TESTS=(
  t_attributes_survive_forward_then_pull
  t_once_gives_up_when_unreachable
  t_forward_10000_exactly_once
  t_resend_is_deduplicated
  t_server_killed_and_restarted
  t_forwarder_killed_and_restarted
  t_server_down_at_start
  t_sigterm_returns_unconfirmed
  t_top_shows_bridge_lag
  t_errors_are_one_line
  t_credentials_by_file_and_environment_never_shown
  t_token_by_environment_and_file
  t_tls_ca_and_client_certificate
)

run_tests kill_bg
