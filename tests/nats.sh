# shellcheck shell=bash
# What the NATS tests (forward_test.sh, pull_test.sh) share, sourced after tap.sh: a
# nats-server of the test's own on 127.0.0.1 (NATS_SERVER, D, and PORT/URL chosen per test by
# the tap_before_each hook below), stopping a process, and reading `spool stats`.
# Not a test itself.

# nats_test_args NAME SPOOL NATS_DRAIN NATS_SERVER: checks and sets SPOOL, DRAIN and
# NATS_SERVER (absolute), and ROOT, a scratch directory removed at exit.
nats_test_args() {
  local name=$1
  shift
  if [[ $# -ne 3 || ! -x $1 || ! -x $2 || ! -x $3 ]]; then
    echo "usage: $0 PATH_TO_SPOOL PATH_TO_NATS_DRAIN PATH_TO_NATS_SERVER" >&2
    exit 2
  fi
  SPOOL=$(abs "$1")
  DRAIN=$(abs "$2")
  NATS_SERVER=$(abs "$3")
  export LC_ALL=C
  ROOT=$(mktemp -d "${TMPDIR:-/tmp}/spool-$name-test.XXXXXX")
  trap 'rm -rf "$ROOT"' EXIT
  trap 'exit 130' INT TERM
}

# stop PID WHAT: SIGTERM, then fails unless it exits 0 within 15 s.
stop() {
  if ! kill -TERM "$1" 2>/dev/null; then
    wait "$1"
    fail "$2 is not running (it exited with $?); the end of the test's stderr files: $(tail -n 5 "$D"/*.err 2>/dev/null)"
  fi
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
# start_server [OPTIONS...]: with further nats-server options (auth, TLS) if given.
start_server() {
  bg "$NATS_SERVER" -js -a 127.0.0.1 -p "$PORT" -sd "$D/store" -l "$D/nats.log" "$@"
  SERVER=$BGPID
  wait_for 10 port_open
}
kill_server() {
  kill -KILL "$SERVER"
  wait "$SERVER" 2>/dev/null
}

# qstat FIELD [Q]: one field of `spool stats --json`.
qstat() { stat_of "$1" "${2:-q}"; }
# no_secret SECRET FILE...: none of the files holds SECRET.
no_secret() {
  local secret=$1 f
  shift
  for f in "$@"; do
    [[ -e $f ]] || continue
    grep -qF -- "$secret" "$f" && fail "$f shows the secret: $(cat "$f")"
  done
  return 0
}
# cmdline_lacks PID SECRET: /proc/PID/cmdline (what ps shows) does not hold SECRET.
cmdline_lacks() {
  tr '\0' ' ' <"/proc/$1/cmdline" >"$D/cmdline" || fail "no /proc/$1/cmdline"
  echo "# cmdline: $(cat "$D/cmdline")"
  no_secret "$2" "$D/cmdline"
}
# Each test gets its own server address, kept across the restarts it does.
tap_before_each() {
  PORT=$(free_port)
  URL=nats://127.0.0.1:$PORT
}
# A passing test's "# " lines (its figures) are shown too.
tap_after_pass() { grep '^# ' "$ROOT/$1.log"; }
