/* spool.h: the C API of libspool, for C programs and for every FFI (Python's ctypes, Go's
 * cgo, Rust, ...). C99; a thin layer over the C++ API in queue.h and lease_keeper.h, in the
 * same library (libspool.so.0) and with the same semantics (docs/semantics.md). Reference:
 * docs/api.md, "The C API"; man page spool.h(3).
 *
 * Conventions:
 *  - Handles are opaque (spool_queue, spool_keeper). Nothing C++ crosses this header and
 *    no call lets an exception out: an unexpected one (out of memory) becomes SPOOL_IO.
 *  - Fallible calls return a spool_code; its numbers are those of spool::Code. On failure
 *    the call's output parameters are left unset (pointers NULL, counts 0 where stated) and
 *    spool_last_error() tells what went wrong.
 *  - Times are milliseconds (uint64_t) unless a name says otherwise.
 *  - Structs the caller fills or provides that may grow (spool_options, spool_send_options,
 *    spool_stats) start with a `size` field: set it to sizeof the struct you compiled with
 *    (the *_init macros pass it). The library reads and writes only the fields that fit in
 *    `size`, so a program built against an older header keeps working with a newer library;
 *    a field added later reads as its default for it. An array the caller passes
 *    (spool_send_items) takes the element size as a parameter for the same reason. Structs
 *    the library hands out (spool_message, spool_attribute, spool_message_info,
 *    spool_subscription_info) never grow within a soname: what a message gains later comes
 *    through functions, as its attributes do (spool_message_attributes).
 *
 * Thread-safety: a spool_queue may be used by several threads at once (as spool::Queue).
 * spool_last_error() is per thread. Do not use a spool_queue in a child after fork(); open
 * the queue again there. Any number of processes may open one queue directory at once.
 */
#ifndef SPOOL_SPOOL_H
#define SPOOL_SPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Result of a call: the numbers of spool::Code (status.h), stable across releases. */
typedef enum spool_code {
  SPOOL_OK = 0,
  SPOOL_EMPTY = 1,            /* receive found nothing before its wait ran out: not a failure */
  SPOOL_LEASE_LOST = 2,       /* the receipt's lease expired and the message was received again */
  SPOOL_NOT_FOUND = 3,        /* unknown or already-acked message / receipt */
  SPOOL_INVALID_ARGUMENT = 4, /* malformed receipt, option or input (a NULL pointer, too) */
  SPOOL_TOO_LARGE = 5,        /* payload over the queue's max_payload */
  SPOOL_QUEUE_FULL = 6,       /* back-pressure limit reached, or all owner slots taken (bind) */
  SPOOL_NOT_A_QUEUE = 7,      /* directory or file is not a spool queue */
  SPOOL_INCOMPATIBLE = 8,     /* newer format version, or an index of an incompatible build */
  SPOOL_NO_SPACE = 9,         /* ENOSPC: free space, then retry */
  SPOOL_IO = 10,              /* any other I/O error (errno text in the message) */
  SPOOL_CORRUPT = 11,         /* checksum or structure failure in stored data */
  SPOOL_READ_ONLY = 12        /* the caller may not change this queue */
} spool_code;

/* Short stable name of a code ("lease lost"); "unknown" outside the enum. Never NULL. */
const char* spool_code_name(int code);

/* The message of the last call on this thread that failed (returned neither SPOOL_OK nor a
 * value meaning success): "<code name>: <what is wrong, and what to do>". Calls that succeed
 * leave it unchanged. Valid until the next failing spool call on this thread; "" before any. */
const char* spool_last_error(void);

/* ---------------------------------------------------------------------- opening */

typedef struct spool_queue spool_queue;

typedef enum spool_sync_policy {
  SPOOL_SYNC_ALWAYS = 0,   /* send/ack return only once on disk (group commit) */
  SPOOL_SYNC_INTERVAL = 1, /* synced at most sync_interval_ms after a write (default) */
  SPOOL_SYNC_NEVER = 2     /* left to the kernel's writeback */
} spool_sync_policy;

/* Settings of a queue: spool::QueueOptions. Fields marked [stored] are fixed when the queue
 * is created; opening an existing queue ignores them. Defaults are set by
 * spool_options_init. */
typedef struct spool_options {
  size_t size;                   /* sizeof(spool_options) */
  uint64_t visibility_ms;        /* [stored] default lease of receive; 30000 */
  uint32_t max_receives;         /* [stored] deliveries before dead-lettering; 10; 0: never */
  int sync;                      /* [stored] a spool_sync_policy; SPOOL_SYNC_INTERVAL */
  uint64_t sync_interval_ms;     /* [stored] 50 */
  uint64_t segment_size;         /* [stored] bytes per segment file; 64 MiB */
  uint64_t max_payload;          /* [stored] largest message; 0: 1 MiB (or a segment) */
  uint64_t retention_max_age_ms; /* [stored] drop ready messages older than this; 0: off */
  uint64_t retention_max_bytes;  /* [stored] drop oldest ready past this many bytes; 0: off */
  uint64_t max_ready;            /* [stored] back-pressure: ready+delayed limit; 0: off */
  uint64_t max_bytes;            /* [stored] back-pressure: payload bytes limit; 0: off */
  int create;                    /* create the queue if the directory holds none; 1 */
  /* ---- since 0.2.0 (a struct of 0.1.0 ends here: its size is 88 on LP64) */
  uint64_t dedup_window_ms;      /* [stored] how long a dedup id is remembered; 300000 */
  uint64_t keep_acked_ms;        /* [stored] replay after ack: keep acked messages; 0: off */
} spool_options;

/* Fills the first `size` bytes of *opts (at most sizeof(spool_options) of this header) with
 * the defaults, and opts->size with that many. Call it through the macro below, which
 * passes the size of the struct the caller was compiled with. */
void spool_options_init_size(spool_options* opts, size_t size);
/* The function of 0.1.0, kept for programs built against it and for FFIs that look it up by
 * name: it fills only the fields of 0.1.0's spool_options (size 88), never more, so it is
 * safe for their shorter struct. A C program compiled with this header gets the macro. */
void spool_options_init(spool_options* opts);
#define spool_options_init(opts) spool_options_init_size((opts), sizeof *(opts))

/* Opens (or creates) the queue in directory `dir`; opts may be NULL for the defaults.
 * On success *out is a handle to close with spool_close. Errors: SPOOL_NOT_A_QUEUE,
 * SPOOL_INCOMPATIBLE, SPOOL_READ_ONLY (no write permission: only stats and peek work),
 * SPOOL_IO, SPOOL_INVALID_ARGUMENT. */
spool_code spool_open(const char* dir, const spool_options* opts, spool_queue** out);

/* Opens the queue in `dir` (as spool_open) as subscription `subscription` (see
 * spool_add_subscription below): the handle's spool_receive, spool_receive_id, spool_ack,
 * spool_nack, spool_extend, spool_bind, spool_bind_leases, spool_peek, spool_list and
 * spool_get_stats act on that subscription's messages, with leases and acks of its own;
 * spool_remove, spool_purge, spool_pause, spool_resume, spool_release and spool_replay are
 * the queue's own (SPOOL_INVALID_ARGUMENT on this handle; a pause holds back every
 * subscription too). A receipt of one
 * subscription (or of the queue's own view) is SPOOL_INVALID_ARGUMENT on another's handle.
 * Errors: those of spool_open; SPOOL_INVALID_ARGUMENT if `subscription` is NULL or not a
 * valid name; SPOOL_NOT_FOUND if the queue has no subscription of that name (a removed
 * one is SPOOL_NOT_FOUND at the handle's next call). */
spool_code spool_open_subscription(const char* dir, const spool_options* opts,
                                   const char* subscription, spool_queue** out);

/* Closes the queue (releases the leases it bound; see spool_bind). NULL is a no-op, and so
 * is the handle of spool_dead_letters (its queue closes it). Free every message batch of
 * this queue before closing it. */
void spool_close(spool_queue* q);

/* The queue's directory, as given to spool_open. Valid while q is open. */
const char* spool_dir(spool_queue* q);

/* The queue's stored settings (as opts of spool_open; `create` reads 0). out->size must be
 * set. */
spool_code spool_get_options(spool_queue* q, spool_options* out);

/* ---------------------------------------------------------------------- sending */

typedef enum spool_durability {
  SPOOL_DURABILITY_QUEUE = 0, /* the queue's sync policy */
  SPOOL_DURABILITY_SYNC = 1   /* this call returns only once on disk (shares fdatasyncs) */
} spool_durability;

/* Bounds of a message's attributes and dedup id (docs/semantics.md, "Attributes" and
 * "Deduplication"), checked at send: SPOOL_INVALID_ARGUMENT naming the key and the bound. */
#define SPOOL_MAX_ATTRIBUTES 16        /* pairs per message */
#define SPOOL_MAX_ATTRIBUTE_KEY 64     /* bytes of a key: 1 to 64 of [A-Za-z0-9._-] */
#define SPOOL_MAX_ATTRIBUTE_VALUE 1024 /* bytes of a value (any bytes) */
#define SPOOL_MAX_ATTRIBUTES_TOTAL 4096 /* bytes of all keys and values together */
#define SPOOL_MAX_DEDUP_ID 128         /* bytes of a dedup id (any bytes) */

/* Priorities (docs/semantics.md, "Priorities"): 0 is the most urgent, 255 the least; a
 * message sent without one has this. Receive takes the most urgent ready message first. */
#define SPOOL_DEFAULT_PRIORITY 128

/* Ordered groups (docs/semantics.md, "Ordered groups"): a group key is 1 to this many bytes
 * (any bytes); SPOOL_INVALID_ARGUMENT naming the field beyond. */
#define SPOOL_MAX_GROUP 128

/* One attribute of a message: given to a send, or handed out with a received message. Fixed
 * layout: it never grows. */
typedef struct spool_attribute {
  const char* key;   /* NUL-terminated */
  const void* value; /* value_len bytes; from the library also followed by a NUL */
  size_t value_len;
} spool_attribute;

typedef struct spool_send_options {
  size_t size;               /* sizeof(spool_send_options) */
  uint64_t delay_ms;         /* receivable only after this; 0 */
  int durability;            /* a spool_durability; SPOOL_DURABILITY_QUEUE */
  uint64_t wait_for_room_ms; /* at a back-pressure limit, wait this long for room; 0: fail */
  /* ---- since 0.2.0 (a struct of 0.1.0 ends here: its size is 32 on LP64) */
  /* Set on the message (spool_send; every message of spool_send_batch): attribute_count
   * pairs, distinct keys, read during the call only. NULL, 0: none. Not with
   * spool_send_items (each item has its own). */
  const spool_attribute* attributes;
  size_t attribute_count;
  /* Deduplication (spool_send only): when a message with this id (dedup_id_len bytes, any
   * bytes) was sent within the queue's dedup window, nothing is queued and *id gets the first
   * message's id. NULL, 0: none. */
  const void* dedup_id;
  size_t dedup_id_len;
  /* Priority of the message (spool_send; every message of spool_send_batch; not with
   * spool_send_items, whose items have their own): with has_priority nonzero, `priority`, 0
   * (most urgent) to 255, else SPOOL_INVALID_ARGUMENT; with has_priority 0,
   * SPOOL_DEFAULT_PRIORITY. A flag beside the value because a zeroed field must mean "as
   * before" (docs/api.md, "Structs that grow") and priority 0 is the most urgent. */
  int has_priority;
  int priority;
  /* spool_send only (a batch refuses it: spool_send_items reports per item): if not NULL,
   * set on success to 1 when the send was a duplicate (its dedup id was remembered: nothing
   * was queued and *id is the first message's), else to 0. */
  int* duplicate;
  /* Ordered group (spool_send; every message of spool_send_batch; not with spool_send_items,
   * whose items have their own): group_len bytes (any bytes, 1 to SPOOL_MAX_GROUP), read
   * during the call only. The messages of one group are received one at a time, in send
   * order. NULL, 0: none. */
  const void* group;
  size_t group_len;
} spool_send_options;

/* Fills the first `size` bytes of *opts (at most sizeof(spool_send_options)) with the
 * defaults (no delay, the queue's durability, no attributes, no dedup id, the default
 * priority, no duplicate flag, no group), and opts->size
 * with that many; called through the macro below. */
void spool_send_options_init_size(spool_send_options* opts, size_t size);
/* 0.1.0's function: fills only 0.1.0's fields (size 32), see spool_options_init. */
void spool_send_options_init(spool_send_options* opts);
#define spool_send_options_init(opts) spool_send_options_init_size((opts), sizeof *(opts))

/* Appends one message of `len` bytes (any bytes; payload may be NULL when len is 0). opts may
 * be NULL (no delay, the queue's durability). *id (if id is not NULL) gets its id; ids
 * increase; a duplicate (opts->dedup_id) gets the first message's, and *opts->duplicate
 * tells it was one. Errors: SPOOL_TOO_LARGE,
 * SPOOL_QUEUE_FULL, SPOOL_NO_SPACE, SPOOL_READ_ONLY, SPOOL_IO, SPOOL_INVALID_ARGUMENT (bad
 * attributes or dedup id: the message names the key and the bound). */
spool_code spool_send(spool_queue* q, const void* payload, size_t len,
                      const spool_send_options* opts, uint64_t* id);

/* All or nothing: either all n payloads are queued with consecutive ids (written to ids[0..n)
 * if ids is not NULL) or none is. opts->attributes, opts->priority and opts->group go on
 * every message (a group's batch is received one at a time, in this order); a
 * dedup id cannot be shared by a batch, so there is no duplicate to report either
 * (SPOOL_INVALID_ARGUMENT for opts->dedup_id or opts->duplicate): give each message its own
 * with spool_send_items. */
spool_code spool_send_batch(spool_queue* q, const void* const* payloads, const size_t* lens,
                            size_t n, const spool_send_options* opts, uint64_t* ids);

/* One message of spool_send_items. A zeroed item is an empty message with nothing else. */
typedef struct spool_send_item {
  const void* payload;                /* len bytes (NULL when len is 0) */
  size_t len;
  const spool_attribute* attributes;  /* as spool_send_options; NULL, 0: none */
  size_t attribute_count;
  const void* dedup_id;               /* as spool_send_options; NULL, 0: none */
  size_t dedup_id_len;
  int has_priority;                   /* as spool_send_options: 0, the default priority */
  int priority;
  int* duplicate;                     /* if not NULL, set on success: 1 for a duplicate */
  const void* group;                  /* as spool_send_options; NULL, 0: none */
  size_t group_len;
} spool_send_item;

/* A batch in which each message has its own attributes, dedup id, priority and group. item_size is
 * sizeof(spool_send_item) as the caller compiled it (the array's stride; fields past it read
 * as none). ids[i] (n entries, if ids is not NULL) gets item i's id: a duplicate's is the
 * first message's (sent earlier, or earlier in this batch). All or nothing; the new messages
 * get consecutive ids; *items[i].duplicate tells which were duplicates. opts (may be NULL)
 * gives delay, durability and wait_for_room; its attributes, dedup id, priority,
 * duplicate and group must be unset. Bad attributes, dedup ids, priorities or groups:
 * SPOOL_INVALID_ARGUMENT naming the item. */
spool_code spool_send_items(spool_queue* q, const spool_send_item* items, size_t n,
                            size_t item_size, const spool_send_options* opts, uint64_t* ids);

/* The durable watermark: every message with an id <= this is on disk. One atomic load. */
uint64_t spool_durable_id(spool_queue* q);

/* ---------------------------------------------------------------------- receiving */

/* One delivery. The strings and the payload belong to the batch they came in and stay valid
 * until spool_messages_free, also after an ack. The payload is read-only: with
 * spool_receive it points into the queue's memory-mapped segment (zero-copy). */
typedef struct spool_message {
  uint64_t id;
  const void* payload;
  size_t payload_len;
  uint32_t receive_count; /* 1 on first delivery */
  int64_t enqueued_ns;    /* when it was sent: nanoseconds since the Unix epoch */
  const char* receipt;    /* NUL-terminated; names this delivery's lease; "" for peek */
} spool_message;

/* Leases up to `max` messages for visibility_ms (0: the queue's default). With wait_ms > 0
 * sleeps until a message is receivable or wait_ms passes, woken at once by any process (the
 * calling thread blocks; other threads may use q meanwhile). On SPOOL_OK, *msgs is an array
 * of *count >= 1 messages, to free with spool_messages_free. On SPOOL_EMPTY (nothing in
 * time) and on errors, *msgs is NULL and *count 0. */
spool_code spool_receive(spool_queue* q, size_t max, uint64_t visibility_ms, uint64_t wait_ms,
                         spool_message** msgs, size_t* count);

/* Leases message `id` if it is receivable now: SPOOL_NOT_FOUND if it is gone, SPOOL_EMPTY if
 * it is leased or delayed. *msg is an array of one, freed with spool_messages_free. */
spool_code spool_receive_id(spool_queue* q, uint64_t id, uint64_t visibility_ms,
                            spool_message** msg);

/* Up to `max` messages in id order without receiving them (receipt ""). SPOOL_OK with
 * *count 0 and *msgs NULL when the queue is empty. */
spool_code spool_peek(spool_queue* q, size_t max, spool_message** msgs, size_t* count);

/* Frees a batch from spool_receive, spool_receive_id or spool_peek (the pointer returned
 * there, whole). NULL is a no-op. */
void spool_messages_free(spool_message* msgs);

/* The attributes of msgs[i], where msgs is a whole batch as spool_receive, spool_receive_id
 * or spool_peek returned it: *attrs is an array of *count pairs in key order (NULL and 0 when
 * it has none), valid until spool_messages_free. SPOOL_INVALID_ARGUMENT if i is not in the
 * batch, or if msgs is a pointer into a batch (&msgs[i]) rather than the array itself. */
spool_code spool_message_attributes(const spool_message* msgs, size_t i,
                                    const spool_attribute** attrs, size_t* count);

/* Looks up the attribute `key` of msgs[i] (msgs as above): SPOOL_OK with *value (followed by
 * a NUL) and *value_len (either may be NULL), valid until spool_messages_free;
 * SPOOL_NOT_FOUND (outputs NULL, 0) when the message has no such attribute. */
spool_code spool_message_attribute(const spool_message* msgs, size_t i, const char* key,
                                   const void** value, size_t* value_len);

/* The priority of msgs[i] (msgs as above), 0 (most urgent) to 255, into *priority: the one
 * it was sent with, SPOOL_DEFAULT_PRIORITY if none. SPOOL_INVALID_ARGUMENT as for
 * spool_message_attributes. */
spool_code spool_message_priority(const spool_message* msgs, size_t i, int* priority);

/* The ordered group of msgs[i] (msgs as above): *group points to *group_len bytes (followed
 * by a NUL, but a key may hold NULs too), valid until spool_messages_free; NULL and 0 when
 * the message has no group. SPOOL_INVALID_ARGUMENT as for spool_message_attributes. */
spool_code spool_message_group(const spool_message* msgs, size_t i, const void** group,
                               size_t* group_len);

/* What spool_list tells about a message without reading its payload. */
typedef struct spool_message_info {
  uint64_t id;
  uint32_t size; /* payload bytes */
  uint32_t receive_count;
  int ready; /* receivable now (0: leased, delayed, or blocked behind its group's first) */
} spool_message_info;

/* Up to `max` messages in id order (only receivable ones with ready_only); *infos is freed
 * with spool_free (NULL when *count is 0). */
spool_code spool_list(spool_queue* q, size_t max, int ready_only, spool_message_info** infos,
                      size_t* count);

/* Frees memory this library returned for the caller to free (spool_list). NULL: no-op. */
void spool_free(void* p);

/* ---------------------------------------------------------------------- settling */

/* Deletes the message (durability: a spool_durability). SPOOL_LEASE_LOST if the lease
 * expired and the message was received again (nothing changes); SPOOL_NOT_FOUND if it is
 * already gone; SPOOL_INVALID_ARGUMENT for a malformed receipt. */
spool_code spool_ack(spool_queue* q, const char* receipt, int durability);
/* Acks n receipts at once (as SQS's DeleteMessageBatch), under one lock, in one append and
 * one sync: results[i] (results may be NULL) gets receipt i's own code, as spool_ack would
 * give it (a receipt given twice: the second SPOOL_NOT_FOUND). Returns SPOOL_OK when every
 * receipt was acked, else the first failed receipt's code (spool_last_error names it) or
 * the error that stopped the call as a whole (every results[i] then has it: none acked). */
spool_code spool_ack_batch(spool_queue* q, const char* const* receipts, size_t n, int durability,
                           spool_code* results);
/* Makes the message receivable again after delay_ms. Same errors as spool_ack. */
spool_code spool_nack(spool_queue* q, const char* receipt, uint64_t delay_ms);
/* Renews the lease to end visibility_ms from now. Same errors as spool_ack. */
spool_code spool_extend(spool_queue* q, const char* receipt, uint64_t visibility_ms);
/* Deletes message `id` without a receipt, whatever its state (ready, leased, delayed), as an
 * ack would (it counts in acked_total; a receipt still held for it then gets
 * SPOOL_NOT_FOUND), but for good: spool_replay never sends it again. SPOOL_NOT_FOUND if no
 * message `id` is in the queue. */
spool_code spool_remove(spool_queue* q, uint64_t id, int durability);

/* Instant release on death: binds the leases this handle takes from now on
 * (spool_bind_leases), or the one lease `receipt` names (spool_bind), to this process; when
 * it dies they return to ready at once instead of after their visibility. SPOOL_QUEUE_FULL
 * when 128 processes are bound. */
spool_code spool_bind_leases(spool_queue* q);
spool_code spool_bind(spool_queue* q, const char* receipt);

/* ---------------------------------------------------------------------- lease keeper */

typedef struct spool_keeper spool_keeper;

/* Starts renewing the lease `receipt` names (spool::LeaseKeeper): every interval_ms it
 * extends the lease to extend_by_ms from now, until stopped, until max_lifetime_ms has
 * passed, or until a renewal fails (then spool_keeper_status tells why). Binds the lease to
 * the process. Runs a thread of its own. q must outlive the keeper. */
spool_code spool_keeper_start(spool_queue* q, const char* receipt, uint64_t interval_ms,
                              uint64_t extend_by_ms, uint64_t max_lifetime_ms,
                              spool_keeper** out);
/* SPOOL_OK while renewing; the renewal's error (SPOOL_LEASE_LOST, ...) once one failed
 * (with spool_last_error set). */
spool_code spool_keeper_status(spool_keeper* k);
/* Renewals that succeeded. */
uint64_t spool_keeper_renewals(spool_keeper* k);
/* Stops renewing (neither acks nor nacks) and frees the keeper. NULL is a no-op. */
void spool_keeper_free(spool_keeper* k);

/* ---------------------------------------------------------------------- inspecting */

typedef struct spool_stats {
  size_t size; /* sizeof(spool_stats): set it before spool_get_stats */
  uint64_t ready;
  uint64_t in_flight;
  uint64_t delayed;
  uint64_t dead;
  double oldest_ready_age_s;
  uint64_t sent_total;
  uint64_t acked_total;
  uint64_t dead_lettered_total;
  uint64_t expired_total;
  uint64_t nacked_total;
  uint64_t bytes;
  uint64_t bytes_on_disk;
  uint64_t segments;
  uint64_t next_id;
  /* ---- since 0.2.0 */
  uint64_t dedup_ids; /* dedup ids remembered now (sent within the dedup window) */
  uint64_t kept_acked;       /* acked messages kept for replay (within keep_acked) */
  uint64_t kept_acked_bytes; /* and their payload bytes */
  uint64_t blocked;   /* in an ordered group, behind an earlier message of it */
  uint64_t paused;    /* 1 while the queue is paused (spool_pause), else 0 */
  /* with subscriptions: disk this handle's reader alone holds back (Stats::held_back_bytes) */
  uint64_t held_back_bytes;
} spool_stats;

/* Fills the fields of *out that fit in out->size (SPOOL_INVALID_ARGUMENT if it is 0). */
spool_code spool_get_stats(spool_queue* q, spool_stats* out);

/* ceil(ready / (rate_per_worker * latency_target_s)): workers a backlog needs. */
uint64_t spool_workers_needed(const spool_stats* stats, double rate_per_worker,
                              double latency_target_s);

/* Makes every write so far durable, whatever the sync policy. */
spool_code spool_sync(spool_queue* q);

/* Removes every message; *removed (if not NULL) gets how many. */
spool_code spool_purge(spool_queue* q, uint64_t* removed);

/* Operator actions (docs/operations.md). spool_pause: sends are accepted, receives get
 * nothing (SPOOL_EMPTY; long polls sleep on) until spool_resume, which wakes them at once.
 * Stored in the log and synced: holds across restarts. spool_release: the lease of message
 * `id` ends now, the message is ready again (SPOOL_NOT_FOUND if the queue does not hold it,
 * SPOOL_INVALID_ARGUMENT if it is not leased). */
spool_code spool_pause(spool_queue* q);
spool_code spool_resume(spool_queue* q);
spool_code spool_release(spool_queue* q, uint64_t id);

typedef struct spool_compact_result {
  uint64_t segments_removed;
  uint64_t messages_copied;
  uint64_t bytes_freed;
} spool_compact_result;

/* Reclaims the disk of acked messages now (spool::Queue::compact). out may be NULL. */
spool_code spool_compact(spool_queue* q, spool_compact_result* out);

/* fsck (spool::Queue::verify): SPOOL_OK and *problems 0 when the queue is sound; with
 * `repair`, rebuilds the index from the log if they disagree. *report (if not NULL) gets a
 * text, one problem or repair per line, freed with spool_free. */
spool_code spool_verify(spool_queue* q, int repair, size_t* problems, char** report);

/* ---------------------------------------------------------------------- subscriptions */

/* Subscriptions (docs/semantics.md, "Subscriptions"): named readers of the queue's one
 * stream, each getting every message sent after it was added (with from_start != 0, also
 * every message in the queue then) from the one stored copy, with leases and acks of its
 * own. A name is 1 to 48 bytes of [A-Za-z0-9._-], not "default"; at most 16 at once.
 * Adding a name that exists, a 17th or a bad name is SPOOL_INVALID_ARGUMENT; removing an
 * unknown one SPOOL_NOT_FOUND. Both are synced before they return. q may be any handle of
 * the queue (its own view or a subscription's). */
spool_code spool_add_subscription(spool_queue* q, const char* name, int from_start);
/* As spool_add_subscription, with a max_receives of the subscription's own: a message is
 * dead-lettered from this subscription (into the queue's dead-letter queue, marked
 * spool.dead.subscription=NAME; see spool_redrive_subscription) on the receive after its
 * max_receives-th delivery there, whatever the queue's max_receives and the other views'
 * counts. 0: the queue's max_receives. Stored with the subscription, in the log. */
spool_code spool_add_subscription_max_receives(spool_queue* q, const char* name, int from_start,
                                               uint32_t max_receives);
spool_code spool_remove_subscription(spool_queue* q, const char* name);

/* A subscription as spool_subscriptions tells it. */
typedef struct spool_subscription_info {
  const char* name;   /* NUL-terminated, in the same allocation as the array */
  uint64_t from;      /* the first message id it gets */
  uint64_t messages;  /* in it now, leased or not */
  uint64_t in_flight; /* of them, leased */
  uint32_t max_receives; /* its own (spool_add_subscription_max_receives); 0: the queue's */
} spool_subscription_info;

/* The queue's subscriptions: *subs is an array of *count (NULL and 0 when it has none),
 * freed whole, names included, with one spool_free. */
spool_code spool_subscriptions(spool_queue* q, spool_subscription_info** subs, size_t* count);

/* ---------------------------------------------------------------------- dead letters */

/* The dead-letter queue (dir/dlq) as a handle owned by q: valid until q is closed; do not
 * close it yourself (spool_close ignores it). */
spool_code spool_dead_letters(spool_queue* q, spool_queue** dlq);

/* Moves up to `max` dead letters back into q as new messages; *moved gets how many. Each
 * goes back to the view it died in only: one marked spool.dead.subscription=NAME to
 * subscription NAME alone, one without the mark to the queue's own view (every view while
 * the queue has no subscriptions); one whose subscription was removed stays and is not
 * counted. On a subscription's handle, only that subscription's dead letters. */
spool_code spool_redrive(spool_queue* q, size_t max, uint64_t* moved);

/* The dead letters of one subscription (docs/semantics.md, "Subscriptions"): those marked
 * spool.dead.subscription=`subscription`, i.e. dead-lettered from that subscription (past
 * its max_receives, or by its consumer); "" names every dead letter, whatever its mark and
 * whatever q's view. NULL is SPOOL_INVALID_ARGUMENT. A name with no dead letters (or no
 * subscription) is not an error: nothing matches.
 *
 * spool_redrive_subscription: as spool_redrive, but only those dead letters, each back to
 * that subscription alone; *moved (may be NULL) gets how many.
 * spool_peek_dead_letters: up to `max` of them in dead-letter id order without receiving
 * them, as spool_peek gives them (ids are the dead-letter queue's; the spool.dead.*
 * attributes tell where each came from): SPOOL_OK with *count 0 and *msgs NULL when there
 * are none; free with spool_messages_free.
 * spool_purge_dead_letters: deletes them; *removed (may be NULL) gets how many.
 * With a name, peek and purge read the record of every dead letter (the dead-letter queue
 * has no index by mark), a page at a time: memory holds only the matches. */
spool_code spool_redrive_subscription(spool_queue* q, size_t max, const char* subscription,
                                      uint64_t* moved);
spool_code spool_peek_dead_letters(spool_queue* q, const char* subscription, size_t max,
                                   spool_message** msgs, size_t* count);
spool_code spool_purge_dead_letters(spool_queue* q, const char* subscription, uint64_t* removed);

/* Replay after ack (spool::Queue::replay): sends the messages acked between since_ms and
 * until_ms ago (since_ms > until_ms >= 0) again as new messages, into q, or into the existing
 * queue in directory `to` when it is not NULL. *replayed and *missing (acked in the window
 * but removed by compaction) may be NULL. */
spool_code spool_replay(spool_queue* q, uint64_t since_ms, uint64_t until_ms, const char* to,
                        uint64_t* replayed, uint64_t* missing);

#ifdef __cplusplus
}
#endif

#endif /* SPOOL_SPOOL_H */
