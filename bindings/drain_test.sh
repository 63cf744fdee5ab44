#!/bin/bash
# A worker of a binding and `spool work` drain one queue together, and the binding's worker
# is killed with SIGKILL in the middle of its work: every message must still be handled, and
# acked exactly once. Run by bindings/go/run_tests.sh and bindings/node/run_tests.sh.
# Usage: drain_test.sh SPOOL_CLI WORKER_CMD [ARGS...]   (the queue directory is appended)
# The worker prints "processing PAYLOAD" before it handles a message and "acked PAYLOAD" once
# its ack succeeded (bindings/go/example/worker, bindings/node/example/worker.js); its leases
# are bound to its process, so the message in hand at the kill is ready again at once.
set -euo pipefail
cli=$1; shift
tmp=$(mktemp -d)
worker=; work=
cleanup() {
  [ -n "$worker" ] && kill -9 "$worker" 2>/dev/null || true
  [ -n "$work" ] && kill -9 "$work" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
q=$tmp/q n=300
"$cli" init "$q" --visibility 60s >/dev/null
seq 1 "$n" | sed 's/^/m/' | "$cli" send "$q" --lines >/dev/null

acks() { grep -c '^acked ' "$tmp/worker.out" || true; }
wait_acks() {  # wait_acks N: until the worker has acked N messages (bounded: 30 s)
  for _ in $(seq 1 300); do
    [ "$(acks)" -ge "$1" ] && return
    kill -0 "$worker" 2>/dev/null || { echo "the worker exited early:"; cat "$tmp/worker.err"; exit 1; }
    sleep 0.1
  done
  echo "the worker acked $(acks) messages in 30 s, not $1"; exit 1
}
: >"$tmp/worker.out"
"$@" "$q" >"$tmp/worker.out" 2>"$tmp/worker.err" &
worker=$!
# spool work joins once the worker is under way (so a slow start cannot leave it nothing);
# its command appends the payload as one line (one command at a time: -j 1).
wait_acks 5
OUT=$tmp/work.out "$cli" work "$q" --until-empty --grace 1s -- sh -c 'cat >>"$OUT"; echo >>"$OUT"' \
  >/dev/null 2>"$tmp/work.err" &
work=$!
# Kill the worker once it has acked 20 messages (it spends 10 ms on each: it is almost
# always holding one then).
wait_acks 20
kill -9 "$worker"; wait "$worker" 2>/dev/null || true; worker=
echo "killed the worker after $(acks) acks"

# spool work drains the rest and exits by itself (--until-empty). The bound, 30 s, is half
# the lease: the message the worker held comes back at once because its lease was bound to
# the dead process, not because the lease ran out.
for _ in $(seq 1 300); do kill -0 "$work" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$work" 2>/dev/null; then echo "spool work did not drain the queue in 30 s"; exit 1; fi
wait "$work"; work=
"$cli" stats "$q" --json >"$tmp/stats.json"

python3 - "$n" "$tmp/worker.out" "$tmp/work.out" "$tmp/stats.json" <<'PY'
import collections, json, sys
n, worker_out, work_out, stats = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
processing, acked = [], collections.Counter()
for line in open(worker_out):
    verb, _, payload = line.rstrip("\n").partition(" ")
    if verb == "processing":
        processing.append(payload)
    elif verb == "acked":
        acked[payload] += 1
by_work = collections.Counter(l.rstrip("\n") for l in open(work_out) if l.strip())
st = json.load(open(stats))
in_hand = [p for p in processing if p not in acked]   # the message held at the kill, if any
handled = acked + by_work
problems = []
if len(in_hand) > 1: problems.append(f"the worker held {in_hand} at once")
for i in range(1, n + 1):
    p = f"m{i}"
    # The message in hand at the kill may have been acked just before the kill (then no one
    # recorded it) or not (then spool work got it again): never both.
    if handled[p] > 1 or (handled[p] == 0 and p not in in_hand):
        problems.append(f"{p}: handled {handled[p]} times (worker acked {acked[p]}, spool work {by_work[p]})")
if st["acked_total"] != n or st["ready"] or st["in_flight"] or st["delayed"]:
    problems.append(f"stats after the drain: {st}")
print(f"worker acked {sum(acked.values())}, spool work handled {sum(by_work.values())}, "
      f"in hand at the kill: {in_hand}")
if problems:
    print("\n".join(problems[:20])); sys.exit(1)
print(f"all {n} messages acked exactly once")
PY
