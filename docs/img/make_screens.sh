#!/usr/bin/env bash
# Makes the pictures of docs/operations.md: five queues under a root with some load for a
# minute, then the dashboard (spool serve --http) through headless chromium --screenshot
# into docs/img/dashboard.png, and spool top through tmux capture-pane on stdout (then a
# part of /metrics).
#
#   bash docs/img/make_screens.sh build/tools/spool build/tools/spool-serve
#
# Needs chromium and tmux (scripts/deps.sh --test). Everything runs on 127.0.0.1 and stops
# by itself.
set -euo pipefail
SPOOL=$(realpath "$1")
SERVE=$(realpath "$2")
OUT=$(realpath "$(dirname "$0")")
T=$(mktemp -d /tmp/spool-screens.XXXXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; tmux -S "$T/tmux" kill-server 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
cd "$T"
mkdir -p demo/team
for q in demo/jobs demo/billing demo/team/reports; do "$SPOOL" init "$q" >/dev/null; done
"$SPOOL" init demo/mail --max-receives 2 >/dev/null
"$SPOOL" init demo/team/images --max-ready 350 >/dev/null
seq 1 300 | "$SPOOL" send demo/team/images --lines >/dev/null
"$SPOOL" pause demo/team/images 2>/dev/null
for i in 1 2 3; do "$SPOOL" send demo/team/reports --delay 1h "report $i" >/dev/null; done
# for N SECONDS CMD: CMD in a loop, in the background, for at most N seconds.
loop() {
  local n=$1
  shift
  timeout "$n" bash -c "while :; do $*; done" &
  PIDS+=($!)
}
consume() {  # QUEUE VERB: receive one message and ack or nack it
  echo "\"$SPOOL\" recv $1 >/dev/null 2>r.\$\$ && \"$SPOOL\" $2 $1 \$(sed -n 's/^receipt: //p' r.\$\$)"
}
# jobs: sent faster than it is handled, so it backs up.
loop 150 "seq 1 4 | \"$SPOOL\" send demo/jobs --lines >/dev/null; sleep 0.1"
loop 150 "$(consume demo/jobs ack); sleep 0.08"
# billing: steady.
loop 150 "\"$SPOOL\" send demo/billing invoice >/dev/null; $(consume demo/billing ack); sleep 0.1"
# mail: every delivery fails (nack) and the second one dead-letters it.
loop 150 "\"$SPOOL\" send demo/mail 'to: ops@example.com' >/dev/null; $(consume demo/mail nack); sleep 0.3"
sleep 70
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$SERVE" demo --http 127.0.0.1:$PORT &
PIDS+=($!)
# A minute of samples for the charts.
sleep 40
curl -s "http://127.0.0.1:$PORT/metrics" >"$T/metrics.txt"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$T/profile" \
  --virtual-time-budget=4000 --window-size=1200,740 --screenshot="$OUT/dashboard.png" \
  "http://127.0.0.1:$PORT/dashboard/#queue=jobs" 2>/dev/null
# 128 colours (Debian's python3-pil), a third of the size.
/usr/bin/python3 -c "
from PIL import Image
im = Image.open('$OUT/dashboard.png').convert('RGB')
im.quantize(colors=128, method=Image.Quantize.MAXCOVERAGE, dither=Image.Dither.NONE).save('$OUT/dashboard.png', optimize=True)
" || echo "python3-pil is missing: $OUT/dashboard.png left as chromium wrote it" >&2
tmux -S "$T/tmux" -f /dev/null new-session -d -x 124 -y 30 "TERM=xterm \"$SPOOL\" top demo --interval 500ms"
sleep 2
tmux -S "$T/tmux" send-keys s
sleep 1.5
tmux -S "$T/tmux" capture-pane -p | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}'
echo "--- the detail pane of mail"
tmux -S "$T/tmux" send-keys Down Down Enter
sleep 15  # samples for the sparklines
tmux -S "$T/tmux" capture-pane -p | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}'
echo "--- /metrics"
grep -E '^(# (HELP|TYPE) spool_(messages|sent_total) |spool_messages\{queue="(jobs|mail)"|spool_sent_total)' "$T/metrics.txt"
