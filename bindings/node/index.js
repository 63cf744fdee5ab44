'use strict';
// spool for Node.js: a persistent, brokerless message queue for worker processes on one host.
// The native addon (src/addon.c) is Node-API over libspool's C API; this file is the API
// (docs/node.md). Calls that can block — a long poll, a durable send or ack, a send waiting
// for room, opening — run on libuv's thread pool; the rest (a send or ack under the queue's
// interval/never sync policy, a receive without a wait, stats) take microseconds and run
// inline. A long poll is waits of at most 100 ms on the pool, so it never holds a pool
// thread for longer and close() ends it within one.

const path = require('path');

function loadAddon() {
  if (process.env.SPOOL_NODE_ADDON) return require(path.resolve(process.env.SPOOL_NODE_ADDON));
  for (const dir of ['Release', 'Debug']) {
    try {
      return require(path.join(__dirname, 'build', dir, 'spool.node'));
    } catch (e) {
      if (e.code !== 'MODULE_NOT_FOUND') throw e;
    }
  }
  throw new Error('spool: the native addon is not built: run `npm install` in ' + __dirname +
    ' (it needs libspool and its pkg-config file, `pkg-config --libs spool`)');
}
const native = loadAddon();

const POLL_SLICE = 0.1; // seconds of one wait on the pool

// ------------------------------------------------------------------------------- errors

/** A failed spool call. `code` is a stable string ('LEASE_LOST'), `errno` the C API's number. */
class SpoolError extends Error {
  constructor(message, code, errno) {
    super(message);
    this.name = this.constructor.name;
    this.code = code;
    this.errno = errno;
  }
}
const CODES = [
  [1, 'EMPTY', 'EmptyError'], [2, 'LEASE_LOST', 'LeaseLostError'],
  [3, 'NOT_FOUND', 'NotFoundError'], [4, 'INVALID_ARGUMENT', 'InvalidArgumentError'],
  [5, 'TOO_LARGE', 'TooLargeError'], [6, 'QUEUE_FULL', 'QueueFullError'],
  [7, 'NOT_A_QUEUE', 'NotAQueueError'], [8, 'INCOMPATIBLE', 'IncompatibleError'],
  [9, 'NO_SPACE', 'NoSpaceError'], [10, 'IO', 'IoError'], [11, 'CORRUPT', 'CorruptError'],
  [12, 'READ_ONLY', 'ReadOnlyError'],
];
const errorClasses = {};
const byNumber = new Map();
const codeName = new Map(); // 3 -> 'not found', as the C API's spool_code_name
for (const [errno, code, name] of CODES) {
  codeName.set(errno, code.toLowerCase().replace(/_/g, ' '));
  // A named class per code, so `instanceof LeaseLostError` and `err.name` both work.
  const cls = { [name]: class extends SpoolError {
    constructor(message) { super(message, code, errno); }
  } }[name];
  errorClasses[name] = cls;
  byNumber.set(errno, cls);
}
/** The queue was closed (by this process): no C API code. */
class QueueClosedError extends SpoolError {
  constructor() { super('spool: the queue is closed', 'CLOSED', -1); }
}
native.setErrorFactory((errno, message) => {
  const cls = byNumber.get(errno);
  return cls ? new cls(message) : new SpoolError(message, 'UNKNOWN', errno);
});

// ------------------------------------------------------------------------------- sending

const SYNC = { always: 0, interval: 1, never: 2 };

function toBuffer(v, what) {
  if (Buffer.isBuffer(v)) return v;
  if (typeof v === 'string') return Buffer.from(v, 'utf8');
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  throw new errorClasses.InvalidArgumentError(
    `invalid argument: ${what} must be a Buffer, Uint8Array or string, not ${typeof v}`);
}

function priorityOf(opts) {
  if (opts.priority == null) return -1;
  if (!Number.isInteger(opts.priority)) {
    throw new errorClasses.InvalidArgumentError(
      `invalid argument: priority must be an integer from 0 to 255, not ${opts.priority}`);
  }
  return opts.priority; // the library checks the range
}

// One item for the addon: {payload, attributes: [[key, Buffer]], priority, group, dedupId}.
function toItem(data, opts, what) {
  const item = { payload: toBuffer(data, what) };
  if (opts.attributes != null) {
    item.attributes = Object.entries(opts.attributes).map(
      ([k, v]) => [k, toBuffer(v, `attribute ${k}`)]);
  }
  if (opts.priority != null) item.priority = priorityOf(opts);
  if (opts.group != null) item.group = toBuffer(opts.group, 'group');
  if (opts.dedupId != null) item.dedupId = toBuffer(opts.dedupId, 'dedupId');
  return item;
}

// ------------------------------------------------------------------------------- messages

/** One delivery: a copy of the message, valid after ack. */
class Message {
  constructor(queue, m) {
    this.id = m.id;
    this.payload = m.payload;
    this.receiveCount = m.receiveCount;
    this.enqueued = new Date(m.enqueuedMs);
    this.priority = m.priority;
    this.group = m.group;
    this.attributes = m.attributes;
    this.receipt = m.receipt;
    this.settled = false;
    this._queue = queue;
  }

  /** The payload decoded as UTF-8. */
  get text() { return this.payload.toString('utf8'); }

  /** Deletes the message. Rejects with LeaseLostError if its lease expired and it was
   * received again (nothing changed). `{sync: true}`: resolves once the ack is on disk. */
  async ack({ sync = false } = {}) {
    await this._queue._settle(sync ? 1 : 0, this.receipt, 0, sync);
    this.settled = true;
  }

  /** Makes the message receivable again after `delay` seconds (0: at once). */
  async nack(delay = 0) {
    await this._queue._settle(2, this.receipt, delay, false);
    this.settled = true;
  }

  /** Renews the lease to end `visibility` seconds from now. */
  async extend(visibility) {
    await this._queue._settle(3, this.receipt, visibility, false);
  }
}

// ------------------------------------------------------------------------------- queue

class Queue {
  constructor(handle, syncAlways, dir) {
    this._h = handle;
    this._syncAlways = syncAlways; // every send and ack waits for the disk: use the pool
    this._closed = false;
    this.dir = dir;
  }

  /** Opens the existing queue in `dir` (NotAQueueError if there is none). */
  static async open(dir, opts = {}) {
    const [h, syncAlways] = await native.open(dir, toOptions(opts), false);
    return new Queue(h, syncAlways, dir);
  }

  /** Opens the queue in `dir`, creating it with `opts` when there is none (the options are
   * stored at creation; an existing queue keeps its own). */
  static async create(dir, opts = {}) {
    const [h, syncAlways] = await native.open(dir, toOptions(opts), true);
    return new Queue(h, syncAlways, dir);
  }

  _handle() {
    if (this._closed) throw new QueueClosedError();
    return this._h;
  }

  _pool(opts) {
    return !!opts.sync || opts.waitForRoom > 0 || this._syncAlways;
  }

  _sendItems(items, opts) {
    return native.send(this._handle(), items, opts.delay || 0, !!opts.sync,
      opts.waitForRoom || 0, this._pool(opts));
  }

  // Payloads without attributes, group or dedup id (one Buffer, or an array of them): the
  // addon's path that reads no per-message properties. Resolves to the (first) id.
  _sendPlain(payloads, opts) {
    return native.sendPlain(this._handle(), payloads, opts.delay || 0, !!opts.sync,
      opts.waitForRoom || 0, priorityOf(opts), this._pool(opts));
  }

  /** Sends one message (Buffer, Uint8Array or string) and resolves to its id. opts: delay
   * (s), sync, waitForRoom (s), attributes ({key: Buffer|string}), priority (0-255), group,
   * dedupId. */
  async send(data, opts = {}) {
    if (opts.attributes == null && opts.group == null && opts.dedupId == null) {
      return this._sendPlain(toBuffer(data, 'payload'), opts);
    }
    const ids = await this._sendItems([toItem(data, opts, 'payload')], opts);
    return ids[0];
  }

  /** Sends every message, all or nothing, with consecutive ids. An element is a payload or
   * {payload, attributes, priority, group, dedupId}; opts (delay, sync, waitForRoom, and
   * attributes, priority, group for elements without their own) applies to all. */
  async sendBatch(list, opts = {}) {
    if (list.length === 0) return [];
    const isObject = (e) => e != null && typeof e === 'object' && !(e instanceof Uint8Array);
    if (opts.attributes == null && opts.group == null) {
      // Plain loops, not map/some/Array.from: this is the per-message cost of a batch.
      const buffers = new Array(list.length);
      let plain = true;
      for (let i = 0; i < list.length && plain; i++) {
        if (isObject(list[i])) plain = false;
        else buffers[i] = toBuffer(list[i], `payload ${i}`);
      }
      if (plain) {
        const first = await this._sendPlain(buffers, opts);
        const ids = new Array(list.length);
        for (let i = 0; i < ids.length; i++) ids[i] = first + i; // consecutive ids
        return ids;
      }
    }
    const shared = { attributes: opts.attributes, priority: opts.priority, group: opts.group };
    const items = list.map((e, i) => isObject(e)
      ? toItem(e.payload, { ...shared, ...e }, `payload ${i}`)
      : toItem(e, shared, `payload ${i}`));
    return this._sendItems(items, opts);
  }

  /** Leases up to `max` messages for `visibility` seconds (0: the queue's default). With
   * `wait` > 0 waits that many seconds for one (woken at once by a send from any process);
   * resolves to [] if none came. */
  async receive({ max = 1, visibility = 0, wait = 0 } = {}) {
    if (!Number.isInteger(max) || max < 1) {
      throw new errorClasses.InvalidArgumentError(`invalid argument: max must be an integer of at least 1, not ${max}`);
    }
    let got = native.receive(this._handle(), max, visibility, 0, false);
    if (got.length > 0 || !(wait > 0)) return got.map((m) => new Message(this, m));
    const deadline = Date.now() + wait * 1000;
    for (;;) {
      const left = (deadline - Date.now()) / 1000;
      if (left <= 0) return [];
      got = await native.receive(this._handle(), max, visibility, Math.min(POLL_SLICE, left), true);
      if (got.length > 0) return got.map((m) => new Message(this, m));
    }
  }

  /** `for await (const m of q.messages({wait: 1}))`: yields messages as they come. A message
   * the loop's body did not settle is acked when the next one is asked for; leaving the loop
   * early (break, throw) nacks the one in hand and those not yet yielded. Ends when the queue
   * is closed, or after `idleTimeout` seconds without a message (default: never). */
  async *messages({ max = 1, visibility = 0, wait = 1, idleTimeout = Infinity } = {}) {
    let pending = [];
    let idleSince = Date.now();
    try {
      while (!this._closed) {
        let got;
        try {
          got = await this.receive({ max, visibility, wait });
        } catch (e) {
          if (e instanceof QueueClosedError) return;
          throw e;
        }
        if (got.length === 0) {
          if ((Date.now() - idleSince) / 1000 >= idleTimeout) return;
          continue;
        }
        idleSince = Date.now();
        pending = got;
        while (pending.length > 0) {
          const m = pending[0];
          yield m;
          pending.shift();
          if (!m.settled && !this._closed) {
            try {
              await m.ack();
            } catch (e) {
              if (!(e instanceof errorClasses.LeaseLostError)) throw e;
              m.leaseLost = true; // another consumer has it now
            }
          }
        }
      }
    } finally {
      if (!this._closed) {
        for (const m of pending) if (!m.settled) await m.nack().catch(() => {});
      }
    }
  }

  /** Acks many receipts at once (as SQS's DeleteMessageBatch): one append, one sync.
   * Resolves to one entry per receipt, in order: null if it was acked, else the error ack
   * would have rejected with (LeaseLostError; NotFoundError, also for a receipt given twice;
   * InvalidArgumentError for a malformed one). Rejects only when the call failed as a whole,
   * acking nothing (ReadOnlyError, IoError...). `{sync: true}`: resolves once on disk. */
  async ackBatch(receipts, { sync = false } = {}) {
    if (!Array.isArray(receipts)) {
      throw new errorClasses.InvalidArgumentError(
        `invalid argument: receipts must be an array of strings, not ${typeof receipts}`);
    }
    for (let i = 0; i < receipts.length; i++) {
      const r = receipts[i];
      // A NUL would end the C string early: the receipt read would not be the one given.
      if (typeof r !== 'string' || r.includes('\0')) {
        throw new errorClasses.InvalidArgumentError(
          `invalid argument: receipt ${i} must be a string without NUL, not ${JSON.stringify(r)}`);
      }
    }
    const pool = sync || this._syncAlways;
    const codes = await native.ackBatch(this._handle(), receipts, sync, pool);
    // Only the codes of one receipt come back here (lease lost, not found, invalid
    // argument); the addon rejected for any other.
    return codes.map((c, i) => (c === 0 ? null
      : new (byNumber.get(c))(`receipt ${JSON.stringify(receipts[i])}: ${codeName.get(c)}`)));
  }

  _settle(kind, receipt, arg, sync) {
    return native.settle(this._handle(), kind, receipt, arg, sync || this._syncAlways);
  }

  /** Binds the leases this Queue takes from now on to this process: if it dies, they return
   * to ready at once instead of after their visibility. */
  bindLeases() {
    native.bindLeases(this._handle());
  }

  /** The queue's counters (docs/semantics.md, "Stats"). */
  stats() {
    return native.stats(this._handle());
  }

  /** Closes the queue. A long poll under way rejects with QueueClosedError within 100 ms
   * (an iterator of messages() just ends); later calls throw it. Idempotent. */
  close() {
    if (this._closed) return;
    this._closed = true;
    native.close(this._h);
  }
}

function toOptions(o) {
  const out = { ...o };
  if (o.sync !== undefined) {
    if (!(o.sync in SYNC)) {
      throw new errorClasses.InvalidArgumentError(
        `invalid argument: sync must be 'always', 'interval' or 'never', not ${o.sync}`);
    }
    out.sync = SYNC[o.sync];
  }
  return out;
}

module.exports = { Queue, Message, SpoolError, QueueClosedError, ...errorClasses };
