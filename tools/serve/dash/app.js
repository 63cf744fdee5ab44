// The dashboard of spool serve --http (docs/operations.md): reads /api/v1/queues every
// refresh interval and, while a queue's detail is open, /api/v1/queue?name=NAME; draws the
// charts as inline SVG. Every piece of data goes into the page as text (textContent), never
// as markup. Actions send the token as "Authorization: Bearer", kept in this tab only
// (sessionStorage), never in a cookie.
'use strict';

const $ = (id) => document.getElementById(id);
const kMaxRows = 200;
const state = {
  data: null, sort: 'name', filter: '', selected: null, detail: null, failures: 0,
  token: sessionStorage.getItem('spool-token') || '',
};

// An element with attributes and children (strings become text nodes).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

function fmtBytes(b) {
  const units = 'BKMGTP';
  let v = b, u = 0;
  while (v >= 1024 && u < 5) { v /= 1024; u++; }
  return u === 0 ? `${Math.round(v)}B` : `${v.toFixed(1)}${units[u]}`;
}
function fmtAge(s) {
  if (!(s > 0)) return '-';
  if (s < 60) return `${s.toFixed(1)}s`;
  if (s < 3600) return `${Math.round(s / 60)}m`;
  if (s < 86400) return `${(s / 3600).toFixed(1)}h`;
  return `${(s / 86400).toFixed(1)}d`;
}
function fmtRate(r) {
  if (r == null) return '-';
  return r < 10 && r > 0 ? r.toFixed(1) : String(Math.round(r));
}
function fmtRoom(q) {
  const h = q.headroom;
  if (!h || !h.tightest) return '-';
  return `${Math.round(h.tightest_left * 100)}% ${h.tightest}`;
}

// Lines of `series` ({values, cls}) on one scale from 0, as an SVG of w×h pixels.
function chart(series, w, h, pad, spanS) {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('width', w);
  svg.setAttribute('height', h);
  svg.setAttribute('class', 'spark');
  let max = 0, n = 0;
  for (const s of series) { for (const v of s.values) max = Math.max(max, v); n = Math.max(n, s.values.length); }
  const p = pad || 2;
  if (pad) {
    const label = document.createElementNS(ns, 'text');
    label.setAttribute('x', 4);
    label.setAttribute('y', 12);
    label.setAttribute('font-size', '11');
    label.setAttribute('fill', '#6a7385');
    label.textContent = `max ${max < 10 ? +max.toFixed(1) : Math.round(max)}`;
    svg.append(label);
    if (spanS > 0) {
      const span = label.cloneNode();
      span.setAttribute('x', w - 4);
      span.setAttribute('text-anchor', 'end');
      span.textContent = `${fmtAge(spanS)} to now`;
      svg.append(span);
    }
  }
  if (n < 2) return svg;
  const top = max > 0 ? max : 1;
  for (const s of series) {
    const pts = s.values.map((v, i) => {
      const x = p + (i + n - s.values.length) * (w - 2 * p) / (n - 1);
      const y = h - p - (v / top) * (h - 2 * p - (pad ? 12 : 0));
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    });
    const line = document.createElementNS(ns, 'polyline');
    line.setAttribute('points', pts.join(' '));
    line.setAttribute('fill', 'none');
    line.setAttribute('stroke', s.color);
    line.setAttribute('stroke-width', pad ? '1.5' : '1.2');
    svg.append(line);
  }
  return svg;
}
// The colours of the stylesheet's variables, read once (getComputedStyle forces a style
// recalculation, which once per chart made a long list slow).
const colours = {};
const css = (name) => {
  if (!(name in colours)) colours[name] = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return colours[name];
};

const sortKeys = {
  name: (q) => q.name, state: (q) => (q.error ? 2 : q.paused ? 1 : 0), ready: (q) => q.ready || 0,
  in_flight: (q) => q.in_flight || 0, delayed: (q) => q.delayed || 0, dead: (q) => q.dead || 0,
  send: (q) => (q.rates ? q.rates.send : 0), ack: (q) => (q.rates ? q.rates.ack : 0),
  nack: (q) => (q.rates ? q.rates.nack : 0), oldest: (q) => q.oldest_ready_age_s || 0,
  disk: (q) => q.disk_bytes || 0, room: (q) => -(q.headroom ? q.headroom.tightest_left : 1),
};

function renderList() {
  const d = state.data;
  const queues = d.queues.filter((q) => !state.filter || q.name.includes(state.filter));
  const key = sortKeys[state.sort];
  queues.sort((a, b) => {
    if (state.sort === 'name') return a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
    const ka = key(a), kb = key(b);
    return ka !== kb ? kb - ka : (a.name < b.name ? -1 : 1);
  });
  const backlog = d.queues.reduce((s, q) => s + (q.ready || 0), 0);
  const paused = d.queues.filter((q) => q.paused).length;
  $('summary').textContent = `${d.queues.length} queues, ${backlog} ready${paused ? `, ${paused} paused` : ''}` +
    ` · ${new Date(d.now).toLocaleTimeString()}`;
  const body = el('tbody');
  // At most kMaxRows lines are drawn (each has a chart): with more queues, the first ones in
  // the chosen order, and a line that says how many more there are.
  for (const q of queues.slice(0, kMaxRows)) {
    const tr = el('tr', { 'data-queue': q.name, onclick: () => select(q.name) });
    if (q.name === state.selected) tr.classList.add('selected');
    tr.append(el('td', { class: 'c-name', text: q.name }));
    if (q.ready === undefined) {
      tr.append(el('td', { class: 'c-state error', text: 'error' }),
        el('td', { class: 'error', colspan: '11', text: q.error || 'not read yet' }));
      body.append(tr);
      continue;
    }
    const st = q.error ? 'error' : q.paused ? 'paused' : 'run';
    tr.append(el('td', { class: `c-state ${st === 'run' ? '' : st}`, text: st, title: q.error || '' }));
    for (const k of ['ready', 'in_flight', 'delayed', 'dead']) {
      tr.append(el('td', { class: `num c-${k}${k === 'dead' && q.dead > 0 ? ' hot' : ''}`, text: String(q[k]) }));
    }
    for (const k of ['send', 'ack', 'nack']) {
      tr.append(el('td', { class: `num c-${k}`, text: fmtRate(q.rates ? q.rates[k] : null) }));
    }
    tr.append(el('td', { class: 'num c-oldest', text: fmtAge(q.oldest_ready_age_s) }),
      el('td', { class: 'num c-disk', text: fmtBytes(q.disk_bytes) }),
      el('td', { class: `num c-room${q.headroom && q.headroom.tightest_left < 0.1 ? ' hot' : ''}`, text: fmtRoom(q) }));
    const h = q.history;
    tr.append(el('td', { class: 'c-chart' }, h ? chart([
      { values: h.send, color: css('--send') }, { values: h.ack, color: css('--ack') }], 160, 22) : null));
    body.append(tr);
  }
  if (queues.length > kMaxRows) {
    body.append(el('tr', {}, el('td', { class: 'dim', colspan: '13',
      text: `and ${queues.length - kMaxRows} more: sort or filter to see them` })));
  }
  $('queues').replaceChild(body, $('queues').tBodies[0]);
  $('empty').hidden = d.queues.length > 0;
  for (const th of document.querySelectorAll('#queues th[data-sort]')) {
    th.classList.toggle('sorted', th.dataset.sort === state.sort);
  }
  $('token-form').hidden = !d.actions;
}

async function refresh() {
  try {
    const r = await fetch('/api/v1/queues', { cache: 'no-store' });
    if (!r.ok) throw new Error(`${r.status} ${(await r.json()).error || ''}`);
    state.data = await r.json();
    state.failures = 0;
    $('status').textContent = '';
    renderList();
  } catch (e) {
    state.failures++;
    $('status').textContent = `cannot reach spool serve: ${e.message}`;
  }
  const interval = state.data ? state.data.interval_ms : 1000;
  setTimeout(refresh, Math.min(interval * (1 + state.failures), 10000));
}

function authHeaders() {
  return state.token ? { Authorization: `Bearer ${state.token}` } : {};
}

// --- the detail pane ---

function select(name) {
  state.selected = name;
  history.replaceState(null, '', name ? `#queue=${encodeURIComponent(name)}` : '#');
  $('detail').hidden = !name;
  $('d-note').hidden = true;
  if (state.data) renderList();
  if (name) loadDetail();
}

let detailTimer = null;
async function loadDetail() {
  clearTimeout(detailTimer);
  const name = state.selected;
  if (!name) return;
  try {
    const r = await fetch(`/api/v1/queue?name=${encodeURIComponent(name)}`, { cache: 'no-store', headers: authHeaders() });
    const j = await r.json();
    if (name !== state.selected) return;
    if (!r.ok) throw new Error(j.error || r.status);
    state.detail = j;
    renderDetail(j);
  } catch (e) {
    note(`${name}: ${e.message}`);
  }
  detailTimer = setTimeout(loadDetail, 2000);
}

function kvRows(table, rows) {
  table.replaceChildren(...rows.map(([k, v]) => el('tr', {}, el('td', { text: k }), el('td', { class: 'num', text: String(v) }))));
}
function listRows(table, head, rows) {
  if (rows.length === 0) {
    table.replaceChildren(el('tr', {}, el('td', { class: 'dim', text: 'none' })));
    return;
  }
  table.replaceChildren(el('tr', {}, ...head.map((h) => el('th', { text: h }))),
    ...rows.map((r) => el('tr', {}, ...r.map((c) => (c instanceof Node ? el('td', {}, c) : el('td', { text: String(c) }))))));
}
function payloadText(p) {
  if (!p) return '';
  return (p.binary ? `(binary, ${p.size} bytes)` : p.text) + (p.truncated && !p.binary ? '…' : '');
}

function renderDetail(j) {
  $('d-name').textContent = j.name;
  $('d-dir').textContent = j.dir;
  const h = j.history || { t: [], send: [], ack: [], nack: [], dead_lettered: [], ready: [], in_flight: [], dead: [] };
  const span = h.t.length > 1 ? (h.t[h.t.length - 1] - h.t[0]) / 1000 : 0;
  $('d-rates').replaceChildren(chart([
    { values: h.send, color: css('--send') }, { values: h.ack, color: css('--ack') },
    { values: h.nack, color: css('--nack') }, { values: h.dead_lettered, color: css('--dead') }], 520, 140, 6, span));
  $('d-depth').replaceChildren(chart([
    { values: h.ready, color: css('--ready') }, { values: h.in_flight, color: css('--inflight') },
    { values: h.dead, color: css('--dead') }], 520, 140, 6, span));
  const r = j.rates || {};
  kvRows($('d-stats'), j.ready === undefined ? [['error', j.error || 'not read yet']] : [
    ['state', j.paused ? 'paused' : 'run'], ['ready', j.ready], ['in flight', j.in_flight], ['delayed', j.delayed],
    ['blocked', j.blocked], ['dead', j.dead], ['oldest ready', fmtAge(j.oldest_ready_age_s)],
    ['payload', fmtBytes(j.bytes || 0)], ['disk', fmtBytes(j.disk_bytes || 0)], ['room', fmtRoom(j)],
    ['filesystem free', j.headroom ? fmtBytes(j.headroom.fs_free) : '-']]);
  kvRows($('d-totals'), j.ready === undefined ? [] : [
    ['sent', j.sent_total], ['received', j.received_total], ['redelivered', j.redelivered_total],
    ['acked', j.acked_total], ['nacked', j.nacked_total],
    ['dead-lettered', j.dead_lettered_total], ['expired', j.expired_total],
    ['send/s', fmtRate(r.send)], ['receive/s', fmtRate(r.receive)], ['redeliver/s', fmtRate(r.redeliver)],
    ['ack/s', fmtRate(r.ack)], ['nack/s', fmtRate(r.nack)],
    ['dead-lettered/s', fmtRate(r.dead_lettered)]]);
  const o = j.options || {};
  kvRows($('d-options'), [['visibility', fmtAge((o.visibility_ms || 0) / 1000)], ['max receives', o.max_receives ?? '-'],
    ['max ready', o.max_ready || 'none'], ['max bytes', o.max_bytes ? fmtBytes(o.max_bytes) : 'none'],
    ['retention', o.retention_max_age_ms ? fmtAge(o.retention_max_age_ms / 1000) : 'none'],
    ['dedup window', fmtAge((o.dedup_window_ms || 0) / 1000)]]);
  listRows($('d-bridges'), ['bridge', 'pid', 'peer', 'moved', 'lag', 'last'], (j.bridges || []).map((b) => [
    b.kind, b.pid, b.peer, b.moved, b.lag < 0 ? '?' : b.lag + (b.lag_s > 0 ? ` (${fmtAge(b.lag_s)})` : ''),
    b.last_at > 0 ? `${b.kind === 'forward' ? 'id' : 'seq'} ${b.last_id}, ${fmtAge(Date.now() / 1000 - b.last_at)} ago` : '-']));
  listRows($('d-holders'), ['pid', 'leases', 'renewed'], (j.lease_holders || []).map((x) => [x.pid || 'unbound', x.leases,
    x.renewed_ago_s === undefined ? '-' : `${x.renewed_ago_s.toFixed(1)}s ago`]));
  const canAct = state.data && state.data.actions && state.token;
  listRows($('d-leases'), ['id', 'receives', 'ends in', 'holder', ''], (j.leases || []).map((l) => [
    l.id, l.receive_count, fmtAge(l.ends_in_s), l.holder_pid || '-',
    el('button', { type: 'button', title: 'end this lease now: the message is ready again', onclick: () => act('release', { id: l.id }), ...(canAct ? {} : { disabled: '' }) }, 'release')]));
  const dl = j.dead_letters || { by_reason: {}, letters: [] };
  const reasons = Object.entries(dl.by_reason);
  if (reasons.length === 0) listRows($('d-reasons'), [], []);
  else kvRows($('d-reasons'), reasons.concat(dl.count > dl.scanned ? [[`(of the first ${dl.scanned} of ${dl.count})`, '']] : []));
  listRows($('d-dead'), ['id', 'reason', 'receives', 'sent', j.payloads ? 'payload' : 'attributes'], dl.letters.map((x) => [
    x.id, x.reason, x.receive_count, x.enqueued_at,
    j.payloads ? el('span', { class: 'payload', text: payloadText(x.payload) })
      : Object.entries(x.attributes).map(([k, v]) => `${k}=${v}`).join(' ')]));
  $('d-peek-box').hidden = !j.peek;
  if (j.peek) {
    listRows($('d-peek'), ['id', 'sent', 'payload'], j.peek.map((m) => [m.id, m.enqueued_at,
      el('span', { class: 'payload', text: payloadText(m.payload) })]));
  }
  renderActions(j, canAct);
}

function renderActions(j, canAct) {
  const box = $('d-actions');
  const dis = canAct ? {} : { disabled: '', title: 'needs the token (spool serve --token-file)' };
  const others = state.data ? state.data.queues.map((q) => q.name).filter((n) => n !== j.name) : [];
  const target = el('select', { 'aria-label': 'queue to move the dead letters to', ...dis },
    ...others.map((n) => el('option', { value: n, text: n })));
  const keep = box.querySelector('select');
  if (keep && others.includes(keep.value)) target.value = keep.value;
  box.replaceChildren(
    j.paused ? el('button', { type: 'button', onclick: () => act('resume', {}), ...dis }, 'resume')
      : el('button', { type: 'button', onclick: () => act('pause', {}), ...dis }, 'pause'),
    el('button', { type: 'button', ...dis, ...(j.dead ? {} : { disabled: '' }),
      onclick: () => confirm(`Redrive the ${j.dead} dead letters of ${j.name} back into it?`) && act('redrive', {}) }, 'redrive'),
    el('button', { type: 'button', ...dis, ...(j.dead && others.length ? {} : { disabled: '' }),
      onclick: () => confirm(`Move the ${j.dead} dead letters of ${j.name} to ${target.value}?`) &&
        act('move', { to: target.value, dlq: true }) }, 'move dead letters to'), target,
    el('button', { type: 'button', class: 'danger', ...dis, onclick: () => {
      const typed = prompt(`Purge removes every message of ${j.name}. Type its name to go on:`);
      if (typed !== null) act('purge', { confirm: typed });
    } }, 'purge'));
}

function note(text) {
  $('d-note').textContent = text;
  $('d-note').hidden = !text;
}

async function act(what, body) {
  const name = state.selected;
  try {
    const r = await fetch(`/api/v1/queue/${what}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json', ...authHeaders() },
      body: JSON.stringify({ name, ...body }),
    });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error || r.status);
    const done = { pause: 'paused', resume: 'resumed', purge: `purged ${j.purged} messages`,
      redrive: `redrove ${j.redriven} dead letters`, move: `moved ${j.moved} to ${body.to}`,
      release: `released message ${body.id}` }[what];
    note(`${name}: ${done}`);
  } catch (e) {
    note(`${name}: ${what} failed: ${e.message}`);
  }
  loadDetail();
}

// --- wiring ---

for (const th of document.querySelectorAll('#queues th[data-sort]')) {
  th.addEventListener('click', () => { state.sort = th.dataset.sort; if (state.data) renderList(); });
}
$('filter').addEventListener('input', (e) => { state.filter = e.target.value; if (state.data) renderList(); });
$('d-close').addEventListener('click', () => select(null));
$('token').value = state.token;
$('token-form').addEventListener('submit', (e) => {
  e.preventDefault();
  state.token = $('token').value.trim();
  sessionStorage.setItem('spool-token', state.token);
  if (state.detail) renderDetail(state.detail);
  loadDetail();
});
const m = /^#queue=(.+)$/.exec(location.hash);
if (m) select(decodeURIComponent(m[1]));
refresh();
