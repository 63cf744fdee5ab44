// The store behind Queue (Queue::Impl), declared here and defined by module: queue.cc (the
// operations behind the API), write_path.cc (commit(), the one commit path; the log clock,
// room), apply.cc (the one mutator: what a record does to the index, for live calls and
// replay alike), recovery.cc (the lock path, replay, rebuild), receipts.cc, owners.cc (the
// records of instant release on death), delivery.cc (loading and taking messages, dead
// letters), compact.cc (compaction), move.cc, replay.cc and verify.cc. Its parts own their
// state: syncer.h (durability), background.h (spares, compaction's thread),
// lease_owners.h (the owner registry), dead_letter_link.h (DIR/dlq). Its own fields are
// private. Not a public header. docs/design.md is the map.
//
// Every state change follows one order, under the index lock: commit() appends the records
// to the log, then applies them to the index; then (outside the lock) the caller syncs per
// policy. So a process that dies at any point leaves the log holding every change the index
// shows, and the repair after EOWNERDEAD is simply "rebuild the index from the log". There
// is no other write path: nothing is staged or deferred outside the log.
#pragma once

#include <spdlog/spdlog.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <charconv>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <optional>
#include <thread>
#include <unordered_map>
#include "index/index.h"
#include "logging.h"
#include "queue/apply.h"
#include "queue/background.h"
#include "queue/config.h"
#include "queue/dead_letter_link.h"
#include "queue/lease_owners.h"
#include "queue/syncer.h"
#include "env/env.h"
#include "sys/crashpoint.h"
#include "spool/queue.h"
#include "storage/log.h"
#include "queue/log_clock.h"
#include "sys/clock.h"
#include "sys/file_modes.h"
#include "sys/futex.h"
#include "sys/mutex.h"
#include "sys/ofd_lock.h"
#include "sys/thread_annotations.h"

namespace spool {

using format::RecordType;
using index::Entry;
using index::State;
using storage::Pos;
using storage::Record;

// The records of `proto` (its type, times, flags and view) for each (delivery number, id)
// of `counted`: per delivery number (the records' count), a lone id's as a record of its
// own, more as LIST records (format::kFlagList), as few as hold them, their payloads kept
// in `payloads`. (A receive's LEASEs, an ack_batch's ACKs.)
std::vector<Record> listed_records(const Record& proto, std::vector<std::pair<uint32_t, uint64_t>> counted,
                                   std::deque<std::string>& payloads);

inline constexpr uint64_t kMaxWaitSliceNs = 1'000'000'000;  // bounded futex waits: a missed wake costs at most this
// How long a long poll sleeps at most while any process binds its leases: with
// queue::kReapIntervalNs, how late a dead worker's leases come back at most.
inline constexpr uint64_t kBoundWaitSliceNs = 250'000'000;

inline uint64_t ms_to_ns(Millis m) {
  return m.count() <= 0 ? 0 : static_cast<uint64_t>(m.count()) * 1'000'000ull;
}

using queue::Clocks;
// Adds `add` to `a` in order, each pair only while the attribute bounds leave room for it
// (docs/semantics.md, "Attributes"): a message's own attributes are never crowded out by
// the history spool adds (dead letters, replays).
void add_within_bounds(Attributes& a, const std::vector<std::pair<std::string, std::string>>& add);

// The store behind a Queue: public operations, private state. Its member functions are
// defined by module (the list above); what each part owns is in that part's header.
struct Queue::Impl {
 public:
  ~Impl();

  // The last process to detach seals the index (docs/durability.md, "First opener"). The
  // gate keeps openers out meanwhile; holding `lock` exclusively proves nobody else is
  // attached. A process that dies instead leaves it unsealed, which only costs the next
  // opener the stronger check.
  void seal_if_last();

  // ---- locking -------------------------------------------------------------------------
  //
  // The index lock (idx.hdr().coord.mu) is the capability `idx` for the analysis
  // (sys/thread_annotations.h): a function marked REQUIRES(idx) runs with it held, a field
  // marked GUARDED_BY(idx) is used only with it held.

  // Holds the index lock lock() took, until it is destroyed.
  class SCOPED_CAPABILITY Locked {
   public:
    // Adopts the lock the caller (lock()) holds.
    explicit Locked(Impl* impl) REQUIRES(impl->idx) : impl_(impl), promotions_(impl->idx.promotions()) {}
    Locked(Locked&& o) noexcept
        : impl_(std::exchange(o.impl_, nullptr)), repaired_(std::move(o.repaired_)), promotions_(o.promotions_) {}
    Locked& operator=(Locked&&) = delete;
    // Unlocks; then, if anything this hold removed let the next message of an ordered group
    // through (an ack, a dead letter, a retention drop, a remove, a purge), wakes as many
    // long polls: no caller has to know which of its steps may have done so.
    ~Locked() RELEASE();
    // What lock() found damaged in the index and rebuilt from the log before it returned,
    // or "" (verify reports it).
    const std::string& repaired() const { return repaired_.message(); }
    // Unlocks before the end of the holder's scope: `Locked::release(std::move(held).value())`.
    static void release(Locked gone) { (void)gone; }

   private:
    friend struct Impl;
    Impl* impl_;
    Status repaired_;  // kCorrupt with what was damaged; a Status, not a string: cheap to move while ok
    uint64_t promotions_;  // idx.promotions() when the lock was taken
  };

  // The analysis cannot see the lock inside lock()'s Result: each caller states it holds
  // it right after the ok() check (`q.holds(*held)`; SPOOL_LOCK_OR_RETURN below does both).
  // From there on to the end of the function the analysis takes the index lock as held,
  // even past the end of `held`'s scope, so a function that takes the lock is not marked
  // EXCLUDES(idx): a caller that held it in an earlier block would be taken to hold it still.
  void holds(const Locked&) const ASSERT_CAPABILITY(idx) {}

  // The one lock path. On EOWNERDEAD the index is rebuilt from the log before the mutex is
  // marked consistent; if that fails the mutex is left unrecoverable and every user gets a
  // clear error until the last process closes the queue and the next opener rebuilds.
  // Locks and repairs, nothing else: read-only calls (stats, list, peek, verify) take it
  // alone and write nothing to the log.
  Result<Locked> lock();
  // lock(), then the upkeep that goes with a change (send, receive, ack, ...), as named
  // steps: the leases bound to dead processes are released (records), and the index region
  // shrinks while nobody holds a slot.
  Result<Locked> lock_to_change();

  // ---- rebuild from the log (first opener, repair) -------------------------------------

  // The index holds a value a check refused (idx.damage()): rebuilt from the log.
  Status repair_damage() REQUIRES(idx);

  // Replays the log into the shared index. Lease bindings (instant release on death) are
  // not in the log, so they are carried over from the old index for the leases it still
  // agrees on (same id, same delivery): above all those of the process whose death caused
  // this rebuild, which would otherwise wait out their timeouts. The old index is only
  // read where its header is sound (a dying grow can leave it inconsistent).
  Status rebuild() REQUIRES(idx);

  // Empties `x` and replays the whole log into it. `x` held: the index lock (x is idx), or x
  // is private (index::SharedIndex::assert_held()).
  Status replay(index::SharedIndex& x) REQUIRES(x);

  // ---- subscriptions (views.cc; docs/format.md, "Views") --------------------------------

  // The index of view k (1..index::kSubscriptions): DIR/subs/K.index, attached at its first
  // use (made where missing or unsound, which marks the index damaged while the view is
  // active, outside a replay: the rebuild fills it from the log), guarded by view 0's lock,
  // which the caller holds (apply_record() through view_fn included). Null if it cannot be.
  index::SharedIndex* view_index(uint16_t k);
  // View 0 (the queue's own index), then every active subscription whose index could be
  // attached, each with its number: what compaction and retention's sweep walk. It
  // allocates; spares_short(), at every send, walks the table itself.
  std::vector<std::pair<uint16_t, index::SharedIndex*>> held_views() REQUIRES(idx);
  // For the first opener that would reuse the index: "" when every active subscription's
  // index is there and sound (its invariants, and as far on as view 0), else what is not,
  // and then every view is rebuilt from the log. (View files are not sealed: damage that
  // keeps the invariants is not seen.)
  std::string views_sound();
  // QueueOptions::subscription: this handle reads subscription `name` (kNotFound if none).
  Status use_subscription(std::string_view name);
  // The view this handle reads: view 0's index, or its subscription's (kNotFound once
  // that was removed, or renamed to another number by a remove and an add).
  Result<index::SharedIndex*> here() REQUIRES(idx);
  // here()'s index, where the caller checked here() under this hold of the lock.
  index::SharedIndex& vw() REQUIRES(idx) {
    return view_k != 0 && views[view_k] != nullptr ? *views[view_k] : idx;
  }
  // kInvalidArgument for `what` on a subscription's handle (not there yet), else ok.
  Status whole_queue_only(const char* what) const;
  Status add_subscription(std::string_view name, bool from_start, uint32_t max_receives);
  // The max_receives of this handle's view: its subscription's own, else the queue's.
  uint32_t max_receives_here() REQUIRES(idx);
  Status remove_subscription(std::string_view name);
  Result<std::vector<SubscriptionInfo>> subscriptions();
  // Disk view k alone holds back (Stats::held_back_bytes): the bytes of the segments from
  // the one holding its oldest message's record up to, not including, the oldest segment
  // any other view (or the log's head) needs; 0 without subscriptions. Visits every entry
  // of every view.
  uint64_t held_back(uint16_t k) REQUIRES(idx);

  // ---- deduplication (docs/semantics.md, "Deduplication") -------------------------------
  // (Remembering a new message's dedup id is apply_record()'s.)

  // The id of the message that carries `dedup_id` and was sent within the window, or 0.
  // Every hint of the table is confirmed against its record.
  uint64_t find_dedup(std::string_view dedup_id, const Clocks& now) REQUIRES(idx);
  uint64_t dedup_window_ns() const { return ms_to_ns(cfg.opts.dedup_window); }

  // True when the log holds records the index has not seen (the index is stale).
  bool log_ahead_of_index();

  // ---- durability ----------------------------------------------------------------------

  // After a write returned by the lock holder: tells the background part (a roll asks for
  // a top-up and a compaction), then honours the sync policy (or syncs now).
  Status written(uint64_t end, Durability d = Durability::kQueuePolicy);

  // ---- helpers -------------------------------------------------------------------------

  Status writable() const;

  // "ID.GEN.TAG": the message, its delivery (the fence), and the low 32 bits of the queue's
  // uid in 8 hex digits. Formatted and parsed with to_chars/from_chars: sscanf was 2% of an
  // e2e profile.
  std::string receipt(uint64_t id, uint32_t gen) const;

  // A change by receipt (ack, nack, extend, dead_letter, bind): the receipt parsed, then,
  // under the lock taken for a change (held while the result is), its message found and its
  // fence checked: a receipt of an earlier delivery is kLeaseLost.
  struct Fenced {
    Locked held;
    uint64_t id;
    uint32_t gen;
    uint32_t slot;
  };
  Result<Fenced> lock_fenced(std::string_view receipt);
  // lock_fenced()'s two halves, for a call that fences many receipts under one lock
  // (ack_batch): a receipt's id and delivery (kInvalidArgument if it is not one of this
  // queue's and view's), and the slot of that delivery in `v`, the handle's view, held.
  struct ReceiptRef {
    uint64_t id;
    uint32_t gen;
  };
  Result<ReceiptRef> parse_receipt(std::string_view receipt) const;
  Result<uint32_t> fence(index::SharedIndex& v, ReceiptRef ref) REQUIRES(idx);
  void holds(const Fenced&) const ASSERT_CAPABILITY(idx) {}

  // The segment at the index's log end (null before the first), checked against that end;
  // a bad end marks the index damaged. A writer takes it once for the room it needs
  // (spares_short) and for its append; it stays held (tail_seen) while the lock is.
  Result<storage::Segment*> log_tail() REQUIRES(idx);
  // Appends at the log end and publishes the new end; `tail` is log_tail()'s.
  // The one commit path: every record any call writes goes through here. It appends
  // `recs` at the log end (the segment's opening CLOCK record first where a roll needs one)
  // and publishes the new end, then applies each record with apply_record() (queue/apply.h)
  // at its position and `now`, and works out from the record types what the unlock must do
  // (Locked): long polls to wake for messages that became receivable, senders to wake for
  // room. `tail`: log_tail()'s segment (looked up here if null). What it returns (the
  // records' positions and the new end) is what the caller's sync policy needs.
  //
  // A failed append changes nothing. A failed apply (the index had no room for a record it
  // holds now in the log) marks the index damaged: the lock's release rebuilds it from the
  // log, the one way every failure to apply is handled.
  //
  // `applied`: the records were applied before (only a receive's LEASEs, so that the next
  // message is picked from the state each one leaves); if the append fails the index is
  // rebuilt from the log, which undoes them.
  Result<storage::AppendResult> commit(std::span<const Record> recs, const Clocks& now,
                                       storage::Segment* tail = nullptr, bool applied = false) REQUIRES(idx);
  // Applies `rec` now, before its append (commit()'s `applied`): a LEASE of a receive.
  Status apply_before_append(const Record& rec, const Clocks& now) REQUIRES(idx);
  // What apply_record() needs for a live call at `now` (replay makes its own, from the log's
  // clock); `copies`: commit()'s compaction copies not yet confirmed, or null.
  queue::Keys live_keys(const Clocks& now, queue::Copies* copies) const;

  // The clocks for the records written under this hold of the lock. A CLOCK record goes
  // first when a new anchor is due (queue/log_clock.h). If it cannot be written the log
  // clock keeps its offset: exact for this boot still, only further from the wall clock.
  Clocks clocks() REQUIRES(idx);

  // A full disk must not stop a queue from draining (docs/durability.md). Every queued message
  // keeps room, in the active segment and in spare segments, for the two control records
  // that drain it (LEASE, ACK), plus a checkpoint for compaction. Before a send or a
  // compaction copy writes `bytes` of records that would eat into that room, more spares
  // are preallocated; when the disk cannot give one, the write fails with kNoSpace and the
  // room stays for the drain. (Nacks, extends and expiries are not reserved for.)
  // The spares a queue is short of that room: `n` of them, the first of `size` bytes and
  // each next one twice the one before (at most the segment size), none smaller than
  // `at_least` (what the largest record about to be written needs, in a segment of its own).
  // Segments grow by doubling from a small first one (storage/log.h), and so do the spares
  // made ahead of the rolls that will take them.
  struct SpareShort {
    uint64_t n = 0;
    uint64_t size = 0;
    uint64_t at_least = 0;
    // The room short, in bytes: when the disk cannot give a spare of `size`, one that
    // covers what is still short is made instead (a small device).
    uint64_t missing = 0;
    // (n == 0 only) The segments have reached their largest size and there is room, but not
    // one more segment's: time for a top-up off the caller's path. A backlog's drain reserve
    // grows with every send between rolls, so a top-up only at the rolls would leave senders
    // to make spares themselves.
    bool low = false;
    // What each segment cannot hold of drain records: its header and its opener (the CLOCK
    // record and the restated subscriptions), and a tail a record did not fit.
    uint64_t per_segment = 0;
  };
  // `tail`: log_tail()'s segment. `largest`: the record size of the largest record about to
  // be written (0: none). `ahead`: the room of one more segment, of the size the next roll
  // makes, on top.
  SpareShort spares_short(const storage::Segment* tail, uint64_t new_msgs, uint64_t bytes, uint64_t largest = 0,
                          bool ahead = false) REQUIRES(idx);
  // spares_short(): no number of spares would do, the log has used every segment number.
  static constexpr uint64_t kNoSegmentNumbers = UINT64_MAX;
  // Makes the spares without the lock (a send's or a compaction's: each spare is a large
  // fallocate and two syncs, which nothing under the index lock may wait for); each is
  // counted under a short lock of its own once it is on disk.
  Status make_spares(const SpareShort& s, bool zero_fill = false);
  // Called by the background thread after a roll: makes the spares the queue needs to have
  // one whole segment more than spares_short() asks for, so that the roll that uses up a
  // spare is followed by a new one made off every caller's path, and a send makes one
  // itself only when the background falls a whole segment behind. Another process's
  // thread may make one at the same time: at most one extra spare each, used by later rolls.
  void top_up_spares();

  // `n` messages just became receivable: wake as many long-pollers, not all of them (a
  // thundering herd cost ~2 context switches per waiter per message). A woken waiter that
  // dies before receiving only delays the message to another waiter's next wait slice.
  void wake(uint64_t n);

  // Consumers made room in a queue with back-pressure limits: wake every sender waiting for
  // room (each rechecks the limits under the lock).
  void room();

  // Why a send of `n` messages / `bytes` payload bytes does not fit now; "" if it does.
  std::string full_reason(uint64_t n, uint64_t bytes) REQUIRES(idx);

  // ---- lease owners (instant release on death) ------------------------------------------

  // Claims an owner slot for this Queue: a free one, or one whose owner died (its leftover
  // leases are released first).
  Status claim_owner_slot() REQUIRES(idx);

  // Returns the leases bound to the owner slots `ks` to ready now (RELEASE records).
  // Leases that already ran out only lose their tag.
  void release_leases_of(std::span<const uint32_t> ks) REQUIRES(idx);

  // Every queue::kReapIntervalNs (or now, with `force`), releases the leases of binders
  // that died and frees their slots.
  void reap_dead_owners(bool force = false) REQUIRES(idx);

  // A Queue closed by its process releases its bound leases like a death would.
  void release_own_slot();

  // A payload left in the mapped segment (zero-copy receive): the view, and the segment
  // kept mapped for as long as the view is used (compaction may unlink the file meanwhile;
  // the mapping stays valid, as the file is never truncated).
  struct Mapped {
    std::shared_ptr<storage::Segment> keep;
    std::string_view view;
  };

  // The message in `slot`, its payload copied, or with `mapped` left in the segment.
  // `now`: the clocks of the caller's lock hold (read here if null); *age_ns: how long ago
  // the message was sent, on the boot clock.
  Result<Message> load(uint32_t slot, Mapped* mapped = nullptr, const Clocks* now = nullptr, uint64_t* age_ns = nullptr)
      REQUIRES(idx);
  // What load() reads for the message in `slot`: its MSG record (`keep` holds the segment
  // it points into), the decoded extension, and how long ago (ns, boot clock, as of `now`)
  // the message was sent. A record that is gone, damaged or another's is recorded as damage
  // (the index is rebuilt before the unlock) and returned as the error.
  struct Stored {
    storage::RecordView r;
    storage::MessageExt ext;
    uint64_t age_ns = 0;
  };
  Result<Stored> read_stored(uint32_t slot, std::shared_ptr<storage::Segment>* keep, const Clocks& now) REQUIRES(idx);

  // Compaction (compact.cc): every sealed segment with `everything`, else by policy;
  // waits for a running compaction with `wait`, else returns at once.
  Result<CompactResult> compact(bool everything, bool wait, const Progress& progress = {});

  // The background part's compaction (after a roll): by policy, its failure logged.
  void compact_by_policy();

  // Takes the receivable message in `slot`. A message past max_receives goes to
  // the dead-letter queue (nullopt); one whose record cannot be read is kCorrupt (the index
  // is rebuilt before the unlock); otherwise it is leased in the index and returned, and
  // the caller logs the lease with log_leases().
  Result<std::optional<Message>> take(uint32_t slot, const Clocks& now, uint64_t vis, uint64_t* end,
                                      Mapped* mapped = nullptr) REQUIRES(idx);

  // Moves the message in `slot`, read as `msg` (its payload in `body`), to the dead-letter
  // queue: sent there with its attributes, `extra` and its spool.dead.*
  // history (docs/semantics.md), then a DEAD record here. `reason` is "max_receives" or "consumer"; `extra` are
  // attributes a consumer adds (dead_letter()).
  Status bury(uint32_t slot, Message& msg, std::string_view body, const char* reason, const Attributes& extra,
              const Clocks& now) REQUIRES(idx);

  // Drops the message in `slot` for a retention limit: an ACK record flagged EXPIRED, so
  // the drop is durable and counted apart from consumer acks.
  Status expire(uint32_t slot, const Clocks& now) REQUIRES(idx);

  // Retention in every view (view 0 and each active subscription), without a receive in
  // it: drops (ACK flagged EXPIRED, carrying the view) each view's oldest ready messages
  // past retention_max_age (`by_age`: it reads their records), and, while the view's stored
  // bytes exceed retention_max_bytes, its oldest ready ones. Leased and delayed messages
  // stay, as for a receive (they go once ready again). Bounded: at most kRetainBatch
  // messages per view per call, walked from the view's oldest. The writes go in one append.
  static constexpr size_t kRetainBatch = 1024;
  Status retain(const Clocks& now, bool by_age) REQUIRES(idx);
  // A send's retention check by age runs at most once per this many ns (it reads records).
  std::atomic<uint64_t> retained_at{0};

  // Logs the leases of messages just taken, in one append. If it fails the
  // index is rebuilt from the log, which undoes the leases. *end is the log end to honour
  // the sync policy for.
  Status log_leases(const std::vector<Message>& taken, const Clocks& now, uint64_t vis, uint64_t* end)
      REQUIRES(idx);

  // Opens (or makes, where writable) DIR/dlq with this queue's options (dlq's opener).
  Result<std::unique_ptr<Queue>> open_dead_letter_queue();

  // Queue::open; `nested` for the dead-letter queue inside a queue, whose directory is
  // refused if it is a link (docs/security.md, "Planted links").
  static Result<std::unique_ptr<Queue>> open_queue(const std::string& dir, const QueueOptions& opts, bool nested);

  // receive_id(): message `id` leased for `vis` ns. A paused queue delivers nothing
  // (kEmpty) unless `even_paused` (a move: the operator's own action).
  Result<Message> receive_one(uint64_t id, uint64_t vis, bool even_paused);

  // ---- the operations behind Queue's calls (queue.cc, move.cc, replay.cc, verify.cc) -----
  // Each checks its arguments, takes the lock, builds its records and commits them; Queue's
  // methods forward here. Documented in spool/queue.h.
  enum class Change { kAck, kNack, kExtend };
  // The lowest `max` ids of messages in `states` (list, peek, stats' oldest ready).
  // With `after`, only ids above it.
  std::vector<uint32_t> lowest_ids(size_t max, StateFilter states, uint64_t now, uint64_t after = 0) REQUIRES(idx);
  // Every send: `payloads[i]` with extension `exts[i]` (none if empty) and dedup id
  // `dedup[i]` (none if empty) gets `ids[i]`; `duplicates`, if given, says which were
  // already sent within the dedup window.
  // `for_view`: unset, a message for every view; set, for one view only (kFlagOneView): the
  // subscription it names (kNotFound if there is none), or with "" the queue's own (flagged
  // only while the queue has subscriptions: without, the record is as before).
  Status send_core(std::span<const std::string_view> payloads, std::span<const std::string> exts,
                   std::span<const std::string_view> dedup, const SendOptions& opts,
                   std::span<uint64_t> ids, std::vector<bool>* duplicates = nullptr,
                   std::optional<std::string_view> for_view = std::nullopt);
  Result<std::vector<uint64_t>> send_ids(std::span<const std::string_view> payloads,
                                         std::span<const std::string> exts,
                                         std::span<const std::string_view> dedup,
                                         const SendOptions& opts,
                                         std::vector<bool>* duplicates = nullptr,
                                         std::optional<std::string_view> for_view = std::nullopt);
  // send_batch() of SendItems, for one view with `for_view` (as send_core()).
  Result<std::vector<uint64_t>> send_items(std::span<const SendItem> items, const SendOptions& opts,
                                           std::vector<bool>* duplicates,
                                           std::optional<std::string_view> for_view = std::nullopt);
  // The number of the active subscription `name` (0 for "": the queue's own view).
  Result<uint16_t> view_named(std::string_view name) REQUIRES(idx);
  // One received dead letter `m` of `dead` (the dead-letter queue) back into the view it
  // died in (redrive).
  Result<uint64_t> redrive_one(Queue& dead, Message& m);
  // The subscription this handle reads ("": the queue's own view).
  const std::string& subscription_name() const { return view_name; }
  // receive() and receive_views(): with `mapped`, payloads are left in the segments.
  Result<std::vector<Message>> receive_impl(size_t max, Millis visibility, Millis wait,
                                            std::vector<Mapped>* mapped);
  Result<Message> receive_id(uint64_t id, Millis visibility);
  Result<MessageInfo> info_of(uint32_t slot, const Clocks& now) REQUIRES(idx);
  Result<std::vector<MessageInfo>> list(size_t max, StateFilter states, uint64_t after);
  Result<uint64_t> count(StateFilter states, uint64_t after);
  Result<std::pair<Message, MessageInfo>> show(uint64_t id);
  Result<std::vector<Status>> ack_batch(std::span<const std::string_view> receipts, Durability durability);
  Status change(std::string_view receipt, Change what, uint64_t ns,
                Durability durability = Durability::kQueuePolicy);
  Status dead_letter(std::string_view receipt, const Attributes& extra);
  Status remove(uint64_t id, Durability durability);
  Status bind_leases();
  Status bind(std::string_view receipt);
  Result<std::vector<Message>> peek(size_t max);
  Result<uint64_t> purge();
  Status set_paused(bool on);
  Status release(uint64_t id);
  Result<Stats> stats();
  Result<MoveResult> move_to(Queue& dst, const MoveOptions& opts);
  Result<ReplayResult> replay(Queue& self, const ReplayOptions& o);  // self: the Queue this is of
  Result<VerifyReport> verify(bool repair, const Progress& progress);
  const std::string& path() const { return dir; }
  const QueueOptions& options() const { return cfg.opts; }
  Env& environment() const { return *env; }  // what the queue runs on (QueueOptions::env)
  // A fork child's inherited copy (~Queue leaves it alone).
  bool inherited() const { return opened_by != ::getpid(); }
  uint64_t durable_id();
  Status sync();
  Result<Queue*> dead_letters() { return dlq.get(); }
  std::string check_index();

 private:
  // The state the store owns: what the queue is, the log, the shared index, the files that
  // guard the first opener; the parts (each owns its own state); and what the lock holder
  // carries between the steps of one hold (the tail segment, the unlock's wakes, the clock).
  std::string dir;
  queue::Config cfg;
  bool read_only = false;
  std::shared_ptr<Env> env;    // clocks, sleep, test hooks (QueueOptions::env; env/env.h)
  std::shared_ptr<io::Io> io;  // every file operation of this queue: env->io()
  std::unique_ptr<storage::Log> log;
  index::SharedIndex idx;
  // From the directory's mode at open: what each file spool creates gets (sys/file_modes.h).
  sys::FileModes modes;
  std::atomic<bool> told_lost{false};  // the lost index was logged
  int gate_fd = -1;
  int lock_fd = -1;
  pid_t opened_by = ::getpid();  // ~Queue leaves a fork child's inherited copy alone

  // ---- the parts: each owns its state (its own lock where it has one) -------------------
  // Group commit and the `interval` flusher; made once the log is open (open_queue).
  std::unique_ptr<queue::Syncer> syncer;
  // Spares and compaction off every caller's path.
  queue::Background background{[this] { top_up_spares(); }, [this] { compact_by_policy(); }};
  // Instant release on death (bind_leases).
  queue::LeaseOwners owners{dir, modes};
  // DIR/dlq.
  queue::DeadLetterLink dlq{dir, [this] { return open_dead_letter_queue(); }};
  std::shared_ptr<storage::Segment> tail_seen GUARDED_BY(idx);  // log_tail()'s last, at
  uint64_t tail_gen GUARDED_BY(idx) = 0;                         // log->cache_generation() then
  // Long polls and senders for the unlock to wake (commit()); read and reset by ~Locked.
  uint64_t wake_pending GUARDED_BY(idx) = 0;
  bool room_pending GUARDED_BY(idx) = false;
  uint64_t boot_seen GUARDED_BY(idx) = 0;  // the boot time clocks() read last (restatement())
  // What the last automatic compaction that found nothing to remove saw: the messages
  // removed from the queue so far and the segment its dedup ids and kept acks pinned. Until either
  // changes, a prefix can only have become worth compacting through control records alone
  // (leases that expire unacked), so the next ones skip their scan of every live message
  // under the index lock, but for every kFruitlessScanEvery-th.
  static constexpr uint32_t kFruitlessScanEvery = 16;
  std::atomic<uint64_t> fruitless_removed{UINT64_MAX};
  std::atomic<uint64_t> fruitless_pinned{UINT64_MAX};
  std::atomic<uint32_t> fruitless_skips{0};
  uint64_t forgotten_through GUARDED_BY(idx) = 0;  // segments <= this dropped from the log's cache
  // The subscriptions' indexes, by view number (views[0] unused: view 0 is idx), attached by
  // view_index(); and apply_record()'s way to them.
  std::array<std::unique_ptr<index::SharedIndex>, index::kSubscriptions + 1> views;
  queue::ViewIndex view_fn{[this](uint16_t k) { return view_index(k); }};
  // The subscription this handle reads (QueueOptions::subscription): its view and name;
  // 0 and "" for the queue's own.
  uint16_t view_k = 0;
  std::string view_name;
  bool replaying = false;  // replay() is filling the views (lock held: idx, or replay()'s private index)
};

// `auto held = q.call;`, returning its error if it failed, then `q.holds(*held)`: the
// lock taken by one of Impl's lock functions (lock(), lock_to_change(), lock_fenced()).
#define SPOOL_LOCK_OR_RETURN(held, q, call) \
  auto held = (q).call;                     \
  if (!held.ok()) return held.status();     \
  (q).holds(*held)

}  // namespace spool
