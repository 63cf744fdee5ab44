#!/bin/sh
# A shell pipeline on a spool queue: every regular file under SRC becomes a message
# (find | spool send --lines), then `spool work -j 4` checksums them four at a time, each
# command getting one path on stdin; exit 0 acks, anything else retries with backoff.
# When the queue has drained, the workers are stopped with SIGTERM (they finish what they
# are running first) and the results are in OUT.
#
#   sh examples/pipeline.sh [SRC [OUT]]     defaults: SRC=/etc, OUT=./checksums.txt
# SPOOL names the spool binary (default: spool on PATH).
set -eu
SPOOL=${SPOOL:-spool}
src=${1:-/etc}
out=${2:-$PWD/checksums.txt}
: >"$out"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
q=$tmp/q
"$SPOOL" init "$q" --visibility 1m

# One message per path. (A file name with a newline in it would split; use one
# `spool send "$q" "$path"` per file, or NUL-free names, if that matters.)
find "$src" -type f 2>/dev/null | "$SPOOL" send "$q" --lines >/dev/null
sent=$("$SPOOL" stats "$q" --json | sed 's/.*"sent_total":\([0-9]*\).*/\1/')
echo "queued $sent files from $src"

# The command reads the payload (a path) from stdin. OUT is appended to with one write per
# line, so the four commands do not interleave within a line. A file that cannot be read is
# recorded as such and acked (exit 0): retrying would not help, and a non-zero exit would
# retry it with backoff until it is dead-lettered.
export OUT="$out"
"$SPOOL" work "$q" -j 4 -- sh -c 'f=$(cat); s=$(cksum <"$f" 2>/dev/null) || s=unreadable; printf "%s %s\n" "$s" "$f" >>"$OUT"' &
worker=$!

# Wait until nothing is ready, delayed or in flight, then stop the workers.
while :; do
  st=$("$SPOOL" stats "$q" --json)
  left=0
  for k in ready in_flight delayed; do
    n=$(printf '%s' "$st" | sed "s/.*\"$k\":\([0-9]*\).*/\1/")
    left=$((left + n))
  done
  [ "$left" = 0 ] && break
  sleep 0.2
done
kill -TERM "$worker"
wait "$worker"

"$SPOOL" stats "$q"
echo "checksummed $(wc -l <"$out") files into $out"
