#!/usr/bin/env bash
# The dashboard of `spool serve --http` (docs/operations.md, "The dashboard") with real
# processes: spool-serve on a free 127.0.0.1 port over a root of several queues (one under a
# load of sends and acks), its JSON API and /metrics checked against `spool stats`, its
# actions refused without the token and done with it, the SQS face beside it on the same
# address, and the page in a real browser (Debian's chromium, headless): --dump-dom after the
# page's script ran must show the queues and their numbers, and --screenshot draws it.
#
#   bash tests/dash_test.sh build/tools/spool-serve build/tools/spool
#
# Output is TAP (tests/tap.sh). The browser test skips (exit 77, saying why) only where
# chromium is missing or cannot start. SPOOL_DASH_IMG=DIR keeps the screenshots there (the
# images of docs/operations.md are made so).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/tap.sh"

tap_args "PATH_TO_SPOOL_SERVE PATH_TO_SPOOL" "$@"
SERVE=$(abs "$1")
SPOOL=$(abs "$2")
for tool in curl python3; do
  command -v $tool >/dev/null || { echo "1..0 # SKIP $tool is not installed (scripts/deps.sh --test installs it)"; exit 0; }
done
tap_root dash

TOKEN=dash-test-token-0123456789abcdef

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# serve ARGS...: starts spool-serve roots ARGS in the background and waits until it answers
# on $PORT; URL is http://127.0.0.1:$PORT.
serve() {
  PORT=$(free_port)
  URL=http://127.0.0.1:$PORT
  bg "$SERVE" roots "$@" --http 127.0.0.1:$PORT
  SERVER=$BGPID
  local i
  for i in $(seq 100); do
    curl -s -o /dev/null "$URL/metrics" && return 0
    alive $SERVER || fail "spool-serve exited"
    sleep 0.05
  done
  fail "spool-serve does not answer on $URL"
}

# field JSON_FILE PYTHON_EXPR: the expression over the parsed file as d (q(NAME): the queue
# NAME of a /api/v1/queues answer), printed.
field() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
q = lambda n: next(x for x in d["queues"] if x["name"] == n)
v = eval(sys.argv[2])
print(json.dumps(v) if isinstance(v, (dict, list, bool)) or v is None else v)
EOF
}

# The list of queues: every queue under the root, with what `spool stats` says of it.
t_json_api_matches_stats() {
  make_demo_queues
  # A queue with --max-ready 200 and 199 waiting has 0.5% of that limit left: its tightest.
  "$SPOOL" init roots/capped --max-ready 200 && seq 1 199 | "$SPOOL" send roots/capped --lines >/dev/null || fail "capped"
  serve
  # Refreshes (1 s apart) while gamma's load sends at least twice: its rates.
  curl -sf "$URL/api/v1/queues" >q.json || fail "GET /api/v1/queues"
  local sent0
  sent0=$(field q.json "q('team/gamma')['sent_total']")
  sleep 2.5
  wait_for 20 eval "curl -sf \"\$URL/api/v1/queues\" >q.json && (( \$(field q.json \"q('team/gamma')['sent_total']\") >= sent0 + 2 ))"
  eq "queues" "$(field q.json '[x["name"] for x in d["queues"]]')" '["alpha", "beta", "capped", "delta", "team/gamma"]'
  eq "actions without a token" "$(field q.json 'd["actions"]')" false
  local name
  for name in alpha beta delta; do
    "$SPOOL" stats "roots/$name" --json >s.json || fail "spool stats roots/$name"
    python3 - q.json s.json "$name" <<'EOF' || fail "$name: the API and spool stats differ"
import json, sys
api = next(x for x in json.load(open(sys.argv[1]))["queues"] if x["name"] == sys.argv[3])
st = json.load(open(sys.argv[2]))
keys = ["ready", "in_flight", "delayed", "blocked", "dead", "paused", "sent_total", "acked_total",
        "nacked_total", "dead_lettered_total", "expired_total", "bytes", "disk_bytes"]
diff = {k: (api.get(k), st[k]) for k in keys if api.get(k) != st[k]}
print(f"differ (api, stats): {diff}" if diff else "same")
sys.exit(1 if diff else 0)
EOF
  done
  eq "beta in flight" "$(field q.json "q('beta')['in_flight']")" 3
  eq "gamma delayed" "$(field q.json "q('team/gamma')['delayed']")" 1
  # gamma's send rate: a send every 50 ms plus the spool calls around it (slower under a
  # sanitizer), seen in some refresh; the idle queues' are 0.
  python3 -c "import sys; h=[float(x) for x in sys.argv[1].strip('[]').split(',')]; sys.exit(0 if len(h) >= 2 and 0 < max(h) <= 30 else 1)" \
    "$(field q.json "q('team/gamma')['history']['send']")" || fail "gamma's send rates: $(field q.json "q('team/gamma')['history']")"
  eq "alpha's rates" "$(field q.json "q('alpha')['rates']")" '{"ack": 0.0, "dead_lettered": 0.0, "expired": 0.0, "nack": 0.0, "receive": 0.0, "redeliver": 0.0, "send": 0.0}'
  # Headroom: the filesystem's free space as df sees it (within 1 GiB: others write too).
  local free
  free=$(df -B1 --output=avail roots | tail -1 | tr -d ' ')
  python3 -c "import sys; sys.exit(0 if abs(int(sys.argv[1]) - int(sys.argv[2])) < 1 << 30 else 1)" \
    "$(field q.json "q('alpha')['headroom']['fs_free']")" "$free" || fail "fs_free: $(field q.json "q('alpha')['headroom']") vs df $free"
  eq "tightest" "$(field q.json "q('alpha')['headroom']['tightest']")" fs
  eq "capped room" "$(field q.json "(q('capped')['headroom']['tightest'], q('capped')['headroom']['ready_left'])")" "('ready', 1)"
  # One queue's detail; an unknown one is a 404.
  curl -sf "$URL/api/v1/queue?name=beta" >b.json || fail "GET /api/v1/queue?name=beta"
  eq "beta leases" "$(field b.json 'len(d["leases"])')" 3
  eq "beta detail ready" "$(field b.json 'd["stats"]["ready"]')" 4
  eq "beta visibility" "$(field b.json 'd["options"]["visibility_ms"]')" 30000
  [[ $(curl -s -o /dev/null -w '%{http_code}' "$URL/api/v1/queue?name=nope") == 404 ]] || fail "unknown queue is not 404"
  # A page of another site that resolves its own name to 127.0.0.1 is refused.
  [[ $(curl -s -o /dev/null -w '%{http_code}' -H "Host: evil.example:$PORT" "$URL/api/v1/queues") == 403 ]] ||
    fail "a foreign Host header was served"
}

# /metrics: every queue's series with a queue label, the one-queue lines of `spool stats
# --prometheus` among them, each family's HELP and TYPE once.
t_metrics_match_stats_prometheus() {
  make_demo_queues
  serve
  curl -sf "$URL/metrics" >metrics.txt || fail "GET /metrics"
  local name
  for name in alpha beta delta; do
    "$SPOOL" stats "roots/$name" --prometheus >one.txt || fail "stats --prometheus"
    # The same series, labelled with the name under the root instead of the path (the age of
    # the oldest message moves on between the two reads).
    # (spool_pinned_removed_bytes is spool stats' own: it reads /proc, which /metrics does not
    # scan for every queue at every scrape; docs/operations.md.)
    sed "s|queue=\"roots/$name\"|queue=\"$name\"|" one.txt |
      grep -v -e '^spool_oldest_ready_age_seconds' -e 'spool_pinned_removed_bytes' | while read -r line; do
      grep -qxF -- "$line" metrics.txt || { echo "missing: $line"; exit 1; }
    done || fail "/metrics lacks lines of spool stats roots/$name --prometheus"
  done
  grep -qx 'spool_messages{queue="team/gamma",state="delayed"} 1' metrics.txt || fail "gamma's delayed series"
  grep -qx 'spool_messages{queue="beta",state="in_flight"} 3' metrics.txt || fail "beta's in-flight series"
  local dup
  dup=$(grep '^# TYPE' metrics.txt | sort | uniq -d)
  [[ -z $dup ]] || fail "TYPE lines repeated: $dup"
  [[ $(grep -c '^spool_sent_total{' metrics.txt) == 4 ]] || fail "spool_sent_total for 4 queues: $(grep '^spool_sent_total' metrics.txt)"
}

# Actions: refused read-only, refused without the token, with a wrong one or from another
# site, done with it.
t_actions_need_the_token() {
  make_demo_queues
  # eps: a dead letter to redrive.
  "$SPOOL" init roots/eps --max-receives 1 && "$SPOOL" send roots/eps x >/dev/null &&
    "$SPOOL" recv roots/eps --visibility 1ms >/dev/null 2>&1 && sleep 0.1 && "$SPOOL" recv roots/eps >/dev/null 2>&1
  [[ $(stat_of dead roots/eps) == 1 ]] || fail "eps has no dead letter"
  serve
  local ro=$URL code
  code=$(curl -s -o out.json -w '%{http_code}' -H 'Content-Type: application/json' -H "Authorization: Bearer $TOKEN" \
    -d '{"name":"alpha"}' "$ro/api/v1/queue/pause")
  [[ $code == 403 ]] && grep -q read-only out.json || fail "read-only pause: $code $(cat out.json)"
  kill $SERVER
  printf '%s\n' "$TOKEN" >token
  serve --token-file token
  curl -sf "$URL/api/v1/queues" >q.json && eq "actions" "$(field q.json 'd["actions"]')" true
  post() {  # ACTION BODY [curl args]: HTTP code; the answer in out.json
    local what=$1 body=$2
    shift 2
    curl -s -o out.json -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" "$@" "$URL/api/v1/queue/$what"
  }
  code=$(post pause '{"name":"alpha"}')
  [[ $code == 403 ]] || fail "pause without the token: $code $(cat out.json)"
  code=$(post pause '{"name":"alpha"}' -H "Authorization: Bearer ${TOKEN}x")
  [[ $code == 403 ]] || fail "pause with a wrong token: $code"
  code=$(post pause '{"name":"alpha"}' -H "Authorization: Bearer $TOKEN" -H "Origin: http://evil.example")
  [[ $code == 403 ]] || fail "pause from another site: $code"
  [[ $(stat_of paused roots/alpha) == false ]] || fail "a refused pause paused alpha"
  local auth=(-H "Authorization: Bearer $TOKEN")
  code=$(post pause '{"name":"alpha"}' "${auth[@]}" -H "Origin: $URL")
  [[ $code == 200 && $(stat_of paused roots/alpha) == true ]] || fail "pause with the token: $code $(cat out.json)"
  curl -sf "$URL/api/v1/queues" >q.json && eq "alpha shown paused at once" "$(field q.json "q('alpha')['paused']")" true
  code=$(post resume '{"name":"alpha"}' "${auth[@]}")
  [[ $code == 200 && $(stat_of paused roots/alpha) == false ]] || fail "resume: $code $(cat out.json)"
  # release: one of beta's leases by id.
  local id
  id=$("$SPOOL" list roots/beta --state in_flight --json | head -1 | sed 's/.*"id":\([0-9]*\).*/\1/')
  code=$(post release "{\"name\":\"beta\",\"id\":$id}" "${auth[@]}")
  [[ $code == 200 && $(stat_of in_flight roots/beta) == 2 && $(stat_of ready roots/beta) == 5 ]] ||
    fail "release $id: $code $(cat out.json)"
  code=$(post release '{"name":"beta","id":"x"}' "${auth[@]}")
  [[ $code == 400 ]] || fail "release with a bad id: $code"
  # purge: only with the queue's name as confirm.
  code=$(post purge '{"name":"alpha"}' "${auth[@]}")
  [[ $code == 400 && $(stat_of ready roots/alpha) == 25 ]] || fail "purge without confirm: $code"
  code=$(post purge '{"name":"alpha","confirm":"beta"}' "${auth[@]}")
  [[ $code == 400 && $(stat_of ready roots/alpha) == 25 ]] || fail "purge with the wrong confirm: $code"
  code=$(post purge '{"name":"alpha","confirm":"alpha"}' "${auth[@]}")
  [[ $code == 200 && $(stat_of ready roots/alpha) == 0 ]] && eq purged "$(field out.json 'd["purged"]')" 25 ||
    fail "purge: $code $(cat out.json)"
  # move dead letters, then redrive.
  code=$(post move '{"name":"delta","to":"alpha","dlq":true}' "${auth[@]}")
  [[ $code == 200 && $(stat_of dead roots/delta) == 0 && $(stat_of ready roots/alpha) == 1 ]] ||
    fail "move delta's dead letters to alpha: $code $(cat out.json)"
  "$SPOOL" peek roots/alpha --json | grep -q '"spool.moved.from"' || fail "the moved message has no spool.moved.from"
  code=$(post move '{"name":"delta","to":"nowhere","dlq":true}' "${auth[@]}")
  [[ $code == 404 ]] || fail "move to an unknown queue: $code"
  code=$(post redrive '{"name":"eps"}' "${auth[@]}")
  [[ $code == 200 && $(stat_of dead roots/eps) == 0 && $(stat_of ready roots/eps) == 1 ]] || fail "redrive: $code $(cat out.json)"
  # A body that is not JSON, a queue that is not there.
  code=$(post pause 'pause alpha' "${auth[@]}")
  [[ $code == 400 ]] || fail "a body that is not JSON: $code"
  code=$(post pause '{"name":"../etc"}' "${auth[@]}")
  [[ $code == 404 ]] || fail "an unknown queue: $code"
}

# Payloads (peek, dead letters') only with the token; dead letters grouped by reason.
t_detail_payloads_need_the_token() {
  make_demo_queues
  printf '%s\n' "$TOKEN" >token
  serve --token-file token
  curl -sf "$URL/api/v1/queue?name=delta" >d.json || fail "detail"
  eq "by reason" "$(field d.json 'd["dead_letters"]["by_reason"]')" '{"max_receives": 1}'
  eq "payloads" "$(field d.json '(d["payloads"], "peek" in d, "payload" in d["dead_letters"]["letters"][0])')" "(False, False, False)"
  curl -sf -H "Authorization: Bearer $TOKEN" "$URL/api/v1/queue?name=delta" >d.json || fail "detail with the token"
  eq "dead letter payload" "$(field d.json 'd["dead_letters"]["letters"][0]["payload"]["text"]')" doomed
  curl -sf -H "Authorization: Bearer $TOKEN" "$URL/api/v1/queue?name=alpha" >a.json || fail "detail with the token"
  eq "peek" "$(field a.json '[m["payload"]["text"] for m in d["peek"]][:3]')" '["1", "2", "3"]'
}

# The SQS face and the dashboard in one process on one address: each answers its own paths.
t_sqs_and_dashboard_on_one_address() {
  make_demo_queues
  PORT=$(free_port)
  URL=http://127.0.0.1:$PORT
  bg "$SERVE" roots --sqs 127.0.0.1:$PORT --no-auth --http 127.0.0.1:$PORT
  wait_for 10 curl -sf -o /dev/null "$URL/metrics"
  curl -sf -H 'X-Amz-Target: AmazonSQS.ListQueues' -H 'Content-Type: application/x-amz-json-1.0' -d '{}' "$URL/" >l.json ||
    fail "SQS ListQueues"
  grep -q '/000000000000/alpha' l.json || fail "ListQueues: $(cat l.json)"
  curl -sf "$URL/dashboard/" | grep -q '<title>spool</title>' || fail "the page"
  curl -sf "$URL/api/v1/queues" >q.json && eq ready "$(field q.json "q('alpha')['ready']")" 25
  # Options that do not fit together are refused, naming the problem.
  expect 64 "$SERVE" roots
  err_has "give --sqs ADDR"
  expect 64 "$SERVE" roots roots --sqs 127.0.0.1:1 --no-auth
  err_has "serves one ROOT"
  expect 64 "$SERVE" roots --token-file /dev/null --sqs 127.0.0.1:1 --no-auth
  err_has "give --http ADDR too"
  printf 'short\n' >token
  expect 1 "$SERVE" roots --http 127.0.0.1:1 --token-file token
  err_has "shorter than 16 characters"
}

# The page in a real browser: after its script ran (virtual time), the DOM holds every
# queue's row with the numbers of `spool stats`, and the detail pane of the queue the URL
# names with its dead letter's reason.
# Issue 44: the API gives each queue's running bridges, read from their status files
# (bridge.PID, as spool forward/pull write them: here written by the test, for a live pid),
# ignoring a stale one, one of a dead process and a planted link; and each bound lease
# holder's time since its last renewal.
t_api_shows_bridges_and_renewals() {
  mkdir roots && "$SPOOL" init roots/a >/dev/null && "$SPOOL" init roots/b >/dev/null || fail "init"
  "$SPOOL" send roots/a x >/dev/null || fail "send"
  bg "$SPOOL" work roots/a --visibility 1h -- sleep 60
  local worker=$BGPID now
  taken() { [[ $(stat_of in_flight roots/a) == 1 ]]; }
  wait_for 10 taken
  now=$(date +%s)
  status() {  # PID UPDATED_AT: a status file's text
    printf '{"kind":"forward","pid":%d,"peer":"nats://127.0.0.1:4222 subject up","moved":7,"last_id":7,' "$1"
    printf '"last_at":%d,"lag":42,"lag_s":1.5,"updated_at":%d}\n' "$2" "$2"
  }
  status $$ "$now" >"roots/a/bridge.$$"
  status $$ $((now - 60)) >"roots/b/bridge.$$"
  bash -c 'exit 0' &
  local dead=$!
  wait "$dead"
  status "$dead" "$now" >"roots/b/bridge.$dead"
  status 1 "$now" >elsewhere
  ln -s ../../elsewhere roots/b/bridge.1
  serve
  curl -sf "$URL/api/v1/queues" >q.json || fail "GET /api/v1/queues"
  eq "a's bridges" "$(field q.json "[(x['kind'], x['pid'], x['lag'], x['moved']) for x in q('a')['bridges']]")" \
    "[[\"forward\", $$, 42, 7]]"
  eq "b's bridges (stale, dead, a link)" "$(field q.json "q('b')['bridges']")" "[]"
  curl -sf "$URL/api/v1/queue?name=a" >a.json || fail "GET /api/v1/queue?name=a"
  eq "a's holder" "$(field a.json '[x["pid"] for x in d["lease_holders"]]')" "[$worker]"
  field a.json '0 <= d["lease_holders"][0]["renewed_ago_s"] < 30' | grep -qx true ||
    fail "renewed_ago_s: $(field a.json 'd["lease_holders"]')"
}

t_browser_renders_queues() {
  local chrome
  chrome=$(command -v chromium || command -v chromium-browser || command -v google-chrome) || {
    echo "SKIP: chromium is not installed (scripts/deps.sh --test installs it)"
    exit 77
  }
  # Root has no sandbox for chromium's renderers; --no-sandbox is needed there.
  local flags=(--headless --no-sandbox --disable-gpu --no-first-run --disable-extensions --hide-scrollbars
    --user-data-dir="$D/profile")
  if ! timeout 60 "$chrome" "${flags[@]}" --dump-dom about:blank >blank.html 2>chrome.err || ! grep -q '<body' blank.html; then
    echo "SKIP: chromium cannot run here: $(grep -v dbus chrome.err | tail -3 | tr '\n' ' ')"
    exit 77
  fi
  make_demo_queues
  "$SPOOL" pause roots/beta 2>/dev/null || fail "pause"
  printf '%s\n' "$TOKEN" >token
  serve --token-file token
  sleep 2.2  # rates and a few samples for the charts
  timeout 60 "$chrome" "${flags[@]}" --virtual-time-budget=4000 --dump-dom "$URL/dashboard/#queue=delta" >dom.html 2>chrome.err ||
    fail "chromium --dump-dom: $(tail -3 chrome.err)"
  python3 - dom.html <<'EOF' || fail "the page does not show the queues: $(head -c 3000 dom.html)"
import re, sys
from html.parser import HTMLParser

class Rows(HTMLParser):
    """Collects the text of each td of each tr[data-queue] by its c-* class, and of ids."""
    def __init__(self):
        super().__init__()
        self.rows, self.ids, self.row, self.cell, self.stack = {}, {}, None, None, []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-queue" in a:
            self.row = self.rows.setdefault(a["data-queue"], {})
        if tag == "td" and self.row is not None:
            self.cell = next((c for c in (a.get("class") or "").split() if c.startswith("c-")), None)
            if self.cell: self.row[self.cell] = ""
        if tag not in ("input", "meta", "link", "br", "img"):
            self.stack.append((tag, a.get("id")))
            if a.get("id"): self.ids.setdefault(a["id"], "")
    def handle_endtag(self, tag):
        if tag == "td": self.cell = None
        if tag == "tr": self.row = None
        while self.stack and self.stack.pop()[0] != tag: pass
    def handle_data(self, data):
        if self.row is not None and self.cell: self.row[self.cell] += data
        for _, i in self.stack:
            if i: self.ids[i] += data

p = Rows()
p.feed(open(sys.argv[1]).read())
want = {"alpha": ("run", "25", "0", "0", "0"), "beta": ("paused", "4", "3", "0", "0"),
        "delta": ("run", "0", "0", "0", "1")}
ok = True
for name, (state, ready, inflight, delayed, dead) in want.items():
    r = p.rows.get(name)
    got = r and (r["c-state"], r["c-ready"], r["c-in_flight"], r["c-delayed"], r["c-dead"])
    if got != (state, ready, inflight, delayed, dead):
        print(f"{name}: got {got}, want {(state, ready, inflight, delayed, dead)}"); ok = False
g = p.rows.get("team/gamma")
if not g or g["c-delayed"] != "1" or not re.fullmatch(r"[0-9.]+", g["c-send"]) or "polyline" not in open(sys.argv[1]).read():
    print(f"team/gamma: {g}"); ok = False
if "4 queues" not in p.ids.get("summary", ""):
    print(f"summary: {p.ids.get('summary')}"); ok = False
if p.ids.get("d-name") != "delta" or "max_receives" not in p.ids.get("d-reasons", ""):
    print(f"detail: {p.ids.get('d-name')!r} reasons {p.ids.get('d-reasons')!r}"); ok = False
sys.exit(0 if ok else 1)
EOF
  # Screenshots: the list with the detail of a busy queue, and the list alone.
  timeout 60 "$chrome" "${flags[@]}" --virtual-time-budget=4000 --window-size=1200,860 \
    --screenshot="$D/dashboard.png" "$URL/dashboard/#queue=team/gamma" >/dev/null 2>chrome.err ||
    fail "chromium --screenshot: $(tail -3 chrome.err)"
  [[ $(stat -c %s dashboard.png) -gt 20000 ]] || fail "the screenshot is $(stat -c %s dashboard.png) bytes"
  if [[ -n ${SPOOL_DASH_IMG:-} ]]; then cp dashboard.png "$SPOOL_DASH_IMG/"; fi
}

TESTS=(
  t_json_api_matches_stats
  t_metrics_match_stats_prometheus
  t_actions_need_the_token
  t_detail_payloads_need_the_token
  t_sqs_and_dashboard_on_one_address
  t_api_shows_bridges_and_renewals
  t_browser_renders_queues
)

run_tests kill_bg
