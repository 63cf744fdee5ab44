// spool: a persistent, brokerless message queue for worker processes on one host.
//
// A queue is a directory. Any number of processes open it with Queue::open and send,
// receive, ack, nack and extend concurrently; no daemon is involved. Delivery is
// at-least-once with SQS-style leases: a received message is hidden for its visibility
// timeout and comes back if it is not acked in time. Semantics: docs/semantics.md;
// durability: docs/durability.md.
//
// Thread- and process-safety: a Queue may be shared by the threads of one process. Do not
// use a Queue object in a child after fork(); open the queue again there.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spool/status.h"

namespace spool {

class Env;
namespace io {
class Io;
}

using Millis = std::chrono::milliseconds;

// A message's attributes: small string key/value pairs carried beside the payload
// (docs/semantics.md, "Attributes"): at most 16 pairs; keys 1 to 64 bytes of
// [A-Za-z0-9._-]; values at most 1024 bytes; keys and values together at most 4096 bytes.
using Attributes = std::map<std::string, std::string>;

enum class SyncPolicy {
  kAlways,    // send/ack return only once on disk; concurrent callers share one fdatasync
  kInterval,  // synced at most sync_interval after a write (default)
  kNever,     // left to the kernel's writeback
};

// Settings of a queue. Those marked [stored] are fixed when the queue is created and kept
// in its spool.conf; opening an existing queue ignores the values passed here for them.
struct QueueOptions {
  Millis visibility{30000};        // [stored] default lease length of receive()
  uint32_t max_receives = 10;      // [stored] deliveries before a message is dead-lettered; 0: never
  SyncPolicy sync = SyncPolicy::kInterval;  // [stored]
  Millis sync_interval{50};        // [stored]
  // [stored] the largest segment file (4 KiB .. 1 TiB). A queue's first segment is 256 KiB
  // (or this, if less) and each next one twice the one before, up to this.
  uint64_t segment_size = 64ull << 20;
  // [stored] largest message; 0: 1 MiB, or what fits one segment if that is less.
  uint64_t max_payload = 0;
  // [stored] Retention, off (0) by default: ready messages older than max_age, and the
  // oldest ready messages while the queue holds more than max_bytes of payload, are
  // dropped (logged at warn level, counted in Stats::expired_total). Enforced when messages
  // are received (age), sent (bytes; age now and then) and at compaction's start, in every
  // subscription too (each counts its own bytes: docs/semantics.md, "Subscriptions");
  // leased and delayed messages are never dropped.
  Millis retention_max_age{0};
  uint64_t retention_max_bytes = 0;
  // [stored] Back-pressure, off (0) by default: a send that would leave more than max_ready
  // messages waiting (ready or delayed, not leased), or more than max_bytes of payload in
  // the queue, fails with kQueueFull (or waits for room, see SendOptions). With
  // subscriptions the fullest reader counts, unless a retention limit is set.
  uint64_t max_ready = 0;
  uint64_t max_bytes = 0;
  // [stored] How long a deduplication id is remembered after its message was sent
  // (SendOptions::dedup_id): 1 ms to 7 days.
  Millis dedup_window{300000};
  // [stored] Replay after ack, off (0) by default: an acked message stays in the log, its
  // payload and attributes readable by replay(), for this long after its ack; compaction
  // keeps the segments that hold it until then (docs/semantics.md, "Replay after ack"). 0 to 30 days.
  Millis keep_acked{0};
  // Not stored: the subscription (Queue::add_subscription) this handle reads; empty: the
  // queue's own view. receive, receive_id, ack, nack, extend, dead_letter, bind, bind_leases,
  // peek, list, count, show, stats and replay act on that subscription's messages (replay:
  // its acks, sent back to it only); remove, purge, pause, resume, release and move_to are
  // the queue's own (kInvalidArgument on a subscription's handle), and a pause holds back
  // every subscription too. A subscription's dead letters go to the queue's dead-letter
  // queue, marked spool.dead.subscription, and a redrive sends them back to it only. An
  // unknown name is kNotFound at open; a removed one at the next call.
  std::string subscription = {};
  bool create = true;              // create the queue if the directory holds none
  // At creation only (the directory holds no spool.conf yet): the mode of the queue's
  // files (0: what the umask leaves of 0666; 0660 for a queue a group shares, 0664 to let
  // everyone else read it) and the group of its directory (-1: the creator's). The
  // directory gets that mode (plus search where it grants read, and set-group-ID when the
  // group may write), and every file spool makes in it later, by any user, takes the mode
  // and group the directory has then (docs/security.md, "Who may do what").
  uint32_t mode = 0;
  int64_t group = -1;
  // Internal (src/env/env.h): what the queue and its dead-letter queue run on: the file I/O
  // (spool.conf, the index and the segments alike), the clocks, sleep and the test hooks.
  // Empty: the default (real clocks, the SPOOL_IO backend). Tests put a fault-injecting Io
  // or a clock they move by hand here; not stored.
  std::shared_ptr<Env> env = {};
};

// A subscription (Queue::subscriptions()).
struct SubscriptionInfo {
  std::string name;
  uint64_t from = 0;      // the first message id it gets
  uint64_t messages = 0;  // in it now, leased or not
  uint64_t leased = 0;
  uint64_t expired_total = 0;  // dropped from it by a retention limit
  // Disk it alone holds back: the segments from the one holding its oldest message up to
  // the oldest one the queue's other views (or the log's head) need (Stats::held_back_bytes).
  uint64_t held_back_bytes = 0;
  uint32_t max_receives = 0;  // its own (add_subscription); 0: the queue's
};

// Per-call durability: kSync makes this one call return only once it is on disk, on a queue
// whose policy is interval or never (concurrent kSync callers share one fdatasync).
enum class Durability { kQueuePolicy, kSync };

// Priorities (docs/semantics.md, "Priorities"): 0 is the most urgent, 255 the least; a
// message sent without one has this.
inline constexpr uint8_t kDefaultPriority = 128;

struct SendOptions {
  Millis delay{0};  // receivable only after this
  Durability durability = Durability::kQueuePolicy;
  // When the queue is at max_ready / max_bytes: wait up to this long for room (woken at once
  // when consumers make room) before failing with kQueueFull. 0: fail at once.
  Millis wait_for_room{0};
  // Set on the message (send(); every message of a send_batch of payloads).
  Attributes attributes = {};
  // Deduplication (docs/semantics.md): when a message with this id was sent within the
  // queue's dedup_window, nothing is queued and the first message's id is returned (the
  // send overloads with a duplicate flag tell which happened). At most 128 bytes; empty:
  // none. send() only: a batch gives one per message (SendItem).
  std::string dedup_id = {};
  // Receive takes the most urgent ready message first (0 first), the oldest first among
  // equals; a nacked or delayed message keeps its priority. Every message of a send_batch
  // of payloads.
  uint8_t priority = kDefaultPriority;
  // Ordered group (docs/semantics.md, "Ordered groups"): the messages of one group are
  // received one at a time, in send order; the next only once the one before is acked,
  // dead-lettered or dropped. 1-128 bytes (any); empty: none. Every message of a send_batch
  // of payloads.
  std::string group = {};
};

// One message of a send_batch that gives each message its own attributes and dedup id.
struct SendItem {
  std::string_view payload;
  Attributes attributes = {};
  std::string dedup_id = {};  // as SendOptions::dedup_id; duplicates within the batch count too
  uint8_t priority = kDefaultPriority;
  std::string group = {};  // as SendOptions::group
};

struct Message {
  uint64_t id = 0;
  std::string payload;
  uint32_t receive_count = 0;  // 1 on first delivery
  std::chrono::system_clock::time_point enqueued;
  std::string receipt;  // names this delivery's lease; empty for peek()
  Attributes attributes = {};
  uint8_t priority = kDefaultPriority;
  std::string group = {};  // its ordered group, or empty
};

// A received message whose payload was not copied: a view into the queue's memory-mapped
// segment file, valid for as long as this object lives (it keeps the segment mapped, also
// after an ack, and after compaction removes the file). Read-only, like the mapping.
struct MessageView {
  uint64_t id = 0;
  std::string_view payload;
  uint32_t receive_count = 0;
  std::chrono::system_clock::time_point enqueued;
  std::string receipt;
  std::shared_ptr<const void> keep;  // the mapping; not for use
  Attributes attributes = {};
  uint8_t priority = kDefaultPriority;
  std::string group = {};
};

// Where a message in the queue stands. Dead letters are in dead_letters(), not here.
enum class MessageState : uint8_t {
  kReady,     // receivable now (an expired lease included)
  kInFlight,  // leased, the lease not yet ended
  kDelayed,   // sent or nacked with a delay that has not passed
  kBlocked,   // in an ordered group, behind an earlier message of it
};
const char* state_name(MessageState s);  // "ready", "in_flight", "delayed", "blocked"

// Which states list() returns.
struct StateFilter {
  bool ready = true, in_flight = true, delayed = true, blocked = true;
  static StateFilter only(MessageState s);
  bool has(MessageState s) const;
};

// What list() and show() tell about a message without reading its payload.
struct MessageInfo {
  uint64_t id = 0;
  uint32_t size = 0;           // payload bytes
  uint32_t receive_count = 0;
  bool ready = false;          // state == kReady
  MessageState state = MessageState::kReady;
  // In flight: when the lease ends; delayed: when it becomes receivable; ready: zero. Wall
  // clock, as of the call (the queue keeps deadlines on the boot clock).
  std::chrono::system_clock::time_point due{};
  // In flight on a lease bound to its holder's life (bind_leases): the holder's pid as it
  // saw itself (its PID namespace's); 0 otherwise.
  int32_t holder_pid = 0;
  // From the message's record, as show() gives them: its priority and ordered group (empty:
  // none), and when it was sent (wall clock as of the call, as Message::enqueued).
  uint8_t priority = kDefaultPriority;
  std::string group = {};
  std::chrono::system_clock::time_point enqueued{};
  // A dead letter (a message of dead_letters()): the id it had in the queue it was
  // dead-lettered from (its spool.dead.original_id attribute); 0 for a message without one.
  uint64_t original_id = 0;
};

struct Stats {
  uint64_t ready = 0;      // receivable now (including expired leases)
  uint64_t in_flight = 0;  // leased and not yet expired
  uint64_t delayed = 0;    // sent or nacked with a delay that has not passed
  uint64_t blocked = 0;    // in an ordered group, behind an earlier message of it
  uint64_t dead = 0;       // messages in the dead-letter queue
  double oldest_ready_age_s = 0;
  uint64_t sent_total = 0;
  uint64_t acked_total = 0;
  uint64_t dead_lettered_total = 0;
  uint64_t expired_total = 0;  // dropped by a retention limit
  uint64_t nacked_total = 0;   // nacks (each returned a message to the queue)
  uint64_t received_total = 0;     // deliveries (each receive of a message counts once)
  uint64_t redelivered_total = 0;  // of them, deliveries of a message received before
  uint64_t bytes = 0;          // payload bytes of the messages in the queue (leased included)
  uint64_t bytes_on_disk = 0;
  uint64_t segments = 0;
  // With subscriptions: the disk this handle's view alone holds back, i.e. what compaction
  // could free if it acked its messages older than every other view's oldest: the segments
  // from the one holding its oldest message's record up to, not including, the oldest one
  // another view (or the log's head) needs. 0 without subscriptions.
  uint64_t held_back_bytes = 0;
  uint64_t next_id = 0;
  // Deduplication ids remembered now: those of messages sent with one within the queue's
  // dedup_window (a count of the index's dedup table, O(table size)).
  uint64_t dedup_ids = 0;
  // Replay after ack (QueueOptions::keep_acked): the messages acked within the keep_acked
  // window, whose payloads compaction keeps for replay(), and their payload bytes. Counted
  // in steps of 1/30 of the window (a message acked up to that much earlier may be counted).
  uint64_t kept_acked = 0;
  uint64_t kept_acked_bytes = 0;
  bool paused = false;  // Queue::pause(): receives deliver nothing until resume()
  // The processes whose leases are bound to their life (bind_leases; `spool work` binds, so
  // for it this is the number of commands running), each with the unexpired leases it holds.
  struct Holder {
    int32_t pid = 0;  // as the holder saw itself (as list() shows it)
    uint64_t in_flight = 0;
    // Seconds since its last receive or extend of a lease it holds bound (its last renewal);
    // -1 when none is recorded (its leases were taken by another handle and bound with bind()).
    double renewed_ago_s = -1;
  };
  std::vector<Holder> holders;  // by pid
  // Workers needed to drain the ready backlog within `latency_target_s` when each worker
  // handles `rate_per_worker` messages per second: ceil(ready / (rate × target)).
  uint64_t workers_needed(double rate_per_worker, double latency_target_s) const;
};

// Called now and then by long operations (compact, verify) with the work done so far and
// the total, in the same units; for progress bars. May be empty. It may be called with the
// queue's lock held: it must not call back into the same queue.
using Progress = std::function<void(uint64_t done, uint64_t total)>;

struct CompactResult {
  uint64_t segments_removed = 0;
  uint64_t messages_copied = 0;  // live messages moved out of the removed segments
  uint64_t bytes_freed = 0;      // disk space of the removed segment files
};

// Which acked messages replay() sends again: those whose ack lies between `since` and
// `until` before now (docs/semantics.md, "Replay after ack").
struct ReplayOptions {
  Millis since{0};  // required: acked at most this long ago (> until)
  Millis until{0};  // acked at least this long ago; 0: up to now
  // The queue directory to send them to (an existing queue); empty: this queue.
  std::string to = {};
  uint64_t max = UINT64_MAX;  // at most this many (the oldest acks first)
};

struct ReplayResult {
  uint64_t replayed = 0;  // sent again as new messages
  // Acked within the window but no longer replayable: compaction removed the message's
  // MSG record and kept its ACK (keep_acked off, or shorter than the window asked for).
  // An ack whose ACK record compaction removed too is not seen at all.
  uint64_t missing = 0;
  std::vector<uint64_t> ids;  // the new messages' ids, in the order sent
};

struct VerifyReport {
  uint64_t segments = 0;   // segment files checked
  uint64_t records = 0;    // valid records read
  uint64_t messages = 0;   // live messages per the log
  std::vector<std::string> problems;  // each names the file and offset, or the message
  std::vector<std::string> repairs;   // what repair did
  bool ok() const { return problems.empty(); }
};

class Queue {
 public:
  // Opens the queue in `dir`, creating it if allowed (its dead-letter queue, dir/dlq, is
  // created when first needed).
  // Errors: kNotAQueue (a directory with other files, a file), kIncompatible (newer
  // format), kReadOnly (no write permission: only stats() and peek() work), kIo.
  static Result<std::unique_ptr<Queue>> open(const std::string& dir, const QueueOptions& opts = {});
  ~Queue();
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;

  // Appends a message; it becomes receivable after `delay`. Returns its id (ids increase).
  Result<uint64_t> send(std::string_view payload, Millis delay = Millis{0});
  // All or nothing: either every payload is queued (consecutive ids) or none is.
  Result<std::vector<uint64_t>> send_batch(std::span<const std::string_view> payloads,
                                           Millis delay = Millis{0});
  Result<uint64_t> send(std::string_view payload, const SendOptions& opts);
  Result<std::vector<uint64_t>> send_batch(std::span<const std::string_view> payloads,
                                           const SendOptions& opts);
  // Each message with its own attributes and dedup id (opts.attributes and opts.dedup_id
  // must be empty). Returns one id per item, in order: a duplicate's is the first message's
  // (sent earlier, or earlier in this batch). All or nothing, as above; the new messages
  // get consecutive ids. Bad attributes or dedup ids: kInvalidArgument naming the item.
  Result<std::vector<uint64_t>> send_batch(std::span<const SendItem> items, const SendOptions& opts = {});
  // As above, and tell whether each message was a duplicate (its dedup id was remembered:
  // nothing was queued for it and its id is the first message's): *duplicate for send(),
  // (*duplicates)[i] for item i (resized to the batch), set on success; may be null. An
  // out-parameter of its own overload, not a field of SendOptions or SendItem: send() keeps
  // returning the id that most callers want, the flag shows at the call that asks for it,
  // and no struct's layout changes.
  Result<uint64_t> send(std::string_view payload, const SendOptions& opts, bool* duplicate);
  Result<std::vector<uint64_t>> send_batch(std::span<const SendItem> items, const SendOptions& opts,
                                           std::vector<bool>* duplicates);
  // The durable watermark: every message with an id <= durable_id() is on disk (by this
  // or any other process's sync). Cheap (one atomic load).
  uint64_t durable_id();

  // Leases up to `max` messages for `visibility` (0: the queue's default). With `wait` > 0
  // sleeps until a message is receivable or `wait` passes, woken at once by any process.
  // kEmpty when nothing was receivable in time.
  Result<std::vector<Message>> receive(size_t max = 1, Millis visibility = Millis{0},
                                       Millis wait = Millis{0});

  // receive() without copying payloads (zero-copy): for large messages, or to hand a
  // payload to write()/send() straight from the page cache.
  Result<std::vector<MessageView>> receive_views(size_t max = 1, Millis visibility = Millis{0},
                                                 Millis wait = Millis{0});

  // Leases the message `id` if it is receivable now: kNotFound if it is gone (or was just
  // dead-lettered), kEmpty if it is leased or delayed. For faces that name messages, like
  // the filesystem view.
  Result<Message> receive_id(uint64_t id, Millis visibility = Millis{0});

  // Deletes the message. kLeaseLost if the lease expired and the message was received
  // again (the receipt is stale: nothing changes); kNotFound if it is already gone.
  Status ack(std::string_view receipt, Durability durability = Durability::kQueuePolicy);
  // Acks many received messages at once (as SQS's DeleteMessageBatch): each receipt as
  // ack() would, its outcome at its index in the result (a receipt given twice: the second
  // is kNotFound), in one append under one lock and, per `durability`, one sync. The log
  // gets one ACK per delivery number, listing its messages, rather than one per message
  // (docs/format.md, flag LIST). Fails as a whole, acking nothing, only when the queue
  // cannot be changed (read-only, the lock, the disk); a failed sync after the append (as
  // for ack()) is returned too, with the acks made.
  Result<std::vector<Status>> ack_batch(std::span<const std::string_view> receipts,
                                        Durability durability = Durability::kQueuePolicy);
  // Deletes the message `id` without a receipt, whatever its state (ready, leased,
  // delayed); for an operator removing one message by hand. It is written as the ack of a
  // receipt would be (and counted in Stats::acked_total), so a receipt still held for it
  // then fails with kNotFound; flagged as a delete, so replay() never sends it again
  // (deleted means gone). A dead letter is removed through dead_letters(), by its id
  // there. kNotFound if no message `id` is in the queue (never sent, acked, removed,
  // dead-lettered or purged).
  Status remove(uint64_t id, Durability durability = Durability::kQueuePolicy);
  // Makes the message receivable again after `delay`. Same errors as ack.
  Status nack(std::string_view receipt, Millis delay = Millis{0});
  // Renews the lease to end `visibility` from now. Same errors as ack.
  Status extend(std::string_view receipt, Millis visibility);
  // Moves the received message to the dead-letter queue now, whatever its receive count:
  // for a consumer that knows it can never handle it. Its dead-letter copy carries its
  // attributes, `extra` (e.g. why it failed), and its history as every dead letter does
  // (spool.dead.reason "consumer", or "max_receives" on the last delivery max_receives
  // allows; docs/semantics.md), as far as the attribute bounds
  // allow. Same errors as ack; kInvalidArgument for `extra` that breaks the bounds.
  Status dead_letter(std::string_view receipt, const Attributes& extra = {});

  // Instant release on death: binds the leases this Queue takes from now on (bind_leases)
  // or the one lease `receipt` names (bind) to this process. When the process dies, those
  // leases return to ready within a fraction of a second, found by the next process that
  // takes the index lock or waits in receive, instead of after the visibility timeout.
  // Liveness is an OFD lock on the process's slot in dir/owners (not a PID, so PID reuse
  // and PID namespaces cannot fool it). A Queue that is closed releases its bound leases
  // too. At most 128 processes bind at once (kQueueFull beyond). A fork()ed child does not
  // inherit the binding.
  Status bind_leases();
  Status bind(std::string_view receipt);

  // Up to `max` messages of the states in `states` with ids above `after`, in id order,
  // without payloads: a page, and the next page is the one after its last id. Reads the
  // record of each message returned; the rest costs what the index holds out of id order
  // (messages in flight, delayed, redelivered, of another priority or blocked), not the
  // backlog.
  Result<std::vector<MessageInfo>> list(size_t max, StateFilter states = {}, uint64_t after = 0);
  // How many messages of the states in `states` have ids above `after`: the rows list()
  // would return without its `max`. For a page's "N more": it reads no records, and walks
  // the never-received backlog on the shorter side of `after` (not at all for after = 0).
  Result<uint64_t> count(StateFilter states = {}, uint64_t after = 0);
  // One message by id, in any state, without receiving it: its payload, attributes and
  // enqueue time (no receipt), and where it stands. kNotFound when the queue holds no
  // message `id` (never sent, or acked, removed, dead-lettered or purged).
  Result<std::pair<Message, MessageInfo>> show(uint64_t id);
  // Up to `max` messages in id order without receiving them (no receipts).
  Result<std::vector<Message>> peek(size_t max);
  // Removes every message; returns how many.
  Result<uint64_t> purge();

  // Operator actions (docs/operations.md).
  // pause(): sends are still accepted, but receives (receive, receive_views, receive_id)
  // deliver nothing, and long polls sleep on, until resume(), which wakes them at once. The
  // state is a record in the log, synced before the call returns: it holds across restarts,
  // a deleted index and compaction, for every process. Pausing a paused queue (or resuming
  // a running one) writes nothing. Leases already taken run on; peek, list and stats work.
  Status pause();
  Status resume();
  // Ends the lease of message `id` at once, whoever holds it: the message is ready again
  // now (its receive count kept; a RELEASE record). kNotFound if the queue holds no message
  // `id`, kInvalidArgument if it is not leased. The holder's receipt is fenced off only once
  // the message is received again, as after a lease that ran out.
  Status release(uint64_t id);
  // Moves messages from this queue into `dst` (another queue): each is leased here, sent to
  // `dst` with its payload, attributes, priority and group plus spool.moved.from (this
  // queue's directory) and spool.moved.original_id, then acked here. Exactly once across a
  // crash: the send carries a dedup id made of this queue's uid and the message id, so a
  // rerun after a kill between send and ack finds it in dst's dedup window and only acks
  // (the leases are bound to the process, so a killed move's come back at once). The
  // guarantee holds while the rerun comes within dst's dedup_window (default 5 min).
  // A message past max_receives is dead-lettered by the lease instead of moved.
  struct MoveOptions {
    std::vector<uint64_t> ids = {};  // these messages (ids here); empty: the ready ones sent before the call, lowest id first
    uint64_t max = UINT64_MAX;      // at most this many
  };
  struct MoveResult {
    uint64_t moved = 0;       // sent to dst and acked here
    uint64_t already = 0;     // of them, found in dst already (a rerun after a crash)
    std::vector<uint64_t> missing = {};  // ids of opts.ids not here or not ready (leased, delayed)
  };
  Result<MoveResult> move_to(Queue& dst, const MoveOptions& opts);
  Result<Stats> stats();

  // Subscriptions (docs/semantics.md, "Subscriptions"; docs/format.md, "Views"): named readers of the
  // queue's one stream, each getting every message sent after it was added (with
  // `from_start`, also every message in the queue then) with state of its own. Names are
  // 1-48 bytes of [A-Za-z0-9._-], not "default"; at most 16 at once. Adding a name that
  // exists, or a 17th, is kInvalidArgument; removing an unknown one kNotFound. Both are
  // records in the log, synced before they return. A handle reads a subscription with
  // QueueOptions::subscription. Compaction keeps a message while any subscription holds it.
  Status add_subscription(std::string_view name, bool from_start = false);
  // With a max_receives of its own (0: the queue's), stored in its SUB record.
  Status add_subscription(std::string_view name, bool from_start, uint32_t max_receives);
  Status remove_subscription(std::string_view name);
  Result<std::vector<SubscriptionInfo>> subscriptions();
  // Makes every write so far durable, whatever the sync policy.
  Status sync();

  // Reclaims the disk of acked messages now: the longest run of oldest sealed segments that
  // is at most half live is removed, its live messages (with their receive counts and
  // leases) copied to the head of the log first.
  // Runs concurrently with every other call; one compaction per queue at a time (a second
  // caller waits). Compaction also runs on its own, in a background thread of whichever
  // process rolls the log to a new segment, when the oldest segments are at most a quarter
  // live (docs/compaction.md).
  Result<CompactResult> compact(const Progress& progress = {});

  // fsck: checks every segment (headers, checksums, sequence), replays the log into a
  // private index and compares it with the shared one, and recounts the counters. With
  // `repair`, rebuilds the shared index from the log if they disagree (records lost to
  // corruption cannot be brought back; they are reported). Holds the index lock while it
  // compares, so other processes pause for a moment on a large queue.
  Result<VerifyReport> verify(bool repair, const Progress& progress = {});

  // The dead-letter queue (a queue of its own, in dir/dlq, that never dead-letters).
  Result<Queue*> dead_letters();
  // Moves up to `max` dead letters back into this queue as new messages, each for the view
  // it died in only: one marked spool.dead.subscription=NAME goes to subscription NAME
  // alone; one without the mark to the queue's own view alone while the queue has
  // subscriptions (without any, it is every view: as ever). A dead letter whose subscription
  // was removed stays in the dead-letter queue, not counted. On a subscription's handle,
  // only that subscription's dead letters.
  Result<uint64_t> redrive(size_t max);
  // Only the dead letters of subscription `subscription` (empty: every dead letter).
  Result<uint64_t> redrive(size_t max, std::string_view subscription);
  // Moves the one dead letter `dead_id` (its id in the dead-letter queue, as
  // dead_letters()->list() shows it) back as a new message, to the view it died in (as
  // redrive()); returns the new id. kNotFound if there is no such dead letter, or if its
  // subscription was removed (it stays), kEmpty while another caller is redriving or reading it.
  Result<uint64_t> redrive_id(uint64_t dead_id);

  // Replay after ack: sends the messages acked in the window `opts` names again, as new
  // messages (in the order of their acks; the acks of this handle's view, sent back to
  // that view only while the queue has subscriptions), each with its payload, attributes, priority and group plus
  // spool.replay.original_id and spool.replay.acked_at. Reads the log, not the index; only
  // consumer acks count (not remove(), dead-lettering, retention drops or purges). A
  // queue whose keep_acked covers the window keeps every such message; otherwise those
  // compaction already removed are counted as missing. kInvalidArgument for a bad window,
  // kNotFound / kNotAQueue for a `to` that is no queue. Not atomic: a crash midway leaves
  // the messages sent so far (a second replay sends them again).
  Result<ReplayResult> replay(const ReplayOptions& opts);

  const std::string& dir() const;
  // The queue's stored settings (visibility, max_receives, sync, sizes).
  const QueueOptions& options() const;
  // Checks the shared index's invariants (O(n)), and on a subscription's handle that
  // subscription's index's too; "" when they hold. For tests and verify.
  std::string check_index();

  struct Impl;

 private:
  explicit Queue(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace spool
