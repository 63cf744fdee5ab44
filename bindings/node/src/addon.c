/* The native half of the Node.js binding (index.js is the other): Node-API over libspool's C
 * API (spool.h), in C, so it needs nothing but node's own headers.
 *
 * Every operation takes a final `pool` flag. false: it runs on the calling (event-loop)
 * thread and returns its result or throws; index.js uses that only for calls that cannot
 * block for long (a send or ack under the queue's interval/never policy, a receive without a
 * wait, stats). true: it runs on libuv's thread pool (napi_async_work) and returns a Promise.
 * A receive's wait is given by index.js in slices of at most 100 ms, so a long poll never
 * holds a pool thread for longer than that and close() is seen between slices.
 *
 * spool_last_error() is per thread, so an operation reads it on the thread that made the
 * call (in execute()) and keeps a copy.
 *
 * A handle counts the pool operations under way; close() while some run only marks it, and
 * the last one to complete closes the queue, so spool_close never runs under a call.
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#define NAPI_VERSION 8
#include <node_api.h>
#include <spool/spool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct handle {
  spool_queue* q;
  int inflight; /* pool operations under way (touched on the event-loop thread only) */
  int closing;  /* close() was called: new operations fail, the last one closes q */
} handle;

/* The error factory of this environment (main thread or a worker_thread), set by
 * setErrorFactory: (code, message) => an instance of the Error subclass of that code. Kept
 * as the environment's instance data. */
static void factory_finalize(napi_env env, void* data, void* hint) {
  (void)hint;
  napi_delete_reference(env, (napi_ref)data);
}

#define CHECK(call)                     \
  do {                                  \
    if ((call) != napi_ok) return NULL; \
  } while (0)

static napi_value make_error(napi_env env, int code, const char* msg) {
  napi_value factory, args[2], out = NULL, global;
  void* ref = NULL;
  napi_get_instance_data(env, &ref);
  napi_get_reference_value(env, (napi_ref)ref, &factory);
  napi_get_global(env, &global);
  napi_create_int32(env, code, &args[0]);
  napi_create_string_utf8(env, msg, NAPI_AUTO_LENGTH, &args[1]);
  napi_call_function(env, global, factory, 2, args, &out);
  return out;
}

static napi_value throw_code(napi_env env, int code, const char* msg) {
  napi_throw(env, make_error(env, code, msg));
  return NULL;
}

/* ------------------------------------------------------------------ operations */

enum kind { OP_OPEN, OP_SEND, OP_SEND_PLAIN, OP_RECEIVE, OP_SETTLE, OP_ACK_BATCH };
enum settle { SETTLE_ACK, SETTLE_ACK_SYNC, SETTLE_NACK, SETTLE_EXTEND };

typedef struct op {
  enum kind kind;
  handle* h;
  napi_ref href; /* keeps the handle's JS value alive while the op runs */
  napi_deferred deferred;
  napi_async_work work;
  spool_code rc;
  char* error; /* copy of spool_last_error() on failure */
  /* OP_OPEN */
  char* dir;
  spool_options opts;
  spool_queue* opened;
  /* OP_SEND: n items and their bytes in one block */
  spool_send_item* items;
  size_t n;
  spool_send_options send_opts;
  uint64_t* ids;
  /* OP_SEND_PLAIN: n payloads (ptrs/lens in the items block), one send or one batch */
  const void** ptrs;
  size_t* lens;
  bool single;
  /* OP_RECEIVE */
  size_t max;
  uint64_t visibility_ms, wait_ms;
  spool_message* msgs;
  size_t count;
  /* OP_SETTLE */
  int settle;
  char* receipt;
  uint64_t arg;
  /* OP_ACK_BATCH: n receipts (pointers and bytes in the items block), their codes there too,
   * and the durability in `settle` */
  const char** receipts;
  spool_code* results;
} op;

static void op_free(op* o) {
  if (o->msgs) spool_messages_free(o->msgs);
  free(o->error);
  free(o->dir);
  free(o->items); /* one block with the ids and every byte of the items */
  free(o->receipt);
  free(o);
}

/* ack, durable ack, nack (arg: delay ms) or extend (arg: visibility ms). */
static spool_code settle(spool_queue* q, int kind, const char* receipt, uint64_t arg) {
  switch (kind) {
    case SETTLE_ACK:
      return spool_ack(q, receipt, SPOOL_DURABILITY_QUEUE);
    case SETTLE_ACK_SYNC:
      return spool_ack(q, receipt, SPOOL_DURABILITY_SYNC);
    case SETTLE_NACK:
      return spool_nack(q, receipt, arg);
    default:
      return spool_extend(q, receipt, arg);
  }
}

static void op_run(op* o) {
  switch (o->kind) {
    case OP_OPEN:
      o->rc = spool_open(o->dir, &o->opts, &o->opened);
      break;
    case OP_SEND:
      o->rc =
          spool_send_items(o->h->q, o->items, o->n, sizeof(spool_send_item), &o->send_opts, o->ids);
      break;
    case OP_SEND_PLAIN:
      o->rc = o->single ? spool_send(o->h->q, o->ptrs[0], o->lens[0], &o->send_opts, o->ids)
                        : spool_send_batch(o->h->q, o->ptrs, o->lens, o->n, &o->send_opts, o->ids);
      break;
    case OP_RECEIVE:
      o->rc = spool_receive(o->h->q, o->max, o->visibility_ms, o->wait_ms, &o->msgs, &o->count);
      break;
    case OP_SETTLE:
      o->rc = settle(o->h->q, o->settle, o->receipt, o->arg);
      break;
    case OP_ACK_BATCH:
      o->rc = spool_ack_batch(o->h->q, o->receipts, o->n, o->settle, o->results);
      break;
  }
  if (o->rc != SPOOL_OK && o->rc != SPOOL_EMPTY) o->error = strdup(spool_last_error());
}

static void handle_finalize(napi_env env, void* data, void* hint) {
  (void)env;
  (void)hint;
  handle* h = data;
  if (h->q) spool_close(h->q); /* a Queue dropped without close() */
  free(h);
}

static napi_value set_buffer_prop(napi_env env, napi_value obj, const char* name, const void* p,
                                  size_t len) {
  napi_value v;
  CHECK(napi_create_buffer_copy(env, len, len ? p : "", NULL, &v));
  CHECK(napi_set_named_property(env, obj, name, v));
  return v;
}

/* The codes an ack_batch gives one receipt (in results[]) rather than the whole call: with
 * one of them as its return, the call itself went through and results[] says the rest. */
static bool receipt_code(spool_code rc) {
  return rc == SPOOL_LEASE_LOST || rc == SPOOL_NOT_FOUND || rc == SPOOL_INVALID_ARGUMENT;
}

/* The JS value of a finished op (on the event-loop thread); NULL with an exception pending
 * or, for a failed op, *err set to the error to throw or reject with. */
static napi_value op_result(napi_env env, op* o, napi_value* err) {
  napi_value out;
  *err = NULL;
  if (o->rc != SPOOL_OK && !(o->kind == OP_RECEIVE && o->rc == SPOOL_EMPTY) &&
      !(o->kind == OP_ACK_BATCH && receipt_code(o->rc))) {
    *err = make_error(env, o->rc, o->error ? o->error : spool_code_name(o->rc));
    return NULL;
  }
  switch (o->kind) {
    case OP_OPEN: {
      handle* h = calloc(1, sizeof *h);
      if (!h) {
        spool_close(o->opened);
        *err = make_error(env, SPOOL_IO, "io: out of memory");
        return NULL;
      }
      h->q = o->opened;
      o->opened = NULL;
      CHECK(napi_create_external(env, h, handle_finalize, NULL, &out));
      spool_options stored;
      stored.size = sizeof stored;
      napi_value sync_always;
      int always = spool_get_options(h->q, &stored) == SPOOL_OK && stored.sync == SPOOL_SYNC_ALWAYS;
      CHECK(napi_get_boolean(env, always, &sync_always));
      napi_value pair;
      CHECK(napi_create_array_with_length(env, 2, &pair));
      CHECK(napi_set_element(env, pair, 0, out));
      CHECK(napi_set_element(env, pair, 1, sync_always));
      return pair;
    }
    case OP_SEND_PLAIN: /* a batch's ids are consecutive: its first one stands for all */
      CHECK(napi_create_double(env, (double)o->ids[0], &out));
      return out;
    case OP_SEND:
      CHECK(napi_create_array_with_length(env, o->n, &out));
      for (size_t i = 0; i < o->n; i++) {
        napi_value id;
        CHECK(napi_create_double(env, (double)o->ids[i], &id));
        CHECK(napi_set_element(env, out, (uint32_t)i, id));
      }
      return out;
    case OP_RECEIVE:
      CHECK(napi_create_array_with_length(env, o->count, &out));
      for (size_t i = 0; i < o->count; i++) {
        const spool_message* m = &o->msgs[i];
        napi_value obj, v;
        CHECK(napi_create_object(env, &obj));
        CHECK(napi_create_double(env, (double)m->id, &v));
        CHECK(napi_set_named_property(env, obj, "id", v));
        if (!set_buffer_prop(env, obj, "payload", m->payload, m->payload_len)) return NULL;
        CHECK(napi_create_uint32(env, m->receive_count, &v));
        CHECK(napi_set_named_property(env, obj, "receiveCount", v));
        CHECK(napi_create_double(env, (double)m->enqueued_ns / 1e6, &v));
        CHECK(napi_set_named_property(env, obj, "enqueuedMs", v));
        CHECK(napi_create_string_utf8(env, m->receipt, NAPI_AUTO_LENGTH, &v));
        CHECK(napi_set_named_property(env, obj, "receipt", v));
        int prio = SPOOL_DEFAULT_PRIORITY;
        spool_message_priority(o->msgs, i, &prio);
        CHECK(napi_create_int32(env, prio, &v));
        CHECK(napi_set_named_property(env, obj, "priority", v));
        const void* group = NULL;
        size_t group_len = 0;
        spool_message_group(o->msgs, i, &group, &group_len);
        if (group) {
          if (!set_buffer_prop(env, obj, "group", group, group_len)) return NULL;
        } else {
          CHECK(napi_get_null(env, &v));
          CHECK(napi_set_named_property(env, obj, "group", v));
        }
        const spool_attribute* attrs = NULL;
        size_t nattrs = 0;
        spool_message_attributes(o->msgs, i, &attrs, &nattrs);
        napi_value a;
        CHECK(napi_create_object(env, &a));
        for (size_t k = 0; k < nattrs; k++)
          if (!set_buffer_prop(env, a, attrs[k].key, attrs[k].value, attrs[k].value_len))
            return NULL;
        CHECK(napi_set_named_property(env, obj, "attributes", a));
        CHECK(napi_set_element(env, out, (uint32_t)i, obj));
      }
      return out;
    case OP_SETTLE:
      CHECK(napi_get_undefined(env, &out));
      return out;
    case OP_ACK_BATCH: /* each receipt's code (0: acked); index.js makes the errors */
      CHECK(napi_create_array_with_length(env, o->n, &out));
      for (size_t i = 0; i < o->n; i++) {
        napi_value code;
        CHECK(napi_create_int32(env, o->results[i], &code));
        CHECK(napi_set_element(env, out, (uint32_t)i, code));
      }
      return out;
  }
  return NULL;
}

static void execute(napi_env env, void* data) {
  (void)env;
  op_run(data);
}

static void complete(napi_env env, napi_status status, void* data) {
  op* o = data;
  napi_value err = NULL, result = NULL;
  if (status == napi_ok) result = op_result(env, o, &err);
  if (o->h) {
    if (--o->h->inflight == 0 && o->h->closing && o->h->q) {
      spool_close(o->h->q);
      o->h->q = NULL;
    }
  }
  if (result) {
    napi_resolve_deferred(env, o->deferred, result);
  } else {
    if (!err) {
      bool pending = false;
      napi_is_exception_pending(env, &pending);
      if (pending)
        napi_get_and_clear_last_exception(env, &err);
      else
        err = make_error(env, SPOOL_IO, "io: the operation was cancelled");
    }
    napi_reject_deferred(env, o->deferred, err);
  }
  if (o->href) napi_delete_reference(env, o->href);
  napi_delete_async_work(env, o->work);
  op_free(o);
}

/* Runs o inline (pool false) or queues it (pool true, returning a Promise). Takes o. */
static napi_value dispatch(napi_env env, op* o, napi_value hvalue, bool pool) {
  if (!pool) {
    op_run(o);
    napi_value err, result = op_result(env, o, &err);
    op_free(o);
    if (!result && err) napi_throw(env, err);
    return result;
  }
  napi_value promise, name;
  if (napi_create_promise(env, &o->deferred, &promise) != napi_ok ||
      napi_create_string_utf8(env, "spool", NAPI_AUTO_LENGTH, &name) != napi_ok ||
      napi_create_async_work(env, NULL, name, execute, complete, o, &o->work) != napi_ok) {
    op_free(o);
    return NULL;
  }
  if (hvalue) napi_create_reference(env, hvalue, 1, &o->href);
  if (napi_queue_async_work(env, o->work) != napi_ok) {
    if (o->href) napi_delete_reference(env, o->href);
    napi_delete_async_work(env, o->work);
    op_free(o);
    return NULL;
  }
  if (o->h) o->h->inflight++;
  return promise;
}

/* ------------------------------------------------------------------ argument helpers */

static bool get_handle(napi_env env, napi_value v, handle** out) {
  void* p = NULL;
  if (napi_get_value_external(env, v, &p) != napi_ok || !p) {
    throw_code(env, SPOOL_INVALID_ARGUMENT, "invalid argument: not a queue handle");
    return false;
  }
  handle* h = p;
  if (!h->q || h->closing) {
    throw_code(env, SPOOL_INVALID_ARGUMENT, "invalid argument: the queue is closed");
    return false;
  }
  *out = h;
  return true;
}

static double num_prop(napi_env env, napi_value obj, const char* name, double dflt) {
  napi_value v;
  napi_valuetype t;
  double d;
  if (napi_get_named_property(env, obj, name, &v) != napi_ok ||
      napi_typeof(env, v, &t) != napi_ok || t != napi_number ||
      napi_get_value_double(env, v, &d) != napi_ok)
    return dflt;
  return d;
}

static uint64_t u64(double d) {
  return d > 0 ? (uint64_t)d : 0;
}

static bool get_bool(napi_env env, napi_value v) {
  bool b = false;
  napi_get_value_bool(env, v, &b);
  return b;
}

static bool get_string(napi_env env, napi_value v, char** out) {
  size_t len;
  if (napi_get_value_string_utf8(env, v, NULL, 0, &len) != napi_ok) {
    throw_code(env, SPOOL_INVALID_ARGUMENT, "invalid argument: expected a string");
    return false;
  }
  *out = malloc(len + 1);
  if (!*out) return false;
  napi_get_value_string_utf8(env, v, *out, len + 1, &len);
  return true;
}

/* Buffer property `name` of obj (undefined/null: *p NULL, *len 0, *present false). */
static bool buffer_prop(napi_env env, napi_value obj, const char* name, void** p, size_t* len,
                        bool* present) {
  napi_value v;
  napi_valuetype t;
  *p = NULL;
  *len = 0;
  *present = false;
  if (napi_get_named_property(env, obj, name, &v) != napi_ok) return false;
  napi_typeof(env, v, &t);
  if (t == napi_undefined || t == napi_null) return true;
  if (napi_get_buffer_info(env, v, p, len) != napi_ok) {
    throw_code(env, SPOOL_INVALID_ARGUMENT, "invalid argument: expected a Buffer");
    return false;
  }
  *present = true;
  return true;
}

/* ------------------------------------------------------------------ exported functions */

/* open(dir, opts, create) -> Promise<[handle, syncAlways]> */
static napi_value js_open(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  op* o = calloc(1, sizeof *o);
  if (!o) return NULL;
  o->kind = OP_OPEN;
  if (!get_string(env, argv[0], &o->dir)) {
    op_free(o);
    return NULL;
  }
  spool_options_init_size(&o->opts, sizeof o->opts);
  spool_options* s = &o->opts;
  napi_value opts = argv[1];
  double d;
  if ((d = num_prop(env, opts, "visibility", -1)) > 0) s->visibility_ms = u64(d * 1000);
  if ((d = num_prop(env, opts, "maxReceives", -1)) >= 0) s->max_receives = (uint32_t)d;
  if ((d = num_prop(env, opts, "sync", -1)) >= 0) s->sync = (int)d;
  if ((d = num_prop(env, opts, "syncInterval", -1)) > 0) s->sync_interval_ms = u64(d * 1000);
  if ((d = num_prop(env, opts, "segmentSize", -1)) > 0) s->segment_size = u64(d);
  if ((d = num_prop(env, opts, "maxPayload", -1)) > 0) s->max_payload = u64(d);
  if ((d = num_prop(env, opts, "retentionMaxAge", -1)) > 0) s->retention_max_age_ms = u64(d * 1000);
  if ((d = num_prop(env, opts, "retentionMaxBytes", -1)) > 0) s->retention_max_bytes = u64(d);
  if ((d = num_prop(env, opts, "maxReady", -1)) > 0) s->max_ready = u64(d);
  if ((d = num_prop(env, opts, "maxBytes", -1)) > 0) s->max_bytes = u64(d);
  if ((d = num_prop(env, opts, "dedupWindow", -1)) > 0) s->dedup_window_ms = u64(d * 1000);
  if ((d = num_prop(env, opts, "keepAcked", -1)) > 0) s->keep_acked_ms = u64(d * 1000);
  s->create = get_bool(env, argv[2]);
  return dispatch(env, o, NULL, true);
}

/* close(handle): closes now, or when the pool operations under way have finished. */
static napi_value js_close(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  void* p = NULL;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (napi_get_value_external(env, argv[0], &p) == napi_ok && p) {
    handle* h = p;
    h->closing = 1;
    if (h->inflight == 0 && h->q) {
      spool_close(h->q);
      h->q = NULL;
    }
  }
  return NULL;
}

/* The options shared by send and sendPlain from their arguments delayS, sync, waitForRoomS
 * (args[0..2]) into *so. */
static void send_options(napi_env env, const napi_value* args, spool_send_options* so) {
  double d = 0;
  spool_send_options_init_size(so, sizeof *so);
  napi_get_value_double(env, args[0], &d);
  so->delay_ms = u64(d * 1000);
  so->durability = get_bool(env, args[1]) ? SPOOL_DURABILITY_SYNC : SPOOL_DURABILITY_QUEUE;
  d = 0;
  napi_get_value_double(env, args[2], &d);
  so->wait_for_room_ms = u64(d * 1000);
}

/* sendPlain's priority argument (< 0: the default) into *so. */
static void plain_priority(napi_env env, napi_value v, spool_send_options* so) {
  double prio = -1;
  napi_get_value_double(env, v, &prio);
  if (prio >= 0) {
    so->has_priority = 1;
    so->priority = (int)prio;
  }
}

/* send(handle, items, delayS, sync, waitForRoomS, pool) -> ids (or a Promise of them). items:
 * [{payload: Buffer, attributes: [[key, Buffer], ...] | undefined, priority, group: Buffer,
 * dedupId: Buffer}] as index.js normalised them. Everything is copied into one block: a pool
 * operation outlives the call's arguments. */
static napi_value js_send(napi_env env, napi_callback_info info) {
  size_t argc = 6;
  napi_value argv[6];
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  handle* h;
  if (!get_handle(env, argv[0], &h)) return NULL;
  uint32_t n;
  CHECK(napi_get_array_length(env, argv[1], &n));
  /* First pass: sizes. */
  size_t bytes = 0, nattrs = 0;
  for (uint32_t i = 0; i < n; i++) {
    napi_value it, attrs;
    void* p;
    size_t len;
    bool present;
    CHECK(napi_get_element(env, argv[1], i, &it));
    const char* fields[] = {"payload", "group", "dedupId"};
    for (int f = 0; f < 3; f++) {
      if (!buffer_prop(env, it, fields[f], &p, &len, &present)) return NULL;
      bytes += len;
    }
    CHECK(napi_get_named_property(env, it, "attributes", &attrs));
    bool is_array = false;
    napi_is_array(env, attrs, &is_array);
    if (!is_array) continue;
    uint32_t na;
    CHECK(napi_get_array_length(env, attrs, &na));
    for (uint32_t k = 0; k < na; k++) {
      napi_value pair, key, val;
      size_t klen;
      CHECK(napi_get_element(env, attrs, k, &pair));
      CHECK(napi_get_element(env, pair, 0, &key));
      CHECK(napi_get_element(env, pair, 1, &val));
      if (napi_get_value_string_utf8(env, key, NULL, 0, &klen) != napi_ok ||
          napi_get_buffer_info(env, val, &p, &len) != napi_ok)
        return throw_code(
            env, SPOOL_INVALID_ARGUMENT,
            "invalid argument: an attribute is a string key and a Buffer or string value");
      bytes += klen + 1 + len;
      nattrs++;
    }
  }
  size_t head =
      n * sizeof(spool_send_item) + n * sizeof(uint64_t) + nattrs * sizeof(spool_attribute);
  char* block = calloc(1, head + bytes + 1);
  op* o = calloc(1, sizeof *o);
  if (!block || !o) {
    free(block);
    free(o);
    return throw_code(env, SPOOL_IO, "io: out of memory");
  }
  o->kind = OP_SEND;
  o->h = h;
  o->n = n;
  o->items = (spool_send_item*)block;
  o->ids = (uint64_t*)(block + n * sizeof(spool_send_item));
  spool_attribute* attr_out =
      (spool_attribute*)(block + n * sizeof(spool_send_item) + n * sizeof(uint64_t));
  char* data = block + head;
  /* Second pass: copy. */
  for (uint32_t i = 0; i < n; i++) {
    napi_value it, attrs;
    void* p;
    size_t len;
    bool present;
    spool_send_item* item = &o->items[i];
    napi_get_element(env, argv[1], i, &it);
    buffer_prop(env, it, "payload", &p, &len, &present);
    if (len) memcpy(data, p, len);
    item->payload = data;
    item->len = len;
    data += len;
    buffer_prop(env, it, "group", &p, &len, &present);
    if (present) {
      if (len) memcpy(data, p, len);
      item->group = data;
      item->group_len = len;
      data += len;
    }
    buffer_prop(env, it, "dedupId", &p, &len, &present);
    if (present) {
      if (len) memcpy(data, p, len);
      item->dedup_id = data;
      item->dedup_id_len = len;
      data += len;
    }
    double prio = num_prop(env, it, "priority", -1e9);
    if (prio != -1e9) {
      item->has_priority = 1;
      item->priority = (int)prio;
    }
    napi_get_named_property(env, it, "attributes", &attrs);
    bool is_array = false;
    napi_is_array(env, attrs, &is_array);
    if (!is_array) continue;
    uint32_t na;
    napi_get_array_length(env, attrs, &na);
    item->attributes = attr_out;
    item->attribute_count = na;
    for (uint32_t k = 0; k < na; k++) {
      napi_value pair, key, val;
      size_t klen;
      napi_get_element(env, attrs, k, &pair);
      napi_get_element(env, pair, 0, &key);
      napi_get_element(env, pair, 1, &val);
      napi_get_value_string_utf8(env, key, NULL, 0, &klen);
      napi_get_value_string_utf8(env, key, data, klen + 1, &klen);
      attr_out->key = data;
      data += klen + 1;
      napi_get_buffer_info(env, val, &p, &len);
      if (len) memcpy(data, p, len);
      attr_out->value = data;
      attr_out->value_len = len;
      data += len;
      attr_out++;
    }
  }
  send_options(env, argv + 2, &o->send_opts);
  return dispatch(env, o, argv[0], get_bool(env, argv[5]));
}

/* sendPlain(handle, payloads, delayS, sync, waitForRoomS, priority, pool) -> the id of the
 * first message (payloads a Buffer, or an array of them, whose ids are consecutive), or a
 * Promise of it: messages with no attributes,
 * group or dedup id, the common case, through spool_send / spool_send_batch with no
 * per-item properties to read. priority < 0: the default. Inline, the C call reads the
 * Buffers' own memory (it returns before JS runs again); on the pool, a copy. */
static napi_value js_send_plain(napi_env env, napi_callback_info info) {
  size_t argc = 7;
  napi_value argv[7];
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  handle* h;
  if (!get_handle(env, argv[0], &h)) return NULL;
  bool pool = get_bool(env, argv[6]), single = false;
  uint32_t n = 1;
  CHECK(napi_is_buffer(env, argv[1], &single));
  if (!single) CHECK(napi_get_array_length(env, argv[1], &n));
  if (n == 0) return throw_code(env, SPOOL_INVALID_ARGUMENT, "invalid argument: an empty batch");
  if (single && !pool) { /* the commonest call: no op, no allocation */
    void* p = NULL;
    size_t len = 0;
    uint64_t id = 0;
    spool_send_options so;
    napi_value out;
    CHECK(napi_get_buffer_info(env, argv[1], &p, &len));
    send_options(env, argv + 2, &so);
    plain_priority(env, argv[5], &so);
    spool_code rc = spool_send(h->q, p, len, &so, &id);
    if (rc != SPOOL_OK) return throw_code(env, rc, spool_last_error());
    CHECK(napi_create_double(env, (double)id, &out));
    return out;
  }
  /* Pass 1: pointers and sizes. */
  size_t head = n * (sizeof(void*) + sizeof(size_t) + sizeof(uint64_t));
  char* block = malloc(head);
  op* o = calloc(1, sizeof *o);
  if (!block || !o) {
    free(block);
    free(o);
    return throw_code(env, SPOOL_IO, "io: out of memory");
  }
  o->kind = OP_SEND_PLAIN;
  o->h = h;
  o->n = n;
  o->single = single;
  o->items = (spool_send_item*)block; /* freed with the op */
  o->ptrs = (const void**)block;
  o->lens = (size_t*)(block + n * sizeof(void*));
  o->ids = (uint64_t*)(block + n * (sizeof(void*) + sizeof(size_t)));
  size_t bytes = 0;
  for (uint32_t i = 0; i < n; i++) {
    napi_value b = argv[1];
    void* p = NULL;
    size_t len = 0;
    if ((!single && napi_get_element(env, argv[1], i, &b) != napi_ok) ||
        napi_get_buffer_info(env, b, &p, &len) != napi_ok) {
      op_free(o);
      return throw_code(env, SPOOL_INVALID_ARGUMENT, "invalid argument: a payload is not a Buffer");
    }
    o->ptrs[i] = p;
    o->lens[i] = len;
    bytes += len;
  }
  if (pool) { /* Pass 2: copy, as the Buffers may change or go before the pool runs it. */
    char* copy = malloc(head + bytes + 1);
    if (!copy) {
      op_free(o);
      return throw_code(env, SPOOL_IO, "io: out of memory");
    }
    memcpy(copy, block, head);
    free(block);
    o->items = (spool_send_item*)copy;
    o->ptrs = (const void**)copy;
    o->lens = (size_t*)(copy + n * sizeof(void*));
    o->ids = (uint64_t*)(copy + n * (sizeof(void*) + sizeof(size_t)));
    char* data = copy + head;
    for (uint32_t i = 0; i < n; i++) {
      if (o->lens[i]) memcpy(data, o->ptrs[i], o->lens[i]);
      o->ptrs[i] = data;
      data += o->lens[i];
    }
  }
  send_options(env, argv + 2, &o->send_opts);
  plain_priority(env, argv[5], &o->send_opts);
  return dispatch(env, o, argv[0], pool);
}

/* The prologue of an operation on a queue: its argc arguments into argv (argv[0] the
 * handle) and a zeroed op of `kind` on that handle; NULL with an exception pending. */
static op* new_op(napi_env env, napi_callback_info info, size_t argc, napi_value* argv,
                  enum kind kind) {
  size_t got = argc;
  handle* h;
  if (napi_get_cb_info(env, info, &got, argv, NULL, NULL) != napi_ok) return NULL;
  if (!get_handle(env, argv[0], &h)) return NULL;
  op* o = calloc(1, sizeof *o);
  if (!o) {
    throw_code(env, SPOOL_IO, "io: out of memory");
    return NULL;
  }
  o->kind = kind;
  o->h = h;
  return o;
}

/* receive(handle, max, visibilityS, waitS, pool) -> messages (or a Promise of them); [] when
 * nothing came within the wait. */
static napi_value js_receive(napi_env env, napi_callback_info info) {
  napi_value argv[5];
  op* o = new_op(env, info, 5, argv, OP_RECEIVE);
  if (!o) return NULL;
  double d;
  napi_get_value_double(env, argv[1], &d);
  o->max = d >= 1 ? (size_t)d : 1;
  napi_get_value_double(env, argv[2], &d);
  o->visibility_ms = u64(d * 1000);
  napi_get_value_double(env, argv[3], &d);
  o->wait_ms = u64(d * 1000);
  return dispatch(env, o, argv[0], get_bool(env, argv[4]));
}

/* settle(handle, kind, receipt, argS, pool): ack (0), durable ack (1), nack (2), extend (3). */
static napi_value js_settle(napi_env env, napi_callback_info info) {
  napi_value argv[5];
  int32_t kind = 0;
  double d = 0;
  char receipt[128];
  size_t rlen = 0;
  size_t argc = 5;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  /* Inline with a receipt that fits (they are ~40 bytes): no op, no allocation. */
  if (!get_bool(env, argv[4]) &&
      napi_get_value_string_utf8(env, argv[2], receipt, sizeof receipt, &rlen) == napi_ok &&
      rlen < sizeof receipt - 1) {
    handle* h;
    if (!get_handle(env, argv[0], &h)) return NULL;
    napi_get_value_int32(env, argv[1], &kind);
    napi_get_value_double(env, argv[3], &d);
    spool_code rc = settle(h->q, kind, receipt, u64(d * 1000));
    if (rc != SPOOL_OK) return throw_code(env, rc, spool_last_error());
    return NULL;
  }
  op* o = new_op(env, info, 5, argv, OP_SETTLE);
  if (!o) return NULL;
  napi_get_value_int32(env, argv[1], &kind);
  o->settle = kind;
  if (!get_string(env, argv[2], &o->receipt)) {
    op_free(o);
    return NULL;
  }
  napi_get_value_double(env, argv[3], &d);
  o->arg = u64(d * 1000);
  return dispatch(env, o, argv[0], get_bool(env, argv[4]));
}

/* ackBatch(handle, receipts, sync, pool) -> each receipt's code, 0 when acked (or a Promise
 * of them); throws or rejects only when the call failed as a whole. receipts: strings
 * without NUL (index.js checks), copied into one block with their pointers and codes, as a
 * pool operation outlives the call's arguments. */
static napi_value js_ack_batch(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  op* o = new_op(env, info, 4, argv, OP_ACK_BATCH);
  if (!o) return NULL;
  uint32_t n = 0;
  if (napi_get_array_length(env, argv[1], &n) != napi_ok) {
    op_free(o);
    return throw_code(env, SPOOL_INVALID_ARGUMENT, "invalid argument: receipts is not an array");
  }
  /* Pass 1: sizes. */
  size_t bytes = 0;
  for (uint32_t i = 0; i < n; i++) {
    napi_value r;
    size_t len;
    if (napi_get_element(env, argv[1], i, &r) != napi_ok ||
        napi_get_value_string_utf8(env, r, NULL, 0, &len) != napi_ok) {
      op_free(o);
      return throw_code(env, SPOOL_INVALID_ARGUMENT, "invalid argument: a receipt is not a string");
    }
    bytes += len + 1;
  }
  size_t head = n * (sizeof(char*) + sizeof(spool_code));
  char* block = malloc(head + bytes + 1);
  if (!block) {
    op_free(o);
    return throw_code(env, SPOOL_IO, "io: out of memory");
  }
  o->items = (spool_send_item*)block; /* freed with the op */
  o->receipts = (const char**)block;
  o->results = (spool_code*)(block + n * sizeof(char*));
  o->n = n;
  /* Pass 2: copy, within the sizes of pass 1 (`left` counts the room, NULs included). */
  char* data = block + head;
  size_t left = bytes + 1;
  for (uint32_t i = 0; i < n; i++) {
    napi_value r;
    size_t len = 0;
    o->receipts[i] = "";
    if (left < 2 || napi_get_element(env, argv[1], i, &r) != napi_ok ||
        napi_get_value_string_utf8(env, r, data, left, &len) != napi_ok)
      continue;
    o->receipts[i] = data;
    data += len + 1;
    left -= len + 1;
  }
  o->settle = get_bool(env, argv[2]) ? SPOOL_DURABILITY_SYNC : SPOOL_DURABILITY_QUEUE;
  return dispatch(env, o, argv[0], get_bool(env, argv[3]));
}

/* stats(handle) -> {ready, inFlight, ...} (one read of the shared index: never blocks long). */
static napi_value js_stats(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], out, v;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  handle* h;
  if (!get_handle(env, argv[0], &h)) return NULL;
  spool_stats s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  spool_code rc = spool_get_stats(h->q, &s);
  if (rc != SPOOL_OK) return throw_code(env, rc, spool_last_error());
  CHECK(napi_create_object(env, &out));
#define FIELD(js, value)                               \
  CHECK(napi_create_double(env, (double)(value), &v)); \
  CHECK(napi_set_named_property(env, out, js, v))
  FIELD("ready", s.ready);
  FIELD("inFlight", s.in_flight);
  FIELD("delayed", s.delayed);
  FIELD("dead", s.dead);
  FIELD("blocked", s.blocked);
  FIELD("oldestReadyAge", s.oldest_ready_age_s);
  FIELD("sentTotal", s.sent_total);
  FIELD("ackedTotal", s.acked_total);
  FIELD("deadLetteredTotal", s.dead_lettered_total);
  FIELD("expiredTotal", s.expired_total);
  FIELD("nackedTotal", s.nacked_total);
  FIELD("bytes", s.bytes);
  FIELD("bytesOnDisk", s.bytes_on_disk);
  FIELD("segments", s.segments);
  FIELD("nextId", s.next_id);
  FIELD("dedupIds", s.dedup_ids);
#undef FIELD
  return out;
}

/* bindLeases(handle): leases this handle takes from now on return to ready at once when the
 * process dies (spool_bind_leases). */
static napi_value js_bind_leases(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  handle* h;
  if (!get_handle(env, argv[0], &h)) return NULL;
  spool_code rc = spool_bind_leases(h->q);
  if (rc != SPOOL_OK) return throw_code(env, rc, spool_last_error());
  return NULL;
}

static napi_value js_set_error_factory(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  napi_ref ref;
  CHECK(napi_create_reference(env, argv[0], 1, &ref));
  CHECK(napi_set_instance_data(env, ref, factory_finalize, NULL));
  return NULL;
}

static napi_value init(napi_env env, napi_value exports) {
  napi_property_descriptor props[] = {
      {"setErrorFactory", NULL, js_set_error_factory, NULL, NULL, NULL, napi_default, NULL},
      {"open", NULL, js_open, NULL, NULL, NULL, napi_default, NULL},
      {"close", NULL, js_close, NULL, NULL, NULL, napi_default, NULL},
      {"sendPlain", NULL, js_send_plain, NULL, NULL, NULL, napi_default, NULL},
      {"send", NULL, js_send, NULL, NULL, NULL, napi_default, NULL},
      {"receive", NULL, js_receive, NULL, NULL, NULL, napi_default, NULL},
      {"settle", NULL, js_settle, NULL, NULL, NULL, napi_default, NULL},
      {"ackBatch", NULL, js_ack_batch, NULL, NULL, NULL, napi_default, NULL},
      {"bindLeases", NULL, js_bind_leases, NULL, NULL, NULL, napi_default, NULL},
      {"stats", NULL, js_stats, NULL, NULL, NULL, napi_default, NULL},
  };
  CHECK(napi_define_properties(env, exports, sizeof props / sizeof props[0], props));
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
