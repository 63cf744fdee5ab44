// The C API (include/spool/spool.h): a thin layer over the public C++ API (queue.h,
// lease_keeper.h) and nothing else, so it sees the queue exactly as any C++ program does.
//
// Every entry point catches everything at the boundary (guard()): no exception reaches a C
// caller. Errors go to a thread-local string (spool_last_error). Message batches are one
// allocation: a Batch (which keeps the mappings of zero-copy views, or the copied payloads of
// peek, and the receipts alive) followed by the spool_message array the caller sees; freeing
// finds the Batch just before the array, and the attributes of message i in it.
//
// Structs that grow (docs/api.md, "Structs that grow"): a field is read only when the
// caller's `size` (or spool_send_items' item_size) holds it (SPOOL_HAS); the *_init functions
// write no byte past the size they are given. The 0.1.0 names spool_options_init and
// spool_send_options_init, which spool.h now maps to the *_init_size functions by a macro,
// stay as functions that fill 0.1.0's layout only.
#include "spool/spool.h"

#include <algorithm>
#include <cstdint>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "spool/lease_keeper.h"
#include "spool/queue.h"
#include "spool/status.h"

// The C codes are spool::Code's numbers.
static_assert(SPOOL_OK == static_cast<int>(spool::Code::kOk));
static_assert(SPOOL_EMPTY == static_cast<int>(spool::Code::kEmpty));
static_assert(SPOOL_LEASE_LOST == static_cast<int>(spool::Code::kLeaseLost));
static_assert(SPOOL_NOT_FOUND == static_cast<int>(spool::Code::kNotFound));
static_assert(SPOOL_INVALID_ARGUMENT == static_cast<int>(spool::Code::kInvalidArgument));
static_assert(SPOOL_TOO_LARGE == static_cast<int>(spool::Code::kTooLarge));
static_assert(SPOOL_QUEUE_FULL == static_cast<int>(spool::Code::kQueueFull));
static_assert(SPOOL_NOT_A_QUEUE == static_cast<int>(spool::Code::kNotAQueue));
static_assert(SPOOL_INCOMPATIBLE == static_cast<int>(spool::Code::kIncompatible));
static_assert(SPOOL_NO_SPACE == static_cast<int>(spool::Code::kNoSpace));
static_assert(SPOOL_IO == static_cast<int>(spool::Code::kIo));
static_assert(SPOOL_CORRUPT == static_cast<int>(spool::Code::kCorrupt));
static_assert(SPOOL_READ_ONLY == static_cast<int>(spool::Code::kReadOnly));

struct spool_queue {
  std::unique_ptr<spool::Queue> owned;  // null for the dead-letter handle
  spool::Queue* queue = nullptr;
  std::mutex dlq_mu;                    // guards dlq
  std::unique_ptr<spool_queue> dlq;     // spool_dead_letters' handle, made on first use
};

struct spool_keeper {
  std::unique_ptr<spool::LeaseKeeper> keeper;
};

namespace {

thread_local std::string t_last_error;

spool_code fail(const spool::Status& s) {
  t_last_error = s.to_string();
  return static_cast<spool_code>(s.code());
}

spool_code fail(spool_code code, const std::string& message) {
  return fail(spool::Status(static_cast<spool::Code>(code), message));
}

// Runs `body`, turning any exception into SPOOL_IO with its text.
template <class F>
spool_code guard(const char* fn, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(SPOOL_IO, std::string(fn) + ": out of memory");
  } catch (const std::exception& e) {
    return fail(SPOOL_IO, std::string(fn) + ": internal error: " + e.what());
  } catch (...) {
    return fail(SPOOL_IO, std::string(fn) + ": internal error");
  }
}

spool_code null_arg(const char* fn, const char* what) {
  return fail(SPOOL_INVALID_ARGUMENT, std::string(fn) + ": " + what + " is NULL");
}

// True when the struct the caller compiled (whose size is `size`) holds `member`.
#define SPOOL_HAS(ptr, member) \
  ((ptr)->size >= offsetof(std::remove_reference_t<decltype(*(ptr))>, member) + sizeof((ptr)->member))

// Past INT64_MAX a uint64_t read as milliseconds would turn negative ("must not be
// negative" for UINT64_MAX, issue 48): held at INT64_MAX, which the C++ API names as out of
// range.
spool::Millis ms(uint64_t v) {
  return spool::Millis(static_cast<spool::Millis::rep>(std::min<uint64_t>(v, INT64_MAX)));
}

spool::Durability durability(int d) {
  return d == SPOOL_DURABILITY_SYNC ? spool::Durability::kSync : spool::Durability::kQueuePolicy;
}

// A durability a C caller gives: one of spool_durability (77 was taken as the queue's).
bool valid_durability(int d, const std::string& fn, std::string* why) {
  if (d == SPOOL_DURABILITY_QUEUE || d == SPOOL_DURABILITY_SYNC) return true;
  *why = fn + ": durability is " + std::to_string(d) + ": SPOOL_DURABILITY_QUEUE (0) or SPOOL_DURABILITY_SYNC (1)";
  return false;
}

// The sizes of the structs of 0.1.0, whose first added field starts where they ended.
constexpr size_t kOptionsSize010 = offsetof(spool_options, dedup_window_ms);
constexpr size_t kSendOptionsSize010 = offsetof(spool_send_options, attributes);
static_assert(sizeof(void*) != 8 || (kOptionsSize010 == 88 && kSendOptionsSize010 == 32),
              "the sizes spool.h states for 0.1.0's structs");

// Writes the defaults `full` (a whole struct, its size field first) over the first
// min(size, sizeof) bytes of `out`, and that count into its size field.
template <class S>
void init_prefix(S* out, const S& full, size_t size) {
  const size_t n = size < sizeof(S) ? size : sizeof(S);
  if (n < sizeof(size_t)) return;  // not even the size field fits: nothing to fill
  std::memcpy(static_cast<void*>(out), &full, n);
  out->size = n;
}

// The attributes a C caller gives. Errors read "<fn>: <owner>attributes[2].key is NULL",
// where owner is "opts->" or "items[3].". Checks what only the C side can get wrong (NULLs,
// a repeated key, a count that may be garbage); the C++ API checks and names the bounds.
bool to_attributes(const spool_attribute* attrs, size_t n, const std::string& fn, const std::string& owner,
                   spool::Attributes* out, std::string* why) {
  if (n == 0) return true;
  if (attrs == nullptr) {
    *why = fn + ": " + owner + "attributes is NULL with attribute_count " + std::to_string(n);
    return false;
  }
  if (n > SPOOL_MAX_ATTRIBUTES) {  // before reading that many
    *why = fn + ": " + owner + "attribute_count is " + std::to_string(n) + ": a message carries at most " +
           std::to_string(SPOOL_MAX_ATTRIBUTES) + " attributes";
    return false;
  }
  for (size_t i = 0; i < n; ++i) {
    const spool_attribute& a = attrs[i];
    const std::string which = fn + ": " + owner + "attributes[" + std::to_string(i) + "]";
    if (a.key == nullptr) {
      *why = which + ".key is NULL";
      return false;
    }
    if (a.value == nullptr && a.value_len > 0) {
      *why = which + ".value is NULL with value_len " + std::to_string(a.value_len);
      return false;
    }
    if (a.value_len > SPOOL_MAX_ATTRIBUTE_VALUE) {  // before reading that many (issue 48: SIGSEGV)
      *why = which + ": the value of '" + std::string(a.key) + "' has value_len " + std::to_string(a.value_len) +
             " bytes; at most " + std::to_string(SPOOL_MAX_ATTRIBUTE_VALUE);
      return false;
    }
    std::string value;
    if (a.value_len > 0) value.assign(static_cast<const char*>(a.value), a.value_len);
    if (!out->emplace(a.key, std::move(value)).second) {
      *why = which + ": the key '" + std::string(a.key) + "' is given twice";
      return false;
    }
  }
  return true;
}

bool to_dedup_id(const void* id, size_t len, const std::string& fn, const std::string& owner, std::string* out,
                 std::string* why) {
  if (len == 0) return true;
  if (id == nullptr) {
    *why = fn + ": " + owner + "dedup_id is NULL with dedup_id_len " + std::to_string(len);
    return false;
  }
  if (len > SPOOL_MAX_DEDUP_ID) {  // before reading that many (issue 48: SIGSEGV)
    *why = fn + ": " + owner + "dedup_id_len is " + std::to_string(len) + " bytes; at most " +
           std::to_string(SPOOL_MAX_DEDUP_ID);
    return false;
  }
  out->assign(static_cast<const char*>(id), len);
  return true;
}

// A priority a C caller gives: with `has` 0 the default stays. An int, checked here, rather
// than a uint8_t that would wrap 300 into 44 without a word.
bool to_priority(int has, int priority, const std::string& fn, const std::string& owner, uint8_t* out,
                 std::string* why) {
  if (has == 0) return true;
  if (priority < 0 || priority > 255) {
    *why = fn + ": " + owner + "priority is " + std::to_string(priority) + ": 0 (most urgent) to 255";
    return false;
  }
  *out = static_cast<uint8_t>(priority);
  return true;
}

static_assert(SPOOL_DEFAULT_PRIORITY == spool::kDefaultPriority);

// A group a C caller gives. The length is checked here, before the bytes are read: a length
// that is garbage (an unset field) must not be copied from.
bool to_group(const void* group, size_t len, const std::string& fn, const std::string& owner, std::string* out,
              std::string* why) {
  if (len == 0) return true;
  if (group == nullptr) {
    *why = fn + ": " + owner + "group is NULL with group_len " + std::to_string(len);
    return false;
  }
  if (len > SPOOL_MAX_GROUP) {
    *why = fn + ": " + owner + "group_len is " + std::to_string(len) + ": a group key is 1 to " +
           std::to_string(SPOOL_MAX_GROUP) + " bytes";
    return false;
  }
  out->assign(static_cast<const char*>(group), len);
  return true;
}

// QueueOptions as the C struct, whole (size: this header's).
spool_options c_options(const spool::QueueOptions& o) {
  spool_options c{};
  c.size = sizeof(spool_options);
  c.visibility_ms = static_cast<uint64_t>(o.visibility.count());
  c.max_receives = o.max_receives;
  c.sync = o.sync == spool::SyncPolicy::kAlways  ? SPOOL_SYNC_ALWAYS
           : o.sync == spool::SyncPolicy::kNever ? SPOOL_SYNC_NEVER
                                                  : SPOOL_SYNC_INTERVAL;
  c.sync_interval_ms = static_cast<uint64_t>(o.sync_interval.count());
  c.segment_size = o.segment_size;
  c.max_payload = o.max_payload;
  c.retention_max_age_ms = static_cast<uint64_t>(o.retention_max_age.count());
  c.retention_max_bytes = o.retention_max_bytes;
  c.max_ready = o.max_ready;
  c.max_bytes = o.max_bytes;
  c.create = o.create ? 1 : 0;
  c.dedup_window_ms = static_cast<uint64_t>(o.dedup_window.count());
  c.keep_acked_ms = static_cast<uint64_t>(o.keep_acked.count());
  return c;
}

bool to_queue_options(const spool_options* o, spool::QueueOptions* out, std::string* why) {
  if (o == nullptr) return true;
  if (o->size < sizeof(size_t)) {
    *why = "spool_open: opts->size is not set (call spool_options_init)";
    return false;
  }
  if (SPOOL_HAS(o, visibility_ms)) out->visibility = ms(o->visibility_ms);
  if (SPOOL_HAS(o, max_receives)) out->max_receives = o->max_receives;
  if (SPOOL_HAS(o, sync)) {
    switch (o->sync) {
      case SPOOL_SYNC_ALWAYS: out->sync = spool::SyncPolicy::kAlways; break;
      case SPOOL_SYNC_INTERVAL: out->sync = spool::SyncPolicy::kInterval; break;
      case SPOOL_SYNC_NEVER: out->sync = spool::SyncPolicy::kNever; break;
      default:
        *why = "spool_open: opts->sync is " + std::to_string(o->sync) +
               ", not one of SPOOL_SYNC_ALWAYS, SPOOL_SYNC_INTERVAL, SPOOL_SYNC_NEVER";
        return false;
    }
  }
  if (SPOOL_HAS(o, sync_interval_ms)) out->sync_interval = ms(o->sync_interval_ms);
  if (SPOOL_HAS(o, segment_size)) out->segment_size = o->segment_size;
  if (SPOOL_HAS(o, max_payload)) out->max_payload = o->max_payload;
  if (SPOOL_HAS(o, retention_max_age_ms)) out->retention_max_age = ms(o->retention_max_age_ms);
  if (SPOOL_HAS(o, retention_max_bytes)) out->retention_max_bytes = o->retention_max_bytes;
  if (SPOOL_HAS(o, max_ready)) out->max_ready = o->max_ready;
  if (SPOOL_HAS(o, max_bytes)) out->max_bytes = o->max_bytes;
  if (SPOOL_HAS(o, create)) out->create = o->create != 0;
  if (SPOOL_HAS(o, dedup_window_ms)) out->dedup_window = ms(o->dedup_window_ms);
  if (SPOOL_HAS(o, keep_acked_ms)) out->keep_acked = ms(o->keep_acked_ms);
  return true;
}

bool to_send_options(const std::string& fn, const spool_send_options* o, spool::SendOptions* out,
                     std::string* why) {
  if (o == nullptr) return true;
  if (o->size < sizeof(size_t)) {
    *why = fn + ": opts->size is not set (call spool_send_options_init)";
    return false;
  }
  if (SPOOL_HAS(o, delay_ms)) out->delay = ms(o->delay_ms);
  if (SPOOL_HAS(o, durability)) {
    if (!valid_durability(o->durability, fn, why)) return false;
    out->durability = durability(o->durability);
  }
  if (SPOOL_HAS(o, wait_for_room_ms)) out->wait_for_room = ms(o->wait_for_room_ms);
  if (SPOOL_HAS(o, attribute_count) &&
      !to_attributes(o->attributes, o->attribute_count, fn, "opts->", &out->attributes, why))
    return false;
  if (SPOOL_HAS(o, dedup_id_len) && !to_dedup_id(o->dedup_id, o->dedup_id_len, fn, "opts->", &out->dedup_id, why))
    return false;
  if (SPOOL_HAS(o, priority) && !to_priority(o->has_priority, o->priority, fn, "opts->", &out->priority, why))
    return false;
  if (SPOOL_HAS(o, group_len) && !to_group(o->group, o->group_len, fn, "opts->", &out->group, why)) return false;
  return true;
}

// The caller's duplicate flag, if its struct holds one and it is set.
int* duplicate_flag(const spool_send_options* o) {
  return o != nullptr && SPOOL_HAS(o, duplicate) ? o->duplicate : nullptr;
}

// A batch of messages handed to C. Lives in one allocation with the array after it.
struct Batch {
  // Tells a batch from a pointer into one (&msgs[i] given for msgs): the accessors refuse
  // those instead of reading a Batch that is not there.
  static constexpr uint64_t kMagic = 0x73706f6f6c426174;  // "spoolBat"
  uint64_t magic = kMagic;
  std::vector<spool::MessageView> views;  // spool_receive: payloads point into mappings
  std::vector<spool::Message> copies;     // spool_receive_id, spool_peek: owned payloads
  // attrs[i]: message i's attributes as C pairs, pointing into the strings of its
  // Attributes in views / copies (map nodes: their addresses do not move).
  std::vector<std::vector<spool_attribute>> attrs;
  std::vector<uint8_t> priorities;
  std::vector<std::string_view> groups;  // into the group strings of views / copies
  size_t count = 0;
};
// The array starts this far into the allocation (a multiple of both alignments).
constexpr size_t kArrayOffset =
    (sizeof(Batch) + alignof(spool_message) - 1) / alignof(spool_message) * alignof(spool_message);

int64_t to_ns(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Allocates a Batch with room for n messages; returns the array.
spool_message* new_batch(size_t n, Batch** batch) {
  void* mem = ::operator new(kArrayOffset + n * sizeof(spool_message));
  *batch = new (mem) Batch();
  (*batch)->count = n;
  return reinterpret_cast<spool_message*>(static_cast<char*>(mem) + kArrayOffset);
}

Batch* owner_of(spool_message* msgs) {
  return std::launder(reinterpret_cast<Batch*>(reinterpret_cast<char*>(msgs) - kArrayOffset));
}

const Batch* owner_of(const spool_message* msgs) {
  return std::launder(reinterpret_cast<const Batch*>(reinterpret_cast<const char*>(msgs) - kArrayOffset));
}

// The batch `msgs` if it holds a message i, or null (with the error set).
const Batch* batch_at(const char* fn, const spool_message* msgs, size_t i) {
  const Batch* b = owner_of(msgs);
  if (b->magic != Batch::kMagic) {
    fail(SPOOL_INVALID_ARGUMENT, std::string(fn) + ": msgs is not a batch from spool_receive, spool_receive_id or "
                                                   "spool_peek (pass the array itself and the index, not &msgs[i])");
    return nullptr;
  }
  if (i >= b->count) {
    fail(SPOOL_INVALID_ARGUMENT, std::string(fn) + ": message " + std::to_string(i) + " of a batch of " +
                                     std::to_string(b->count));
    return nullptr;
  }
  return b;
}

const std::vector<spool_attribute>* attributes_of(const char* fn, const spool_message* msgs, size_t i) {
  const Batch* b = batch_at(fn, msgs, i);
  return b == nullptr ? nullptr : &b->attrs[i];
}

// Moves `msgs` (MessageView or Message) into a new batch and fills its array from them.
template <class M>
spool_message* batch_of(std::vector<M> msgs, std::vector<M> Batch::*slot) {
  Batch* b = nullptr;
  spool_message* out = new_batch(msgs.size(), &b);
  std::vector<M>& kept = b->*slot;
  kept = std::move(msgs);
  b->attrs.resize(kept.size());
  b->priorities.resize(kept.size());
  b->groups.resize(kept.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    const M& m = kept[i];
    out[i] = spool_message{m.id, m.payload.data(), m.payload.size(), m.receive_count,
                           to_ns(m.enqueued), m.receipt.c_str()};
    b->priorities[i] = m.priority;
    b->groups[i] = m.group;
    b->attrs[i].reserve(m.attributes.size());
    for (const auto& [k, v] : m.attributes) b->attrs[i].push_back(spool_attribute{k.c_str(), v.c_str(), v.size()});
  }
  return out;
}

// A malloc'd copy of `s`, for spool_free.
char* c_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) throw std::bad_alloc();
  std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}


// Up to `max` dead letters of q marked spool.dead.subscription=`subscription`, in
// dead-letter id order, as peek() gives them; every one for "". The mark is in each record,
// not the index, so a name reads every dead letter's record, a page of ids at a time: only
// the matches are held.
spool::Result<std::vector<spool::Message>> dead_letters_marked(spool::Queue& q, std::string_view subscription,
                                                               size_t max) {
  auto dlq = q.dead_letters();
  if (!dlq.ok()) return dlq.status();
  if (subscription.empty()) return (*dlq)->peek(max);
  std::vector<spool::Message> out;
  for (uint64_t after = 0; out.size() < max;) {
    auto page = (*dlq)->list(256, spool::StateFilter{}, after);
    if (!page.ok()) return page.status();
    if (page->empty()) break;
    for (const spool::MessageInfo& info : *page) {
      after = info.id;
      auto one = (*dlq)->show(info.id);
      if (!one.ok() && one.status().code() == spool::Code::kNotFound) continue;  // redriven or removed meanwhile
      if (!one.ok()) return one.status();
      const spool::Attributes& attrs = one->first.attributes;
      auto mark = attrs.find("spool.dead.subscription");
      if (mark == attrs.end() || mark->second != subscription) continue;
      out.push_back(std::move(one->first));
      if (out.size() == max) break;
    }
  }
  return out;
}

// spool_open and spool_open_subscription: `subscription` NULL opens the queue's own view.
spool_code open_queue(const char* fn, const char* dir, const spool_options* opts, const char* subscription,
                      spool_queue** out) {
  return guard(fn, [&] {
    if (out == nullptr) return null_arg(fn, "out");
    *out = nullptr;
    if (dir == nullptr) return null_arg(fn, "dir");
    spool::QueueOptions qo;
    std::string why;
    if (!to_queue_options(opts, &qo, &why)) return fail(SPOOL_INVALID_ARGUMENT, why);
    if (subscription != nullptr) {
      // The C++ option reads "" as the queue's own view; here a name is required.
      if (*subscription == '\0') return fail(SPOOL_INVALID_ARGUMENT, std::string(fn) + ": subscription is \"\"");
      qo.subscription = subscription;
    }
    auto q = spool::Queue::open(dir, qo);
    if (!q.ok()) return fail(q.status());
    auto h = std::make_unique<spool_queue>();
    h->owned = std::move(*q);
    h->queue = h->owned.get();
    *out = h.release();
    return SPOOL_OK;
  });
}

}  // namespace

extern "C" {

const char* spool_code_name(int code) {
  if (code < SPOOL_OK || code > SPOOL_READ_ONLY) return "unknown";
  return spool::code_name(static_cast<spool::Code>(code));
}

const char* spool_last_error(void) { return t_last_error.c_str(); }

void spool_options_init_size(spool_options* opts, size_t size) {
  if (opts == nullptr) return;
  init_prefix(opts, c_options(spool::QueueOptions{}), size);
}

void(spool_options_init)(spool_options* opts) { spool_options_init_size(opts, kOptionsSize010); }

spool_code spool_open(const char* dir, const spool_options* opts, spool_queue** out) {
  return open_queue("spool_open", dir, opts, nullptr, out);
}

spool_code spool_open_subscription(const char* dir, const spool_options* opts, const char* subscription,
                                   spool_queue** out) {
  return guard("spool_open_subscription", [&] {
    if (subscription == nullptr) {
      if (out != nullptr) *out = nullptr;
      return null_arg("spool_open_subscription", "subscription");
    }
    return open_queue("spool_open_subscription", dir, opts, subscription, out);
  });
}

void spool_close(spool_queue* q) {
  if (q == nullptr || q->owned == nullptr) return;  // the dead-letter handle: its queue closes it
  delete q;  // ~Queue does not throw
}

const char* spool_dir(spool_queue* q) { return q == nullptr ? "" : q->queue->dir().c_str(); }

spool_code spool_get_options(spool_queue* q, spool_options* out) {
  return guard("spool_get_options", [&] {
    if (q == nullptr) return null_arg("spool_get_options", "q");
    if (out == nullptr) return null_arg("spool_get_options", "out");
    if (out->size < sizeof(size_t))
      return fail(SPOOL_INVALID_ARGUMENT, "spool_get_options: out->size is not set");
    const size_t size = out->size;
    spool_options full = c_options(q->queue->options());
    full.create = 0;
    std::memcpy(static_cast<void*>(out), &full, size < sizeof full ? size : sizeof full);
    out->size = size;
    return SPOOL_OK;
  });
}

void spool_send_options_init_size(spool_send_options* opts, size_t size) {
  if (opts == nullptr) return;
  spool_send_options full{};
  full.size = sizeof(spool_send_options);
  full.durability = SPOOL_DURABILITY_QUEUE;
  full.priority = SPOOL_DEFAULT_PRIORITY;  // what has_priority = 1 alone then asks for
  init_prefix(opts, full, size);
}

void(spool_send_options_init)(spool_send_options* opts) {
  spool_send_options_init_size(opts, kSendOptionsSize010);
}

spool_code spool_send(spool_queue* q, const void* payload, size_t len,
                      const spool_send_options* opts, uint64_t* id) {
  return guard("spool_send", [&] {
    if (q == nullptr) return null_arg("spool_send", "q");
    if (payload == nullptr && len > 0) return null_arg("spool_send", "payload");
    spool::SendOptions so;
    std::string why;
    if (!to_send_options("spool_send", opts, &so, &why)) return fail(SPOOL_INVALID_ARGUMENT, why);
    int* flag = duplicate_flag(opts);
    bool dup = false;
    auto r = q->queue->send(std::string_view(static_cast<const char*>(payload), len), so,
                            flag != nullptr ? &dup : nullptr);
    if (!r.ok()) return fail(r.status());
    if (id != nullptr) *id = *r;
    if (flag != nullptr) *flag = dup ? 1 : 0;
    return SPOOL_OK;
  });
}

spool_code spool_send_batch(spool_queue* q, const void* const* payloads, const size_t* lens,
                            size_t n, const spool_send_options* opts, uint64_t* ids) {
  return guard("spool_send_batch", [&] {
    if (q == nullptr) return null_arg("spool_send_batch", "q");
    if (n > 0 && (payloads == nullptr || lens == nullptr))
      return null_arg("spool_send_batch", "payloads or lens");
    spool::SendOptions so;
    std::string why;
    if (!to_send_options("spool_send_batch", opts, &so, &why)) return fail(SPOOL_INVALID_ARGUMENT, why);
    if (!so.dedup_id.empty())
      return fail(SPOOL_INVALID_ARGUMENT,
                  "spool_send_batch: a batch cannot share opts->dedup_id (all but the first message would be "
                  "duplicates); give each message its own with spool_send_items");
    if (duplicate_flag(opts) != nullptr)
      return fail(SPOOL_INVALID_ARGUMENT,
                  "spool_send_batch: opts->duplicate is for spool_send: a batch of payloads has no dedup id "
                  "(spool_send_items reports per item)");
    std::vector<std::string_view> views;
    views.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (payloads[i] == nullptr && lens[i] > 0)
        return fail(SPOOL_INVALID_ARGUMENT,
                    "spool_send_batch: payloads[" + std::to_string(i) + "] is NULL");
      views.emplace_back(static_cast<const char*>(payloads[i]), lens[i]);
    }
    auto r = q->queue->send_batch(views, so);
    if (!r.ok()) return fail(r.status());
    if (ids != nullptr)
      for (size_t i = 0; i < r->size(); ++i) ids[i] = (*r)[i];
    return SPOOL_OK;
  });
}

spool_code spool_send_items(spool_queue* q, const spool_send_item* items, size_t n,
                            size_t item_size, const spool_send_options* opts, uint64_t* ids) {
  return guard("spool_send_items", [&] {
    if (q == nullptr) return null_arg("spool_send_items", "q");
    if (n > 0 && items == nullptr) return null_arg("spool_send_items", "items");
    constexpr size_t kLeast = offsetof(spool_send_item, len) + sizeof(size_t);
    if (n > 0 && item_size < kLeast)
      return fail(SPOOL_INVALID_ARGUMENT, "spool_send_items: item_size is " + std::to_string(item_size) +
                                              ", less than a payload and its length; pass sizeof(spool_send_item)");
    spool::SendOptions so;
    std::string why;
    if (!to_send_options("spool_send_items", opts, &so, &why)) return fail(SPOOL_INVALID_ARGUMENT, why);
    const bool opts_priority = opts != nullptr && SPOOL_HAS(opts, priority) && opts->has_priority != 0;
    if (!so.attributes.empty() || !so.dedup_id.empty() || opts_priority || duplicate_flag(opts) != nullptr ||
        !so.group.empty())
      return fail(SPOOL_INVALID_ARGUMENT, "spool_send_items: opts->attributes, dedup_id, priority, duplicate and "
                                          "group must be unset: each item gives its own");
    std::vector<spool::SendItem> conv(n);
    std::vector<int*> flags(n, nullptr);
    bool any_flag = false;
    for (size_t i = 0; i < n; ++i) {
      // The caller's array has its own stride; read only what an item of that size holds.
      spool_send_item it{};
      std::memcpy(&it, reinterpret_cast<const char*>(items) + i * item_size,
                  item_size < sizeof it ? item_size : sizeof it);
      const std::string owner = "items[" + std::to_string(i) + "].";
      if (it.payload == nullptr && it.len > 0)
        return fail(SPOOL_INVALID_ARGUMENT, "spool_send_items: " + owner + "payload is NULL");
      conv[i].payload = std::string_view(static_cast<const char*>(it.payload), it.len);
      if (!to_attributes(it.attributes, it.attribute_count, "spool_send_items", owner, &conv[i].attributes, &why) ||
          !to_dedup_id(it.dedup_id, it.dedup_id_len, "spool_send_items", owner, &conv[i].dedup_id, &why) ||
          !to_priority(it.has_priority, it.priority, "spool_send_items", owner, &conv[i].priority, &why) ||
          !to_group(it.group, it.group_len, "spool_send_items", owner, &conv[i].group, &why))
        return fail(SPOOL_INVALID_ARGUMENT, why);
      flags[i] = it.duplicate;
      any_flag = any_flag || it.duplicate != nullptr;
    }
    std::vector<bool> dups;
    auto r = q->queue->send_batch(std::span<const spool::SendItem>(conv), so, any_flag ? &dups : nullptr);
    if (!r.ok()) return fail(r.status());
    if (ids != nullptr)
      for (size_t i = 0; i < r->size(); ++i) ids[i] = (*r)[i];
    if (any_flag)
      for (size_t i = 0; i < n; ++i)
        if (flags[i] != nullptr) *flags[i] = dups[i] ? 1 : 0;
    return SPOOL_OK;
  });
}

uint64_t spool_durable_id(spool_queue* q) { return q == nullptr ? 0 : q->queue->durable_id(); }

spool_code spool_receive(spool_queue* q, size_t max, uint64_t visibility_ms, uint64_t wait_ms,
                         spool_message** msgs, size_t* count) {
  return guard("spool_receive", [&] {
    if (msgs == nullptr || count == nullptr) return null_arg("spool_receive", "msgs or count");
    *msgs = nullptr;
    *count = 0;
    if (q == nullptr) return null_arg("spool_receive", "q");
    auto r = q->queue->receive_views(max, ms(visibility_ms), ms(wait_ms));
    if (!r.ok()) return fail(r.status());
    if (r->empty()) return fail(SPOOL_EMPTY, "spool_receive: no message was receivable");
    const size_t n = r->size();
    *msgs = batch_of(std::move(*r), &Batch::views);
    *count = n;
    return SPOOL_OK;
  });
}

spool_code spool_receive_id(spool_queue* q, uint64_t id, uint64_t visibility_ms,
                            spool_message** msg) {
  return guard("spool_receive_id", [&] {
    if (msg == nullptr) return null_arg("spool_receive_id", "msg");
    *msg = nullptr;
    if (q == nullptr) return null_arg("spool_receive_id", "q");
    auto r = q->queue->receive_id(id, ms(visibility_ms));
    if (!r.ok()) return fail(r.status());
    std::vector<spool::Message> one;
    one.push_back(std::move(*r));
    *msg = batch_of(std::move(one), &Batch::copies);
    return SPOOL_OK;
  });
}

spool_code spool_peek(spool_queue* q, size_t max, spool_message** msgs, size_t* count) {
  return guard("spool_peek", [&] {
    if (msgs == nullptr || count == nullptr) return null_arg("spool_peek", "msgs or count");
    *msgs = nullptr;
    *count = 0;
    if (q == nullptr) return null_arg("spool_peek", "q");
    auto r = q->queue->peek(max);
    if (!r.ok()) return fail(r.status());
    if (r->empty()) return SPOOL_OK;
    const size_t n = r->size();
    *msgs = batch_of(std::move(*r), &Batch::copies);
    *count = n;
    return SPOOL_OK;
  });
}

void spool_messages_free(spool_message* msgs) {
  if (msgs == nullptr) return;
  Batch* b = owner_of(msgs);
  b->~Batch();
  ::operator delete(static_cast<void*>(b));
}

spool_code spool_message_attributes(const spool_message* msgs, size_t i,
                                    const spool_attribute** attrs, size_t* count) {
  return guard("spool_message_attributes", [&] {
    if (attrs == nullptr || count == nullptr) return null_arg("spool_message_attributes", "attrs or count");
    *attrs = nullptr;
    *count = 0;
    if (msgs == nullptr) return null_arg("spool_message_attributes", "msgs");
    const auto* a = attributes_of("spool_message_attributes", msgs, i);
    if (a == nullptr) return SPOOL_INVALID_ARGUMENT;
    if (!a->empty()) {
      *attrs = a->data();
      *count = a->size();
    }
    return SPOOL_OK;
  });
}

spool_code spool_message_attribute(const spool_message* msgs, size_t i, const char* key,
                                   const void** value, size_t* value_len) {
  return guard("spool_message_attribute", [&] {
    if (value != nullptr) *value = nullptr;
    if (value_len != nullptr) *value_len = 0;
    if (msgs == nullptr || key == nullptr) return null_arg("spool_message_attribute", "msgs or key");
    const auto* a = attributes_of("spool_message_attribute", msgs, i);
    if (a == nullptr) return SPOOL_INVALID_ARGUMENT;
    for (const spool_attribute& p : *a) {
      if (std::strcmp(p.key, key) != 0) continue;
      if (value != nullptr) *value = p.value;
      if (value_len != nullptr) *value_len = p.value_len;
      return SPOOL_OK;
    }
    return fail(SPOOL_NOT_FOUND, "spool_message_attribute: message " + std::to_string(msgs[i].id) +
                                     " has no attribute '" + key + "'");
  });
}

spool_code spool_message_priority(const spool_message* msgs, size_t i, int* priority) {
  return guard("spool_message_priority", [&] {
    if (msgs == nullptr || priority == nullptr) return null_arg("spool_message_priority", "msgs or priority");
    const Batch* b = batch_at("spool_message_priority", msgs, i);
    if (b == nullptr) return SPOOL_INVALID_ARGUMENT;
    *priority = b->priorities[i];
    return SPOOL_OK;
  });
}

spool_code spool_message_group(const spool_message* msgs, size_t i, const void** group,
                               size_t* group_len) {
  return guard("spool_message_group", [&] {
    if (group == nullptr || group_len == nullptr) return null_arg("spool_message_group", "group or group_len");
    *group = nullptr;
    *group_len = 0;
    if (msgs == nullptr) return null_arg("spool_message_group", "msgs");
    const Batch* b = batch_at("spool_message_group", msgs, i);
    if (b == nullptr) return SPOOL_INVALID_ARGUMENT;
    if (!b->groups[i].empty()) {
      *group = b->groups[i].data();
      *group_len = b->groups[i].size();
    }
    return SPOOL_OK;
  });
}

spool_code spool_list(spool_queue* q, size_t max, int ready_only, spool_message_info** infos,
                      size_t* count) {
  return guard("spool_list", [&] {
    if (infos == nullptr || count == nullptr) return null_arg("spool_list", "infos or count");
    *infos = nullptr;
    *count = 0;
    if (q == nullptr) return null_arg("spool_list", "q");
    auto r = q->queue->list(max, ready_only != 0 ? spool::StateFilter::only(spool::MessageState::kReady) : spool::StateFilter{});
    if (!r.ok()) return fail(r.status());
    if (r->empty()) return SPOOL_OK;
    auto* out = static_cast<spool_message_info*>(std::malloc(r->size() * sizeof(spool_message_info)));
    if (out == nullptr) throw std::bad_alloc();
    for (size_t i = 0; i < r->size(); ++i) {
      const auto& m = (*r)[i];
      out[i] = spool_message_info{m.id, m.size, m.receive_count, m.ready ? 1 : 0};
    }
    *infos = out;
    *count = r->size();
    return SPOOL_OK;
  });
}

void spool_free(void* p) { std::free(p); }

spool_code spool_ack(spool_queue* q, const char* receipt, int durability_) {
  return guard("spool_ack", [&] {
    if (q == nullptr || receipt == nullptr) return null_arg("spool_ack", "q or receipt");
    if (std::string why; !valid_durability(durability_, "spool_ack", &why)) return fail(SPOOL_INVALID_ARGUMENT, why);
    spool::Status s = q->queue->ack(receipt, durability(durability_));
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

spool_code spool_ack_batch(spool_queue* q, const char* const* receipts, size_t n, int durability_,
                           spool_code* results) {
  return guard("spool_ack_batch", [&] {
    if (q == nullptr || (receipts == nullptr && n != 0)) return null_arg("spool_ack_batch", "q or receipts");
    if (std::string why; !valid_durability(durability_, "spool_ack_batch", &why)) return fail(SPOOL_INVALID_ARGUMENT, why);
    std::vector<std::string_view> rs;
    rs.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (receipts[i] == nullptr) {
        return fail(SPOOL_INVALID_ARGUMENT, "spool_ack_batch: receipts[" + std::to_string(i) + "] is NULL");
      }
      rs.emplace_back(receipts[i]);
    }
    auto r = q->queue->ack_batch(rs, durability(durability_));
    if (!r.ok()) {
      for (size_t i = 0; results != nullptr && i < n; ++i) results[i] = static_cast<spool_code>(r.status().code());
      return fail(r.status());
    }
    spool_code first = SPOOL_OK;
    for (size_t i = 0; i < n; ++i) {
      const spool::Status& s = (*r)[i];
      if (results != nullptr) results[i] = static_cast<spool_code>(s.code());
      if (!s.ok() && first == SPOOL_OK) first = fail(s);
    }
    return first;
  });
}

spool_code spool_remove(spool_queue* q, uint64_t id, int durability_) {
  return guard("spool_remove", [&] {
    if (q == nullptr) return null_arg("spool_remove", "q");
    if (std::string why; !valid_durability(durability_, "spool_remove", &why)) return fail(SPOOL_INVALID_ARGUMENT, why);
    spool::Status s = q->queue->remove(id, durability(durability_));
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

spool_code spool_nack(spool_queue* q, const char* receipt, uint64_t delay_ms) {
  return guard("spool_nack", [&] {
    if (q == nullptr || receipt == nullptr) return null_arg("spool_nack", "q or receipt");
    spool::Status s = q->queue->nack(receipt, ms(delay_ms));
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

spool_code spool_extend(spool_queue* q, const char* receipt, uint64_t visibility_ms) {
  return guard("spool_extend", [&] {
    if (q == nullptr || receipt == nullptr) return null_arg("spool_extend", "q or receipt");
    spool::Status s = q->queue->extend(receipt, ms(visibility_ms));
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

spool_code spool_bind_leases(spool_queue* q) {
  return guard("spool_bind_leases", [&] {
    if (q == nullptr) return null_arg("spool_bind_leases", "q");
    spool::Status s = q->queue->bind_leases();
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

spool_code spool_bind(spool_queue* q, const char* receipt) {
  return guard("spool_bind", [&] {
    if (q == nullptr || receipt == nullptr) return null_arg("spool_bind", "q or receipt");
    spool::Status s = q->queue->bind(receipt);
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

spool_code spool_keeper_start(spool_queue* q, const char* receipt, uint64_t interval_ms,
                              uint64_t extend_by_ms, uint64_t max_lifetime_ms,
                              spool_keeper** out) {
  return guard("spool_keeper_start", [&] {
    if (out == nullptr) return null_arg("spool_keeper_start", "out");
    *out = nullptr;
    if (q == nullptr || receipt == nullptr) return null_arg("spool_keeper_start", "q or receipt");
    if (interval_ms == 0 || extend_by_ms == 0)
      return fail(SPOOL_INVALID_ARGUMENT, "spool_keeper_start: interval_ms and extend_by_ms must be > 0");
    spool::LeaseKeeper::Options o;
    o.interval = ms(interval_ms);
    o.extend_by = ms(extend_by_ms);
    o.max_lifetime = ms(max_lifetime_ms);
    auto k = std::make_unique<spool_keeper>();
    k->keeper = std::make_unique<spool::LeaseKeeper>(*q->queue, receipt, o);
    *out = k.release();
    return SPOOL_OK;
  });
}

spool_code spool_keeper_status(spool_keeper* k) {
  return guard("spool_keeper_status", [&] {
    if (k == nullptr) return null_arg("spool_keeper_status", "k");
    spool::Status s = k->keeper->status();
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

uint64_t spool_keeper_renewals(spool_keeper* k) {
  return k == nullptr ? 0 : k->keeper->renewals();
}

void spool_keeper_free(spool_keeper* k) { delete k; }

spool_code spool_get_stats(spool_queue* q, spool_stats* out) {
  return guard("spool_get_stats", [&] {
    if (q == nullptr || out == nullptr) return null_arg("spool_get_stats", "q or out");
    if (out->size < sizeof(size_t))
      return fail(SPOOL_INVALID_ARGUMENT,
                  "spool_get_stats: out->size is not set (spool_stats st = {.size = sizeof st})");
    auto r = q->queue->stats();
    if (!r.ok()) return fail(r.status());
    const spool::Stats& s = *r;
    spool_stats full{sizeof(spool_stats), s.ready, s.in_flight, s.delayed, s.dead,
                     s.oldest_ready_age_s, s.sent_total, s.acked_total, s.dead_lettered_total,
                     s.expired_total, s.nacked_total, s.bytes, s.bytes_on_disk, s.segments,
                     s.next_id, s.dedup_ids, s.kept_acked, s.kept_acked_bytes, s.blocked,
                     s.paused ? 1u : 0u, s.held_back_bytes};
    const size_t size = out->size;
    std::memcpy(static_cast<void*>(out), &full, size < sizeof full ? size : sizeof full);
    out->size = size;
    return SPOOL_OK;
  });
}

uint64_t spool_workers_needed(const spool_stats* stats, double rate_per_worker,
                              double latency_target_s) {
  if (stats == nullptr || !SPOOL_HAS(stats, ready)) return 0;
  spool::Stats s;
  s.ready = stats->ready;
  return s.workers_needed(rate_per_worker, latency_target_s);
}

spool_code spool_sync(spool_queue* q) {
  return guard("spool_sync", [&] {
    if (q == nullptr) return null_arg("spool_sync", "q");
    spool::Status s = q->queue->sync();
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

spool_code spool_purge(spool_queue* q, uint64_t* removed) {
  return guard("spool_purge", [&] {
    if (q == nullptr) return null_arg("spool_purge", "q");
    auto r = q->queue->purge();
    if (!r.ok()) return fail(r.status());
    if (removed != nullptr) *removed = *r;
    return SPOOL_OK;
  });
}

spool_code spool_pause(spool_queue* q) {
  return guard("spool_pause", [&] {
    if (q == nullptr) return null_arg("spool_pause", "q");
    spool::Status s = q->queue->pause();
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

spool_code spool_resume(spool_queue* q) {
  return guard("spool_resume", [&] {
    if (q == nullptr) return null_arg("spool_resume", "q");
    spool::Status s = q->queue->resume();
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

spool_code spool_release(spool_queue* q, uint64_t id) {
  return guard("spool_release", [&] {
    if (q == nullptr) return null_arg("spool_release", "q");
    spool::Status s = q->queue->release(id);
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

spool_code spool_compact(spool_queue* q, spool_compact_result* out) {
  return guard("spool_compact", [&] {
    if (q == nullptr) return null_arg("spool_compact", "q");
    auto r = q->queue->compact();
    if (!r.ok()) return fail(r.status());
    if (out != nullptr) *out = spool_compact_result{r->segments_removed, r->messages_copied, r->bytes_freed};
    return SPOOL_OK;
  });
}

spool_code spool_verify(spool_queue* q, int repair, size_t* problems, char** report) {
  return guard("spool_verify", [&] {
    if (report != nullptr) *report = nullptr;
    if (q == nullptr || problems == nullptr) return null_arg("spool_verify", "q or problems");
    *problems = 0;
    auto r = q->queue->verify(repair != 0);
    if (!r.ok()) return fail(r.status());
    *problems = r->problems.size();
    if (report != nullptr) {
      std::string text;
      for (const auto& p : r->problems) text += "problem: " + p + "\n";
      for (const auto& p : r->repairs) text += "repair: " + p + "\n";
      *report = c_string(text);
    }
    return SPOOL_OK;
  });
}

spool_code spool_add_subscription(spool_queue* q, const char* name, int from_start) {
  return guard("spool_add_subscription", [&] {
    if (q == nullptr || name == nullptr) return null_arg("spool_add_subscription", "q or name");
    spool::Status s = q->queue->add_subscription(name, from_start != 0);
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

spool_code spool_add_subscription_max_receives(spool_queue* q, const char* name, int from_start,
                                               uint32_t max_receives) {
  return guard("spool_add_subscription_max_receives", [&] {
    if (q == nullptr || name == nullptr) return null_arg("spool_add_subscription_max_receives", "q or name");
    spool::Status s = q->queue->add_subscription(name, from_start != 0, max_receives);
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

spool_code spool_remove_subscription(spool_queue* q, const char* name) {
  return guard("spool_remove_subscription", [&] {
    if (q == nullptr || name == nullptr) return null_arg("spool_remove_subscription", "q or name");
    spool::Status s = q->queue->remove_subscription(name);
    return s.ok() ? SPOOL_OK : fail(s);
  });
}

// One malloc'd block, so one spool_free frees it: the array, then the names.
spool_code spool_subscriptions(spool_queue* q, spool_subscription_info** subs, size_t* count) {
  return guard("spool_subscriptions", [&] {
    if (subs == nullptr || count == nullptr) return null_arg("spool_subscriptions", "subs or count");
    *subs = nullptr;
    *count = 0;
    if (q == nullptr) return null_arg("spool_subscriptions", "q");
    auto r = q->queue->subscriptions();
    if (!r.ok()) return fail(r.status());
    if (r->empty()) return SPOOL_OK;
    size_t bytes = r->size() * sizeof(spool_subscription_info);
    for (const auto& sub : *r) bytes += sub.name.size() + 1;
    auto* block = static_cast<char*>(std::malloc(bytes));
    if (block == nullptr) throw std::bad_alloc();
    auto* out = reinterpret_cast<spool_subscription_info*>(block);
    char* names = block + r->size() * sizeof(spool_subscription_info);
    for (size_t i = 0; i < r->size(); ++i) {
      const auto& sub = (*r)[i];
      std::memcpy(names, sub.name.c_str(), sub.name.size() + 1);
      out[i] = spool_subscription_info{names, sub.from, sub.messages, sub.leased, sub.max_receives};
      names += sub.name.size() + 1;
    }
    *subs = out;
    *count = r->size();
    return SPOOL_OK;
  });
}

spool_code spool_dead_letters(spool_queue* q, spool_queue** dlq) {
  return guard("spool_dead_letters", [&] {
    if (q == nullptr || dlq == nullptr) return null_arg("spool_dead_letters", "q or dlq");
    *dlq = nullptr;
    std::lock_guard<std::mutex> lock(q->dlq_mu);
    if (q->dlq == nullptr) {
      auto r = q->queue->dead_letters();
      if (!r.ok()) return fail(r.status());
      auto h = std::make_unique<spool_queue>();
      h->queue = *r;
      q->dlq = std::move(h);
    }
    *dlq = q->dlq.get();
    return SPOOL_OK;
  });
}

spool_code spool_redrive(spool_queue* q, size_t max, uint64_t* moved) {
  return guard("spool_redrive", [&] {
    if (q == nullptr) return null_arg("spool_redrive", "q");
    auto r = q->queue->redrive(max);
    if (!r.ok()) return fail(r.status());
    if (moved != nullptr) *moved = *r;
    return SPOOL_OK;
  });
}

spool_code spool_redrive_subscription(spool_queue* q, size_t max, const char* subscription,
                                      uint64_t* moved) {
  return guard("spool_redrive_subscription", [&] {
    if (moved != nullptr) *moved = 0;
    if (q == nullptr || subscription == nullptr) return null_arg("spool_redrive_subscription", "q or subscription");
    auto r = q->queue->redrive(max, subscription);
    if (!r.ok()) return fail(r.status());
    if (moved != nullptr) *moved = *r;
    return SPOOL_OK;
  });
}

spool_code spool_peek_dead_letters(spool_queue* q, const char* subscription, size_t max,
                                   spool_message** msgs, size_t* count) {
  return guard("spool_peek_dead_letters", [&] {
    if (msgs == nullptr || count == nullptr) return null_arg("spool_peek_dead_letters", "msgs or count");
    *msgs = nullptr;
    *count = 0;
    if (q == nullptr || subscription == nullptr) return null_arg("spool_peek_dead_letters", "q or subscription");
    auto r = dead_letters_marked(*q->queue, subscription, max);
    if (!r.ok()) return fail(r.status());
    if (r->empty()) return SPOOL_OK;
    *count = r->size();
    *msgs = batch_of(std::move(*r), &Batch::copies);
    return SPOOL_OK;
  });
}

spool_code spool_purge_dead_letters(spool_queue* q, const char* subscription, uint64_t* removed) {
  return guard("spool_purge_dead_letters", [&] {
    if (removed != nullptr) *removed = 0;
    if (q == nullptr || subscription == nullptr) return null_arg("spool_purge_dead_letters", "q or subscription");
    auto dlq = q->queue->dead_letters();
    if (!dlq.ok()) return fail(dlq.status());
    uint64_t n = 0;
    if (*subscription == '\0') {
      auto r = (*dlq)->purge();
      if (!r.ok()) return fail(r.status());
      n = *r;
    } else {
      auto marked = dead_letters_marked(*q->queue, subscription, SIZE_MAX);
      if (!marked.ok()) return fail(marked.status());
      for (const spool::Message& m : *marked) {
        spool::Status s = (*dlq)->remove(m.id);
        if (s.code() == spool::Code::kNotFound) continue;  // redriven or removed meanwhile
        if (!s.ok()) return fail(s);
        ++n;
      }
    }
    if (removed != nullptr) *removed = n;
    return SPOOL_OK;
  });
}

spool_code spool_replay(spool_queue* q, uint64_t since_ms, uint64_t until_ms, const char* to,
                        uint64_t* replayed, uint64_t* missing) {
  return guard("spool_replay", [&] {
    if (q == nullptr) return null_arg("spool_replay", "q");
    if (since_ms > static_cast<uint64_t>(INT64_MAX) || until_ms > static_cast<uint64_t>(INT64_MAX)) {
      return fail(SPOOL_INVALID_ARGUMENT, "spool_replay: since_ms or until_ms is out of range");
    }
    spool::ReplayOptions o;
    o.since = ms(since_ms);
    o.until = ms(until_ms);
    if (to != nullptr) o.to = to;
    auto r = q->queue->replay(o);
    if (!r.ok()) return fail(r.status());
    if (replayed != nullptr) *replayed = r->replayed;
    if (missing != nullptr) *missing = r->missing;
    return SPOOL_OK;
  });
}

}  // extern "C"
