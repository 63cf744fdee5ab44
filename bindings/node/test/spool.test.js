'use strict';
// The Node binding's tests (node --test), on a queue in a temporary directory each.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('fs');
const os = require('os');
const path = require('path');
const spool = require('..');
const { Queue } = spool;

function tmpQueueDir(t) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'spool-node-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  return path.join(dir, 'q');
}

async function created(t, opts) {
  const q = await Queue.create(tmpQueueDir(t), opts);
  t.after(() => q.close());
  return q;
}

test('send, receive and ack a message', async (t) => {
  const q = await created(t);
  const id = await q.send('hello');
  const [m] = await q.receive({ wait: 1 });
  assert.equal(m.id, id);
  assert.ok(Buffer.isBuffer(m.payload));
  assert.equal(m.text, 'hello');
  assert.equal(m.receiveCount, 1);
  assert.equal(m.priority, 128);
  assert.equal(m.group, null);
  await m.ack();
  await assert.rejects(m.ack(), (e) => e instanceof spool.NotFoundError && e.code === 'NOT_FOUND');
  assert.deepEqual(await q.receive(), []);
  await assert.rejects(q.receive({ max: 0 }), spool.InvalidArgumentError);
  const st = q.stats();
  assert.equal(st.sentTotal, 1);
  assert.equal(st.ackedTotal, 1);
  assert.equal(st.ready, 0);
});

test('open of a directory without a queue is NotAQueueError naming it', async (t) => {
  const dir = tmpQueueDir(t);
  await assert.rejects(Queue.open(dir), (e) =>
    e instanceof spool.NotAQueueError && e instanceof spool.SpoolError && e instanceof Error &&
    e.code === 'NOT_A_QUEUE' && e.message.length > 0);
});

test('attributes, priority, group, dedup id and batches reach the queue', async (t) => {
  const q = await created(t);
  await q.send(Buffer.from('late'), { priority: 200 });
  await q.send('first', { priority: 0, group: 'acct-17', attributes: { trace: '7f3a', n: Buffer.from([0, 1]) } });
  const [m] = await q.receive();
  assert.equal(m.text, 'first');
  assert.equal(m.priority, 0);
  assert.equal(m.group.toString(), 'acct-17');
  assert.equal(m.attributes.trace.toString(), '7f3a');
  assert.deepEqual([...m.attributes.n], [0, 1]);
  const a = await q.send('x', { dedupId: 'order-1' });
  assert.equal(await q.send('x again', { dedupId: 'order-1' }), a);
  await assert.rejects(q.send('x', { attributes: { 'bad key!': 'v' } }),
    (e) => e instanceof spool.InvalidArgumentError && /bad key!/.test(e.message));
  const ids = await q.sendBatch(['b1', Buffer.alloc(0), { payload: 'b3', priority: 5 }], { delay: 3600 });
  assert.deepEqual(ids, [ids[0], ids[0] + 1, ids[0] + 2]);
  assert.equal(q.stats().delayed, 3);
  await assert.rejects(q.send(42), spool.InvalidArgumentError);
  await assert.rejects(q.send('x', { priority: 'high' }), spool.InvalidArgumentError);
  await assert.rejects(q.send('x', { priority: 256 }), (e) => e.code === 'INVALID_ARGUMENT' && /priority/.test(e.message));
});

test('ackBatch acks many and tells each receipt its own outcome', async (t) => {
  const q = await created(t, { visibility: 60 });
  await q.sendBatch(['a', 'b', 'c', 'd']);
  const msgs = await q.receive({ max: 3 });
  assert.equal(msgs.length, 3);
  const receipts = [msgs[0].receipt, msgs[1].receipt, 'garbage', msgs[0].receipt];
  const out = await q.ackBatch(receipts, { sync: true });
  assert.equal(out.length, 4);
  assert.deepEqual(out.slice(0, 2), [null, null]);
  assert.ok(out[2] instanceof spool.InvalidArgumentError && out[2].code === 'INVALID_ARGUMENT' &&
    /garbage/.test(out[2].message), String(out[2]));
  // Given twice: acked by the first, so the second is not found.
  assert.ok(out[3] instanceof spool.NotFoundError && out[3].code === 'NOT_FOUND', String(out[3]));
  assert.deepEqual(await q.ackBatch([]), []);
  const st = q.stats();
  assert.deepEqual([st.ackedTotal, st.inFlight, st.ready], [2, 1, 1]);
  // Without sync (inline on the event-loop thread) as well.
  assert.deepEqual((await q.ackBatch([msgs[2].receipt])), [null]);
  assert.equal(q.stats().ackedTotal, 3);
  await assert.rejects(q.ackBatch(['a\0b']), spool.InvalidArgumentError);
  await assert.rejects(q.ackBatch([42]), spool.InvalidArgumentError);
  q.close();
  await assert.rejects(q.ackBatch([msgs[0].receipt]), spool.QueueClosedError);
});

test('a stale receipt is LeaseLostError for ack, nack and extend', async (t) => {
  const q = await created(t);
  await q.send('job');
  const [first] = await q.receive({ visibility: 0.05 });
  await new Promise((r) => setTimeout(r, 120));
  const [second] = await q.receive({ wait: 1 });
  assert.equal(second.receiveCount, 2);
  for (const call of [() => first.ack(), () => first.nack(), () => first.extend(1)]) {
    await assert.rejects(call(), (e) => e instanceof spool.LeaseLostError && e.code === 'LEASE_LOST');
  }
  await second.extend(60);
  await second.nack();
  const [third] = await q.receive();
  assert.equal(third.receiveCount, 3);
});

test('back-pressure is QueueFullError; a durable send and ack go through the pool', async (t) => {
  const q = await created(t, { maxReady: 2 });
  await q.send('a', { sync: true });
  await q.send('b');
  await assert.rejects(q.send('c'), (e) => e instanceof spool.QueueFullError && e.code === 'QUEUE_FULL');
  const [m] = await q.receive();
  await m.ack({ sync: true });
  await q.send('c');
});

test('a long poll does not block the event loop, wakes at once for a send and ends on close', async (t) => {
  const q = await created(t);
  let ticks = 0;
  const timer = setInterval(() => ticks++, 10);
  const start = Date.now();
  setTimeout(() => q.send('wake'), 300);
  const [m] = await q.receive({ wait: 30 });
  clearInterval(timer);
  assert.equal(m.text, 'wake');
  assert.ok(Date.now() - start < 2000, `woken after ${Date.now() - start} ms`);
  assert.ok(ticks >= 10, `the event loop ran ${ticks} timer ticks during the poll`);

  const q2 = await Queue.create(tmpQueueDir(t));
  const poll = q2.receive({ wait: 60 });
  await new Promise((r) => setTimeout(r, 50));
  const closed = Date.now();
  q2.close();
  await assert.rejects(poll, (e) => e instanceof spool.QueueClosedError && e.code === 'CLOSED');
  assert.ok(Date.now() - closed < 1000, `the poll ended ${Date.now() - closed} ms after close`);
  assert.throws(() => q2.stats(), spool.QueueClosedError);
});

test('messages() yields every message once, acks what the body left, ends on idle', async (t) => {
  const q = await created(t);
  await q.sendBatch(['1', '2', '3', '4']);
  const seen = [];
  for await (const m of q.messages({ wait: 0.1, idleTimeout: 0.3 })) {
    seen.push(m.text);
    if (m.text === '2') await m.nack(3600); // settled by the body: not acked by the loop
  }
  assert.deepEqual(seen, ['1', '2', '3', '4']);
  const st = q.stats();
  assert.equal(st.ackedTotal, 3);
  assert.equal(st.delayed, 1);
  // Leaving the loop early nacks the message in hand: it is ready again at once.
  await q.send('5');
  for await (const m of q.messages({ wait: 0.1 })) { assert.equal(m.text, '5'); break; }
  const [again] = await q.receive();
  assert.equal(again.text, '5');
  assert.equal(again.receiveCount, 2);
});

test('many sends and receives in flight at once: every message exactly once', async (t) => {
  const q = await created(t);
  const n = 500;
  const receivers = [0, 1, 2, 3].map(async () => {
    const got = [];
    for (;;) {
      const msgs = await q.receive({ max: 8, wait: 0.5 });
      if (msgs.length === 0) return got;
      for (const m of msgs) { got.push(m.text); await m.ack(); }
    }
  });
  await Promise.all(Array.from({ length: n }, (_, i) => q.send(`m${i}`)));
  const all = (await Promise.all(receivers)).flat();
  assert.equal(all.length, n);
  assert.equal(new Set(all).size, n);
});

test('a worker_thread has its own addon instance and error classes', async (t) => {
  const { Worker } = require('node:worker_threads');
  const dir = tmpQueueDir(t);
  const q = await Queue.create(dir);
  t.after(() => q.close());
  const code = `
    const { parentPort, workerData } = require('node:worker_threads');
    const spool = require(workerData.pkg);
    (async () => {
      const q = await spool.Queue.open(workerData.dir);
      await q.send('from a worker');
      const err = await spool.Queue.open(workerData.dir + '-none').catch((e) => e);
      parentPort.postMessage(err instanceof spool.NotAQueueError ? 'ok' : String(err));
      q.close();
    })();`;
  const w = new Worker(code, { eval: true, workerData: { pkg: path.join(__dirname, '..'), dir } });
  const [reply] = await require('node:events').once(w, 'message');
  assert.equal(reply, 'ok');
  await require('node:events').once(w, 'exit');
  const [m] = await q.receive({ wait: 1 });
  assert.equal(m.text, 'from a worker');
  // The main thread's errors still come from its own classes after the worker has gone.
  await assert.rejects(Queue.open(dir + '-none'), spool.NotAQueueError);
});
