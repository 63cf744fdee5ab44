# shellcheck shell=bash
# The harness of the TAP shell tests (cli, users, ops, dash, forward, pull and fuse), which
# source it:
#   source "$(dirname "${BASH_SOURCE[0]}")/tap.sh"
# Not a test itself. Output is TAP: "1..N", then "ok N - name" or "not ok N - name" followed
# by the failed test's log as "# ..." lines.

# abs PATH: PATH made absolute (tests cd into their own directories).
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }

fail() {
  echo "FAIL: $*"
  exit 1
}

# tap_args USAGE ARG...: the test's arguments are paths of executables named by USAGE's
# words (e.g. "PATH_TO_SPOOL_SERVE PATH_TO_SPOOL"), one each; anything else is a usage error.
tap_args() {
  local usage=$1 want a
  shift
  want=$(wc -w <<<"$usage")
  local ok=1
  (($# == want)) || ok=0
  for a in "$@"; do [[ -x $a ]] || ok=0; done
  if ((ok == 0)); then
    echo "usage: $0 $usage" >&2
    exit 2
  fi
}

# tap_root NAME: ROOT, a fresh directory removed at exit (cleanup(), which a test may
# redefine to do more first), in the C locale.
tap_root() {
  export LC_ALL=C
  ROOT=$(mktemp -d "${TMPDIR:-/tmp}/spool-$1-test.XXXXXX")
  cleanup() { rm -rf "$ROOT"; }
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}

# run CMD...: runs it with stdout in $D/out, stderr in $D/err, exit code in RC.
run() {
  "$@" >"$D/out" 2>"$D/err"
  RC=$?
}

# expect CODE CMD...: run, then fail unless the exit code is CODE.
expect() {
  local want=$1
  shift
  run "$@"
  if [[ $RC != "$want" ]]; then
    echo "stdout: $(head -c 2000 "$D/out")"
    echo "stderr: $(head -c 2000 "$D/err")"
    fail "expected exit $want, got $RC from: $*"
  fi
}

# err_has TEXT: fail unless stderr of the last run contains TEXT (fixed string).
err_has() { grep -qF -- "$1" "$D/err" || fail "stderr lacks '$1': $(cat "$D/err")"; }
out_has() { grep -qF -- "$1" "$D/out" || fail "stdout lacks '$1': $(head -c 2000 "$D/out")"; }

# eq WHAT GOT WANT
eq() { [[ $2 == "$3" ]] || fail "$1: got '$2', want '$3'"; }

# wait_for SECONDS COMMAND...: polls every 0.1 s (every $POLL s if set) until COMMAND
# succeeds; fails on timeout.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    ((SECONDS < deadline)) || fail "timed out waiting for: $*"
    sleep "${POLL:-0.1}"
  done
}

# stat_of FIELD QUEUE [ARGS...]: one field of `"$SPOOL" stats QUEUE ARGS... --json` (a number,
# or a string without its quotes); fails the test if stats fails.
stat_of() {
  local out
  out=$("$SPOOL" stats "$2" "${@:3}" --json 2>&1) || fail "spool stats $2 failed: $out"
  sed -n "s/.*\"$1\":\(\"[^\"]*\"\|[^,}]*\).*/\1/p" <<<"$out" | head -n 1 | sed 's/^"\(.*\)"$/\1/'
}

# alive PID: the process exists and is not a zombie.
alive() {
  [[ -e /proc/$1 ]] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null
}

# bg CMD...: starts CMD in the background; its pid is in BGPID and it is killed (SIGKILL) when
# the test ends (run_tests TEARDOWN kill_bg) if still running.
BGPIDS=()
bg() {
  "$@" &
  BGPID=$!
  BGPIDS+=("$BGPID")
}
kill_bg() {
  local p
  for p in "${BGPIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
}

# make_demo_queues: the queues the spool top and dashboard tests show (with $SPOOL, in the
# test's directory): under ./roots, alpha (25 ready), beta (7, 3 of them leased for an hour),
# team/gamma (a message delayed an hour, and a load of a send and an ack every 50 ms, in the
# background: bg), delta (one dead letter: max_receives 1, its lease ran out, received again).
make_demo_queues() {
  mkdir roots
  "$SPOOL" init roots/alpha && "$SPOOL" init roots/beta && mkdir roots/team && "$SPOOL" init roots/team/gamma ||
    fail "init"
  seq 1 25 | "$SPOOL" send roots/alpha --lines >/dev/null || fail "send"
  seq 1 7 | "$SPOOL" send roots/beta --lines >/dev/null || fail "send"
  "$SPOOL" recv roots/beta -n 3 --visibility 1h >/dev/null 2>&1 || fail "recv"
  "$SPOOL" send roots/team/gamma --delay 1h later >/dev/null || fail "send"
  "$SPOOL" init roots/delta --max-receives 1 && "$SPOOL" send roots/delta doomed >/dev/null || fail "delta"
  "$SPOOL" recv roots/delta --visibility 1ms >/dev/null 2>&1 && sleep 0.1 || fail "recv delta"
  "$SPOOL" recv roots/delta >/dev/null 2>&1
  [[ $(stat_of dead roots/delta) == 1 ]] || fail "delta has no dead letter"
  bg bash -c "while :; do \"$SPOOL\" send roots/team/gamma x >/dev/null; \"$SPOOL\" recv roots/team/gamma >/dev/null 2>r && \"$SPOOL\" ack roots/team/gamma \$(sed -n 's/^receipt: //p' r); sleep 0.05; done"
}

# run_tests TEARDOWN: runs the functions named in TESTS (t_NAME, reported as NAME), each in
# its own subshell with its own directory D=$ROOT/N-NAME as working directory, stdin from
# /dev/null and its output in $ROOT/N.log; TEARDOWN runs when the subshell exits, pass or
# fail. A script may define hooks: tap_before_each (in the subshell, before the test),
# tap_after_pass N and tap_after_fail N (after the TAP line). A test that exits 77 is
# reported skipped, with its last line of output as the reason. Exits 0 only if every test
# passed or skipped. TAP_ONLY=REGEX in the environment runs only the tests whose names match it.
run_tests() {
  local teardown=$1 failed=0 n=0 t name start rc
  if [[ -n ${TAP_ONLY:-} ]]; then
    local -a only=()
    for t in "${TESTS[@]}"; do [[ $t =~ $TAP_ONLY ]] && only+=("$t"); done
    TESTS=("${only[@]}")
  fi
  echo "1..${#TESTS[@]}"
  for t in "${TESTS[@]}"; do
    n=$((n + 1))
    name=${t#t_}
    D=$ROOT/$n-$name
    mkdir -p "$D"
    start=$SECONDS
    (
      # shellcheck disable=SC2064
      trap "$teardown" EXIT
      cd "$D" || exit 1
      if declare -F tap_before_each >/dev/null; then tap_before_each; fi
      "$t"
    ) >"$ROOT/$n.log" 2>&1 </dev/null
    rc=$?
    if [[ $rc == 77 ]]; then
      # A test that cannot run on this machine exits 77 after a line saying why.
      echo "ok $n - $name # SKIP $(tail -n 1 "$ROOT/$n.log")"
    elif [[ $rc == 0 ]]; then
      echo "ok $n - $name ($((SECONDS - start))s)"
      if declare -F tap_after_pass >/dev/null; then tap_after_pass "$n"; fi
    else
      failed=$((failed + 1))
      echo "not ok $n - $name"
      sed 's/^/# /' "$ROOT/$n.log"
      if declare -F tap_after_fail >/dev/null; then tap_after_fail "$n"; fi
    fi
  done
  if ((failed > 0)); then
    echo "# $failed of ${#TESTS[@]} tests failed"
    exit 1
  fi
  exit 0
}
