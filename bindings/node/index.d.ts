// Type declarations of the spool Node.js binding (index.js; docs/node.md).
/// <reference types="node" />

export type Data = Buffer | Uint8Array | string;

export interface QueueOptions {
  /** Default lease of receive, seconds (30). */
  visibility?: number;
  /** Deliveries before dead-lettering (10); 0: never. */
  maxReceives?: number;
  sync?: 'always' | 'interval' | 'never';
  /** Seconds (0.05). */
  syncInterval?: number;
  segmentSize?: number;
  maxPayload?: number;
  /** Seconds; off by default. */
  retentionMaxAge?: number;
  retentionMaxBytes?: number;
  /** Back-pressure: ready + delayed messages (QueueFullError past it). */
  maxReady?: number;
  /** Back-pressure: payload bytes. */
  maxBytes?: number;
  /** Seconds a dedup id is remembered (300). */
  dedupWindow?: number;
  /** Seconds acked messages are kept for replay (off). */
  keepAcked?: number;
}

export interface MessageOptions {
  /** Up to 16; keys of 1-64 of [A-Za-z0-9._-]; values up to 1024 bytes. */
  attributes?: Record<string, Data>;
  /** 0 (most urgent) to 255; 128 by default. */
  priority?: number;
  /** Ordered group: its messages are received one at a time, in send order. */
  group?: Data;
  /** A second send of this id within the dedup window queues nothing (send only; in a batch,
   * per element). */
  dedupId?: Data;
}

export interface SendOptions extends MessageOptions {
  /** Seconds before the message is receivable. */
  delay?: number;
  /** Resolve only once on disk. */
  sync?: boolean;
  /** Seconds to wait at a back-pressure limit before QueueFullError. */
  waitForRoom?: number;
}

export interface BatchItem extends MessageOptions {
  payload: Data;
}

export interface ReceiveOptions {
  max?: number;
  /** Lease, seconds (0: the queue's default). */
  visibility?: number;
  /** Long poll, seconds (0: do not wait). */
  wait?: number;
}

export interface Stats {
  ready: number; inFlight: number; delayed: number; dead: number; blocked: number;
  oldestReadyAge: number; sentTotal: number; ackedTotal: number; deadLetteredTotal: number;
  expiredTotal: number; nackedTotal: number; bytes: number; bytesOnDisk: number;
  segments: number; nextId: number; dedupIds: number;
}

export class Message {
  readonly id: number;
  readonly payload: Buffer;
  readonly receiveCount: number;
  readonly enqueued: Date;
  readonly priority: number;
  readonly group: Buffer | null;
  readonly attributes: Record<string, Buffer>;
  readonly receipt: string;
  readonly text: string;
  settled: boolean;
  /** Set by messages() when the automatic ack found the lease lost. */
  leaseLost?: boolean;
  ack(opts?: { sync?: boolean }): Promise<void>;
  nack(delay?: number): Promise<void>;
  extend(visibility: number): Promise<void>;
}

export class Queue {
  readonly dir: string;
  static open(dir: string, opts?: QueueOptions): Promise<Queue>;
  static create(dir: string, opts?: QueueOptions): Promise<Queue>;
  send(data: Data, opts?: SendOptions): Promise<number>;
  sendBatch(list: Array<Data | BatchItem>, opts?: SendOptions): Promise<number[]>;
  receive(opts?: ReceiveOptions): Promise<Message[]>;
  messages(opts?: ReceiveOptions & { idleTimeout?: number }): AsyncGenerator<Message, void, undefined>;
  /** One entry per receipt: null if acked, else the error ack would have given
   * (LeaseLostError, NotFoundError, InvalidArgumentError). Rejects only when the call failed
   * as a whole, acking nothing. */
  ackBatch(receipts: string[], opts?: { sync?: boolean }): Promise<Array<SpoolError | null>>;
  bindLeases(): void;
  stats(): Stats;
  close(): void;
}

export type ErrorCode = 'EMPTY' | 'LEASE_LOST' | 'NOT_FOUND' | 'INVALID_ARGUMENT' | 'TOO_LARGE' |
  'QUEUE_FULL' | 'NOT_A_QUEUE' | 'INCOMPATIBLE' | 'NO_SPACE' | 'IO' | 'CORRUPT' | 'READ_ONLY' |
  'CLOSED' | 'UNKNOWN';

export class SpoolError extends Error {
  readonly code: ErrorCode;
  /** The C API's number (spool_code); -1 for CLOSED. */
  readonly errno: number;
}
export class EmptyError extends SpoolError {}
export class LeaseLostError extends SpoolError {}
export class NotFoundError extends SpoolError {}
export class InvalidArgumentError extends SpoolError {}
export class TooLargeError extends SpoolError {}
export class QueueFullError extends SpoolError {}
export class NotAQueueError extends SpoolError {}
export class IncompatibleError extends SpoolError {}
export class NoSpaceError extends SpoolError {}
export class IoError extends SpoolError {}
export class CorruptError extends SpoolError {}
export class ReadOnlyError extends SpoolError {}
export class QueueClosedError extends SpoolError {}
