/* The C API (include/spool/spool.h), compiled as C99 and linked against libspool.so.0, with
 * real processes: a producer and two competing consumers forked from this test, each opening
 * the queue itself, every message acked exactly once; a consumer killed with SIGKILL while it
 * holds a bound lease; stale receipts; the error texts and their thread-locality; the size
 * field of the option structs, and callers built against 0.1.0's shorter structs; dead
 * letters and redrive; attributes, dedup ids, priorities and ordered groups (issue 26) with
 * their bounds, and the flag that tells a duplicate send; subscriptions (issue 46), with
 * max_receives of their own and dead letters redriven, peeked and purged by subscription.
 *
 *   capi_test            (exit 0: all passed; 1: a check failed, named on stderr)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spool/spool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int g_checks = 0;

#define CHECK(cond, ...)                                                         \
  do {                                                                           \
    ++g_checks;                                                                  \
    if (!(cond)) {                                                               \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);            \
      fprintf(stderr, __VA_ARGS__);                                              \
      fprintf(stderr, " (last error: \"%s\")\n", spool_last_error());            \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

#define CHECK_CODE(call, want)                                                   \
  do {                                                                           \
    spool_code got_ = (call);                                                    \
    CHECK(got_ == (want), "%s returned %s, want %s", #call, spool_code_name(got_), \
          spool_code_name(want));                                                \
  } while (0)

static char g_root[256];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void path_in_root(char* out, size_t n, const char* name) {
  snprintf(out, n, "%s/%s", g_root, name);
}

static int starts_with(const char* s, const char* prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ------------------------------------------------------------ errors */

static void* other_thread_fails(void* arg) {
  spool_queue* q = NULL;
  (void)arg;
  CHECK_CODE(spool_open(NULL, NULL, &q), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "dir is NULL") != NULL, "other thread's text");
  return NULL;
}

static void test_errors(void) {
  char file[300], dir[300];
  spool_queue* q = (spool_queue*)1;
  path_in_root(file, sizeof file, "plain-file");
  FILE* f = fopen(file, "w");
  CHECK(f != NULL, "create %s", file);
  fputs("not a queue\n", f);
  fclose(f);

  CHECK(strcmp(spool_last_error(), "") == 0, "no error yet");
  CHECK_CODE(spool_open(file, NULL, &q), SPOOL_NOT_A_QUEUE);
  CHECK(q == NULL, "out is NULL after a failed open");
  CHECK(starts_with(spool_last_error(), "not a queue: "), "text names the code");
  CHECK(strstr(spool_last_error(), "plain-file") != NULL, "text names the path");

  /* The text is per thread: another thread's failure does not overwrite this one's. */
  pthread_t t;
  CHECK(pthread_create(&t, NULL, other_thread_fails, NULL) == 0, "pthread_create");
  pthread_join(t, NULL);
  CHECK(starts_with(spool_last_error(), "not a queue: "), "still this thread's text");

  /* A directory that does not hold a queue, with create = 0. */
  spool_options o;
  spool_options_init(&o);
  o.create = 0;
  path_in_root(dir, sizeof dir, "absent");
  CHECK_CODE(spool_open(dir, &o, &q), SPOOL_NOT_A_QUEUE);

  /* An option struct whose size is not set is refused, not read. */
  spool_options unset;
  memset(&unset, 0, sizeof unset);
  CHECK_CODE(spool_open(dir, &unset, &q), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "spool_options_init") != NULL, "says what to do");
  spool_options_init(&o);
  o.sync = 7;
  CHECK_CODE(spool_open(dir, &o, &q), SPOOL_INVALID_ARGUMENT);

  path_in_root(dir, sizeof dir, "errors");
  CHECK_CODE(spool_open(dir, NULL, &q), SPOOL_OK);
  CHECK(strcmp(spool_dir(q), dir) == 0, "spool_dir");
  CHECK_CODE(spool_ack(q, "garbage", SPOOL_DURABILITY_QUEUE), SPOOL_INVALID_ARGUMENT);
  CHECK(starts_with(spool_last_error(), "invalid argument: "), "ack text");
  CHECK_CODE(spool_ack(q, NULL, SPOOL_DURABILITY_QUEUE), SPOOL_INVALID_ARGUMENT);
  CHECK_CODE(spool_send(q, NULL, 5, NULL, NULL), SPOOL_INVALID_ARGUMENT);

  /* Too large: the default max_payload is 1 MiB. */
  size_t big = (1u << 20) + 1;
  char* buf = calloc(1, big);
  CHECK(buf != NULL, "calloc");
  CHECK_CODE(spool_send(q, buf, big, NULL, NULL), SPOOL_TOO_LARGE);
  CHECK(starts_with(spool_last_error(), "too large: "), "too large text");
  free(buf);

  spool_message* m = (spool_message*)1;
  size_t n = 9;
  CHECK_CODE(spool_receive(q, 1, 0, 0, &m, &n), SPOOL_EMPTY);
  CHECK(m == NULL && n == 0, "empty receive leaves no batch");
  CHECK(strcmp(spool_code_name(SPOOL_LEASE_LOST), "lease lost") == 0, "code name");
  CHECK(strcmp(spool_code_name(99), "unknown") == 0, "unknown code name");

  spool_stats st;
  memset(&st, 0, sizeof st);
  CHECK_CODE(spool_get_stats(q, &st), SPOOL_INVALID_ARGUMENT); /* size 0 */
  spool_close(q);
  spool_close(NULL);
}

/* ------------------------------------------------------------ option struct sizes */

/* spool_get_stats as a caller whose spool_stats is `size` bytes: the rest reads 0xab... if
 * the library left it alone. */
static spool_stats stats_sized(spool_queue* q, size_t size) {
  spool_stats st;
  memset(&st, 0xab, sizeof st);
  st.size = size;
  CHECK_CODE(spool_get_stats(q, &st), SPOOL_OK);
  CHECK(st.size == size, "size kept");
  return st;
}

static void test_option_sizes(void) {
  char dir[300];
  path_in_root(dir, sizeof dir, "sizes");
  /* A caller built against an older, shorter spool_options (one that ends after
   * visibility_ms): the fields past its size are not read, whatever the memory holds. */
  spool_options o;
  memset(&o, 0xff, sizeof o);
  o.size = offsetof(spool_options, visibility_ms) + sizeof o.visibility_ms;
  o.visibility_ms = 1234;
  spool_queue* q = NULL;
  CHECK_CODE(spool_open(dir, &o, &q), SPOOL_OK);

  spool_options got;
  got.size = sizeof got;
  CHECK_CODE(spool_get_options(q, &got), SPOOL_OK);
  CHECK(got.visibility_ms == 1234, "visibility %llu", (unsigned long long)got.visibility_ms);
  CHECK(got.max_receives == 10, "max_receives default, got %u", got.max_receives);
  CHECK(got.sync == SPOOL_SYNC_INTERVAL, "sync default");

  /* A short spool_stats: only the fields that fit are written. */
  spool_stats s = stats_sized(q, offsetof(spool_stats, in_flight));
  CHECK(s.ready == 0, "ready written");
  CHECK(s.in_flight == 0xababababababababull, "in_flight left alone");
  spool_close(q);
}

/* ------------------------------------------------------------ producer, two consumers */

enum { kMessages = 3000, kConsumers = 2 };

static void producer(const char* dir) {
  spool_queue* q = NULL;
  CHECK_CODE(spool_open(dir, NULL, &q), SPOOL_OK);
  char bufs[50][32];
  const void* ptrs[50];
  size_t lens[50];
  uint64_t ids[50];
  int i = 0;
  while (i < kMessages) {
    if (i % 500 == 0) { /* now and then a single send with per-call durability */
      spool_send_options so;
      spool_send_options_init(&so);
      so.durability = SPOOL_DURABILITY_SYNC;
      int len = snprintf(bufs[0], sizeof bufs[0], "m-%d", i);
      uint64_t id = 0;
      CHECK_CODE(spool_send(q, bufs[0], (size_t)len, &so, &id), SPOOL_OK);
      CHECK(spool_durable_id(q) >= id, "a synced send is below the watermark");
      ++i;
      continue;
    }
    size_t n = 0;
    for (; n < 50 && i < kMessages && i % 500 != 0; ++n, ++i) {
      lens[n] = (size_t)snprintf(bufs[n], sizeof bufs[n], "m-%d", i);
      ptrs[n] = bufs[n];
    }
    CHECK_CODE(spool_send_batch(q, ptrs, lens, n, NULL, ids), SPOOL_OK);
    for (size_t k = 1; k < n; ++k) CHECK(ids[k] == ids[k - 1] + 1, "consecutive ids");
  }
  spool_close(q);
}

/* Receives until every message is acked, writing "index" of each acked payload to fd (one
 * write of 4 bytes per message: atomic on a pipe). */
static void consumer(const char* dir, int fd) {
  spool_queue* q = NULL;
  CHECK_CODE(spool_open(dir, NULL, &q), SPOOL_OK);
  double give_up = now_s() + 60;
  for (;;) {
    CHECK(now_s() < give_up, "consumer timed out");
    spool_message* msgs = NULL;
    size_t n = 0;
    spool_code c = spool_receive(q, 8, 10000, 200, &msgs, &n);
    if (c == SPOOL_EMPTY) {
      spool_stats st = {.size = sizeof st};
      CHECK_CODE(spool_get_stats(q, &st), SPOOL_OK);
      if (st.acked_total >= kMessages && st.ready == 0 && st.in_flight == 0) break;
      continue;
    }
    CHECK_CODE(c, SPOOL_OK);
    CHECK(n >= 1 && n <= 8, "batch of %zu", n);
    for (size_t k = 0; k < n; ++k) {
      char text[32];
      CHECK(msgs[k].payload_len > 2 && msgs[k].payload_len < sizeof text, "payload length");
      memcpy(text, msgs[k].payload, msgs[k].payload_len);
      text[msgs[k].payload_len] = 0;
      CHECK(starts_with(text, "m-"), "payload %s", text);
      CHECK(msgs[k].receive_count == 1, "first delivery");
      CHECK(msgs[k].receipt != NULL && msgs[k].receipt[0] != 0, "receipt");
      CHECK(msgs[k].enqueued_ns > 1600000000LL * 1000000000LL, "enqueue time");
      usleep(50); /* a little work, so that neither consumer takes everything */
      CHECK_CODE(spool_ack(q, msgs[k].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
      int32_t index = atoi(text + 2);
      CHECK(write(fd, &index, sizeof index) == (ssize_t)sizeof index, "write");
    }
    spool_messages_free(msgs);
  }
  spool_close(q);
}

static void test_competing_processes(void) {
  char dir[300];
  path_in_root(dir, sizeof dir, "competing");
  int fds[kConsumers][2];
  pid_t pids[kConsumers + 1];
  for (int c = 0; c < kConsumers; ++c) {
    CHECK(pipe(fds[c]) == 0, "pipe");
    pids[c] = fork();
    CHECK(pids[c] >= 0, "fork");
    if (pids[c] == 0) {
      close(fds[c][0]);
      consumer(dir, fds[c][1]);
      _exit(0);
    }
    close(fds[c][1]);
  }
  pids[kConsumers] = fork();
  CHECK(pids[kConsumers] >= 0, "fork");
  if (pids[kConsumers] == 0) {
    producer(dir);
    _exit(0);
  }

  static int seen[kMessages];
  int per_consumer[kConsumers] = {0};
  for (int c = 0; c < kConsumers; ++c) {
    int32_t index;
    ssize_t r;
    while ((r = read(fds[c][0], &index, sizeof index)) == (ssize_t)sizeof index) {
      CHECK(index >= 0 && index < kMessages, "index %d", index);
      ++seen[index];
      ++per_consumer[c];
    }
    CHECK(r == 0, "pipe read: %zd", r);
    close(fds[c][0]);
  }
  for (int p = 0; p <= kConsumers; ++p) {
    int status = 0;
    CHECK(waitpid(pids[p], &status, 0) == pids[p], "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d exited with status %d", p,
          status);
  }
  for (int i = 0; i < kMessages; ++i) CHECK(seen[i] == 1, "message %d acked %d times", i, seen[i]);
  for (int c = 0; c < kConsumers; ++c)
    CHECK(per_consumer[c] > 0, "consumer %d acked nothing", c);

  spool_queue* q = NULL;
  CHECK_CODE(spool_open(dir, NULL, &q), SPOOL_OK);
  spool_stats st = {.size = sizeof st};
  CHECK_CODE(spool_get_stats(q, &st), SPOOL_OK);
  CHECK(st.sent_total == kMessages, "sent_total %llu", (unsigned long long)st.sent_total);
  CHECK(st.acked_total == kMessages, "acked_total %llu", (unsigned long long)st.acked_total);
  CHECK(st.ready == 0 && st.in_flight == 0 && st.delayed == 0, "nothing left");
  CHECK(st.next_id == kMessages + 1 || st.next_id == kMessages, "next_id %llu",
        (unsigned long long)st.next_id);
  CHECK_CODE(spool_sync(q), SPOOL_OK);
  CHECK(spool_durable_id(q) >= kMessages, "durable_id %llu after sync",
        (unsigned long long)spool_durable_id(q));
  spool_close(q);
  printf("ok: %d messages, acked once each (consumer shares %d / %d)\n", kMessages,
         per_consumer[0], per_consumer[1]);
}

/* ------------------------------------------------------------ a killed consumer */

static void test_killed_consumer(void) {
  char dir[300];
  path_in_root(dir, sizeof dir, "killed");
  spool_queue* q = NULL;
  CHECK_CODE(spool_open(dir, NULL, &q), SPOOL_OK);
  uint64_t id = 0;
  CHECK_CODE(spool_send(q, "job", 3, NULL, &id), SPOOL_OK);
  spool_close(q); /* not used across fork */

  int ready[2];
  CHECK(pipe(ready) == 0, "pipe");
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    spool_queue* cq = NULL;
    CHECK_CODE(spool_open(dir, NULL, &cq), SPOOL_OK);
    CHECK_CODE(spool_bind_leases(cq), SPOOL_OK);
    spool_message* m = NULL;
    size_t n = 0;
    CHECK_CODE(spool_receive(cq, 1, 60000, 5000, &m, &n), SPOOL_OK); /* a 60 s lease */
    char b = 1;
    CHECK(write(ready[1], &b, 1) == 1, "write");
    pause(); /* until SIGKILL */
    _exit(0);
  }
  close(ready[1]);
  char b;
  CHECK(read(ready[0], &b, 1) == 1, "the child took the lease");
  close(ready[0]);

  CHECK_CODE(spool_open(dir, NULL, &q), SPOOL_OK);
  spool_message* m = NULL;
  size_t n = 0;
  CHECK_CODE(spool_receive(q, 1, 0, 0, &m, &n), SPOOL_EMPTY); /* leased by the child */
  CHECK(kill(pid, SIGKILL) == 0, "kill");
  int status;
  CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
  double start = now_s();
  /* The bound lease returns at once, not after its 60 s. */
  CHECK_CODE(spool_receive(q, 1, 0, 10000, &m, &n), SPOOL_OK);
  double took = now_s() - start;
  CHECK(m[0].id == id && m[0].receive_count == 2, "the killed consumer's message, count %u",
        m[0].receive_count);
  CHECK(took < 5, "came back after %.2f s", took);
  CHECK_CODE(spool_ack(q, m[0].receipt, SPOOL_DURABILITY_SYNC), SPOOL_OK);
  spool_messages_free(m);
  spool_close(q);
  printf("ok: a SIGKILLed consumer's message came back in %.3f s\n", took);
}

/* ------------------------------------------------------------ leases, fencing, dead letters */

static void test_leases(void) {
  char dir[300];
  path_in_root(dir, sizeof dir, "leases");
  spool_options o;
  spool_options_init(&o);
  o.max_receives = 3;
  spool_queue* q = NULL;
  CHECK_CODE(spool_open(dir, &o, &q), SPOOL_OK);
  uint64_t id = 0;
  CHECK_CODE(spool_send(q, "a\0b", 3, NULL, &id), SPOOL_OK); /* binary payloads */

  spool_message* first = NULL;
  size_t n = 0;
  CHECK_CODE(spool_receive(q, 4, 100, 0, &first, &n), SPOOL_OK);
  CHECK(n == 1 && first[0].payload_len == 3 && memcmp(first[0].payload, "a\0b", 3) == 0,
        "payload bytes");
  CHECK_CODE(spool_extend(q, first[0].receipt, 100), SPOOL_OK);
  usleep(250 * 1000); /* the lease ends */
  spool_message* second = NULL;
  CHECK_CODE(spool_receive(q, 1, 5000, 0, &second, &n), SPOOL_OK);
  CHECK(second[0].id == id && second[0].receive_count == 2, "received again");
  /* The first receipt is stale: every settling call fails with lease lost and changes
   * nothing; its batch (payload, receipt) is still readable until freed. */
  CHECK_CODE(spool_ack(q, first[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_LEASE_LOST);
  CHECK(starts_with(spool_last_error(), "lease lost: "), "lease lost text");
  /* Issue 43: the code's name once, not "lease lost: lease lost: ...". */
  CHECK(strstr(spool_last_error() + strlen("lease lost: "), "lease lost:") == NULL,
        "the code is named once: %s", spool_last_error());
  CHECK_CODE(spool_nack(q, first[0].receipt, 0), SPOOL_LEASE_LOST);
  CHECK_CODE(spool_extend(q, first[0].receipt, 1000), SPOOL_LEASE_LOST);
  CHECK(memcmp(first[0].payload, "a\0b", 3) == 0, "payload still valid after the lease");
  spool_messages_free(first);
  spool_stats st = {.size = sizeof st};
  CHECK_CODE(spool_get_stats(q, &st), SPOOL_OK);
  CHECK(st.in_flight == 1 && st.acked_total == 0, "the stale ack changed nothing");

  /* A keeper renews the live lease. */
  spool_keeper* k = NULL;
  CHECK_CODE(spool_keeper_start(q, second[0].receipt, 20, 200, 60000, &k), SPOOL_OK);
  /* Two renewals are due 20 and 40 ms in; waited for up to 10 s, not slept for: a loaded
   * machine may run the keeper's thread late (a keeper that never renews fails here). */
  for (double give_up = now_s() + 10; spool_keeper_renewals(k) < 2 && now_s() < give_up;) {
    usleep(10 * 1000);
  }
  CHECK_CODE(spool_keeper_status(k), SPOOL_OK);
  CHECK(spool_keeper_renewals(k) >= 2, "renewals %llu", (unsigned long long)spool_keeper_renewals(k));
  spool_keeper_free(k);

  /* nack with a delay: delayed, then receivable. */
  CHECK_CODE(spool_nack(q, second[0].receipt, 200), SPOOL_OK);
  spool_messages_free(second);
  CHECK_CODE(spool_get_stats(q, &st), SPOOL_OK);
  CHECK(st.delayed == 1 && st.nacked_total == 1, "delayed %llu", (unsigned long long)st.delayed);
  spool_message* m = NULL;
  CHECK_CODE(spool_receive(q, 1, 0, 0, &m, &n), SPOOL_EMPTY);
  spool_message* peeked = NULL;
  CHECK_CODE(spool_peek(q, 10, &peeked, &n), SPOOL_OK);
  CHECK(n == 1 && peeked[0].id == id && peeked[0].receipt[0] == 0, "peek");
  spool_messages_free(peeked);
  spool_message_info* infos = NULL;
  CHECK_CODE(spool_list(q, 10, 0, &infos, &n), SPOOL_OK);
  CHECK(n == 1 && infos[0].id == id && infos[0].size == 3 && !infos[0].ready, "list");
  spool_free(infos);

  /* Third delivery, then the fourth receive dead-letters it (max_receives 3). */
  CHECK_CODE(spool_receive(q, 1, 50, 2000, &m, &n), SPOOL_OK);
  CHECK(m[0].receive_count == 3, "third delivery");
  spool_messages_free(m);
  usleep(100 * 1000);
  CHECK_CODE(spool_receive(q, 1, 0, 0, &m, &n), SPOOL_EMPTY);
  spool_queue* dlq = NULL;
  CHECK_CODE(spool_dead_letters(q, &dlq), SPOOL_OK);
  spool_stats dst = {.size = sizeof dst};
  CHECK_CODE(spool_get_stats(dlq, &dst), SPOOL_OK);
  CHECK(dst.ready == 1, "one dead letter, %llu", (unsigned long long)dst.ready);
  spool_close(dlq); /* ignored: q owns it */
  uint64_t moved = 0;
  CHECK_CODE(spool_redrive(q, 10, &moved), SPOOL_OK);
  CHECK(moved == 1, "redrove %llu", (unsigned long long)moved);
  CHECK_CODE(spool_receive(q, 1, 0, 0, &m, &n), SPOOL_OK);
  CHECK(m[0].payload_len == 3 && m[0].receive_count == 1, "redriven as a new message");
  CHECK_CODE(spool_ack(q, m[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
  CHECK_CODE(spool_ack(q, m[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_NOT_FOUND);
  CHECK(starts_with(spool_last_error(), "not found: "), "not found text");
  spool_messages_free(m);

  uint64_t removed = 0;
  CHECK_CODE(spool_send(q, "x", 1, NULL, NULL), SPOOL_OK);
  CHECK_CODE(spool_purge(q, &removed), SPOOL_OK);
  CHECK(removed == 1, "purged %llu", (unsigned long long)removed);
  size_t problems = 99;
  char* report = NULL;
  CHECK_CODE(spool_verify(q, 0, &problems, &report), SPOOL_OK);
  CHECK(problems == 0, "verify: %s", report);
  spool_free(report);
  spool_compact_result cr;
  CHECK_CODE(spool_compact(q, &cr), SPOOL_OK);
  spool_close(q);
  printf("ok: fencing, keeper, nack delay, peek, list, dead letters, redrive, purge, verify\n");
}

/* ------------------------------------------------------------ delayed sends */

/* spool_ack_batch: each receipt's own code, SPOOL_OK only when all were acked, the first
 * failure's code otherwise; what was acked is gone. */
static void test_ack_batch(void) {
  char dir[300];
  path_in_root(dir, sizeof dir, "ack_batch");
  spool_queue* q = NULL;
  CHECK_CODE(spool_open(dir, NULL, &q), SPOOL_OK);
  for (int i = 0; i < 5; ++i) CHECK_CODE(spool_send(q, "m", 1, NULL, NULL), SPOOL_OK);
  spool_message* m = NULL;
  size_t n = 0;
  CHECK_CODE(spool_receive(q, 4, 60000, 0, &m, &n), SPOOL_OK);
  CHECK(n == 4, "4 received, %zu", n);
  const char* all[] = {m[0].receipt, m[1].receipt};
  spool_code codes[5] = {SPOOL_IO, SPOOL_IO, SPOOL_IO, SPOOL_IO, SPOOL_IO};
  CHECK_CODE(spool_ack_batch(q, all, 2, SPOOL_DURABILITY_SYNC, codes), SPOOL_OK);
  CHECK(codes[0] == SPOOL_OK && codes[1] == SPOOL_OK, "both acked: %d %d", codes[0], codes[1]);
  const char* mixed[] = {m[2].receipt, "garbage", m[0].receipt, m[3].receipt, m[3].receipt};
  CHECK_CODE(spool_ack_batch(q, mixed, 5, SPOOL_DURABILITY_QUEUE, codes), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "garbage") != NULL, "the first failure named: %s", spool_last_error());
  CHECK(codes[0] == SPOOL_OK && codes[1] == SPOOL_INVALID_ARGUMENT && codes[2] == SPOOL_NOT_FOUND &&
            codes[3] == SPOOL_OK && codes[4] == SPOOL_NOT_FOUND,
        "codes %d %d %d %d %d", codes[0], codes[1], codes[2], codes[3], codes[4]);
  CHECK_CODE(spool_ack_batch(q, NULL, 0, SPOOL_DURABILITY_QUEUE, NULL), SPOOL_OK);
  const char* with_null[] = {NULL};
  CHECK_CODE(spool_ack_batch(q, with_null, 1, SPOOL_DURABILITY_QUEUE, NULL), SPOOL_INVALID_ARGUMENT);
  spool_messages_free(m);
  spool_stats st = {.size = sizeof st};
  CHECK_CODE(spool_get_stats(q, &st), SPOOL_OK);
  CHECK(st.acked_total == 4 && st.ready == 1 && st.in_flight == 0, "acked %llu ready %llu in flight %llu",
        (unsigned long long)st.acked_total, (unsigned long long)st.ready, (unsigned long long)st.in_flight);
  spool_close(q);
}

static void test_delayed_send(void) {
  char dir[300];
  path_in_root(dir, sizeof dir, "delayed");
  spool_queue* q = NULL;
  CHECK_CODE(spool_open(dir, NULL, &q), SPOOL_OK);
  spool_send_options so;
  spool_send_options_init(&so);
  so.delay_ms = 300;
  const void* ptrs[2] = {"one", "two"};
  size_t lens[2] = {3, 3};
  /* Timed from before the send, so that a pause between the calls (a loaded machine) cannot
   * eat into the 300 ms: the messages must not come before it has passed. */
  double start = now_s();
  CHECK_CODE(spool_send_batch(q, ptrs, lens, 2, &so, NULL), SPOOL_OK);
  spool_message* m = NULL;
  size_t n = 0;
  CHECK_CODE(spool_receive(q, 2, 0, 0, &m, &n), SPOOL_EMPTY);
  CHECK_CODE(spool_receive(q, 2, 0, 3000, &m, &n), SPOOL_OK);
  double took = now_s() - start;
  CHECK(took >= 0.29, "delay honoured (%.3f s)", took);
  CHECK(n >= 1, "batch");
  spool_messages_free(m);
  /* spool_remove: the delayed "two" (or the leased "one"), by id, without a receipt. */
  uint64_t two = 0;
  CHECK_CODE(spool_send(q, "three", 5, &so, &two), SPOOL_OK);
  CHECK_CODE(spool_remove(q, two, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
  CHECK_CODE(spool_remove(q, two, SPOOL_DURABILITY_QUEUE), SPOOL_NOT_FOUND);
  CHECK(strstr(spool_last_error(), "is not in the queue") != NULL, "remove names it: %s", spool_last_error());
  CHECK_CODE(spool_remove(NULL, two, SPOOL_DURABILITY_QUEUE), SPOOL_INVALID_ARGUMENT);
  spool_stats rs = {.size = sizeof rs};
  CHECK_CODE(spool_get_stats(q, &rs), SPOOL_OK);
  CHECK(rs.acked_total == 1 && rs.delayed + rs.ready + rs.in_flight == 2, "removed: acked %llu",
        (unsigned long long)rs.acked_total);
  spool_close(q);
  spool_stats st = {.size = sizeof st, .ready = 101};
  CHECK(spool_workers_needed(&st, 10, 1) == 11, "workers_needed %llu",
        (unsigned long long)spool_workers_needed(&st, 10, 1));
}

/* ------------------------------------------------------------ attributes (issue 26) */

/* Opens (creates) the queue `name` in the test's root; o may be NULL. */
static spool_queue* open_in_root(const char* name, const spool_options* o) {
  char dir[300];
  path_in_root(dir, sizeof dir, name);
  spool_queue* q = NULL;
  CHECK_CODE(spool_open(dir, o, &q), SPOOL_OK);
  return q;
}

static uint64_t sent_total(spool_queue* q) {
  spool_stats st = {.size = sizeof st};
  CHECK_CODE(spool_get_stats(q, &st), SPOOL_OK);
  return st.sent_total;
}

/* Sends "x" with the n attributes `a`; returns the code. */
static spool_code send_with(spool_queue* q, const spool_attribute* a, size_t n) {
  spool_send_options so;
  spool_send_options_init(&so);
  so.attributes = a;
  so.attribute_count = n;
  return spool_send(q, "x", 1, &so, NULL);
}

/* issue 48: lengths were read before they were checked: a value_len or dedup_id_len of
   1 MiB on a 4-byte buffer read past it (SIGSEGV), SIZE_MAX gave SPOOL_IO "internal error";
   a delay of UINT64_MAX was "must not be negative" and durability 77 was taken as the
   queue's. Each is SPOOL_INVALID_ARGUMENT naming the field, and nothing is sent. */
static void test_lengths_and_values_checked_first(void) {
  spool_queue* q = open_in_root("checked-first", NULL);
  static const char four[4] = "abc";
  spool_attribute a[1] = {{"k", four, 1u << 20}};
  CHECK_CODE(send_with(q, a, 1), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "value_len 1048576") != NULL, "names the length: %s", spool_last_error());
  a[0].value_len = SIZE_MAX;
  CHECK_CODE(send_with(q, a, 1), SPOOL_INVALID_ARGUMENT);
  spool_send_options so;
  spool_send_options_init(&so);
  so.dedup_id = four;
  so.dedup_id_len = 1u << 20;
  CHECK_CODE(spool_send(q, "x", 1, &so, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "dedup_id_len is 1048576") != NULL, "names the length: %s", spool_last_error());
  so.dedup_id_len = SIZE_MAX;
  CHECK_CODE(spool_send(q, "x", 1, &so, NULL), SPOOL_INVALID_ARGUMENT);
  so.dedup_id_len = 0;
  so.delay_ms = UINT64_MAX;
  CHECK_CODE(spool_send(q, "x", 1, &so, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "more than a year") != NULL, "delay: %s", spool_last_error());
  so.delay_ms = 0;
  so.durability = 77;
  CHECK_CODE(spool_send(q, "x", 1, &so, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "durability is 77") != NULL, "durability: %s", spool_last_error());
  CHECK_CODE(spool_ack(q, "1.1.abc", 77), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "durability is 77") != NULL, "ack's durability: %s", spool_last_error());
  CHECK(sent_total(q) == 0, "%llu sent", (unsigned long long)sent_total(q));
  spool_close(q);
  printf("ok: lengths, delay and durability checked before use: clear errors, nothing sent\n");
}

static void test_attributes_round_trip(void) {
  spool_queue* q = open_in_root("attributes", NULL);
  const spool_attribute a[3] = {
      {"trace", "abc", 3}, {"bin", "\0\xff", 2}, {"k.v-1_X", NULL, 0}};
  spool_send_options so;
  spool_send_options_init(&so);
  so.attributes = a;
  so.attribute_count = 3;
  uint64_t id = 0;
  CHECK_CODE(spool_send(q, "with", 4, &so, &id), SPOOL_OK);
  CHECK_CODE(spool_send(q, "plain", 5, NULL, NULL), SPOOL_OK);

  spool_message* m = NULL;
  size_t n = 0;
  CHECK_CODE(spool_receive(q, 2, 0, 0, &m, &n), SPOOL_OK);
  CHECK(n == 2 && m[0].id == id, "both messages");
  const spool_attribute* got = NULL;
  size_t count = 0;
  CHECK_CODE(spool_message_attributes(m, 0, &got, &count), SPOOL_OK);
  CHECK(count == 3, "3 attributes, got %zu", count);
  /* In key order. */
  CHECK(strcmp(got[0].key, "bin") == 0 && got[0].value_len == 2 &&
            memcmp(got[0].value, "\0\xff", 2) == 0 && ((const char*)got[0].value)[2] == 0,
        "binary value, NUL after it");
  CHECK(strcmp(got[1].key, "k.v-1_X") == 0 && got[1].value_len == 0, "empty value");
  CHECK(strcmp(got[2].key, "trace") == 0 && got[2].value_len == 3 &&
            strcmp((const char*)got[2].value, "abc") == 0, "text value");
  const void* v = NULL;
  size_t vlen = 0;
  CHECK_CODE(spool_message_attribute(m, 0, "trace", &v, &vlen), SPOOL_OK);
  CHECK(vlen == 3 && memcmp(v, "abc", 3) == 0, "lookup");
  CHECK_CODE(spool_message_attribute(m, 0, "nope", &v, &vlen), SPOOL_NOT_FOUND);
  CHECK(v == NULL && vlen == 0 && strstr(spool_last_error(), "'nope'") != NULL, "names the key");
  CHECK_CODE(spool_message_attributes(m, 1, &got, &count), SPOOL_OK);
  CHECK(got == NULL && count == 0, "a message without attributes");
  CHECK_CODE(spool_message_attributes(m, 2, &got, &count), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "message 2 of a batch of 2") != NULL, "index past the batch");
  CHECK_CODE(spool_message_attributes(&m[1], 0, &got, &count), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "not &msgs[i]") != NULL, "a pointer into the batch");
  /* Still readable after the ack, until the batch is freed. */
  CHECK_CODE(spool_ack(q, m[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
  CHECK_CODE(spool_nack(q, m[1].receipt, 0), SPOOL_OK);
  CHECK_CODE(spool_message_attribute(m, 0, "bin", &v, NULL), SPOOL_OK);
  CHECK(memcmp(v, "\0\xff", 2) == 0, "value after the ack");
  spool_messages_free(m);

  /* A batch sharing attributes; peek and receive_id carry them too. */
  const void* ptrs[2] = {"b1", "b2"};
  size_t lens[2] = {2, 2};
  uint64_t ids[2];
  so.attribute_count = 1; /* just "trace" */
  CHECK_CODE(spool_send_batch(q, ptrs, lens, 2, &so, ids), SPOOL_OK);
  CHECK_CODE(spool_peek(q, 10, &m, &n), SPOOL_OK);
  CHECK(n == 3, "peek %zu", n);
  CHECK_CODE(spool_message_attributes(m, 0, &got, &count), SPOOL_OK);
  CHECK(count == 0, "the plain one");
  for (size_t i = 1; i < 3; ++i) {
    CHECK_CODE(spool_message_attribute(m, i, "trace", &v, &vlen), SPOOL_OK);
    CHECK(vlen == 3, "shared attribute on message %zu", i);
  }
  spool_messages_free(m);
  CHECK_CODE(spool_receive_id(q, ids[1], 0, &m), SPOOL_OK);
  CHECK_CODE(spool_message_attributes(m, 0, &got, &count), SPOOL_OK);
  CHECK(count == 1 && strcmp(got[0].key, "trace") == 0, "receive_id");
  spool_messages_free(m);
  spool_close(q);
  printf("ok: attributes round-trip (send, batch, receive, peek, receive_id)\n");
}

static void test_attribute_bounds(void) {
  spool_queue* q = open_in_root("attribute-bounds", NULL);
  char keys[17][8];
  static char big[1100];
  memset(big, 'v', sizeof big);
  spool_attribute a[17];
  for (int i = 0; i < 17; ++i) {
    snprintf(keys[i], sizeof keys[i], "k%d", i);
    a[i] = (spool_attribute){keys[i], "v", 1};
  }
  CHECK_CODE(send_with(q, a, 16), SPOOL_OK); /* 16 is allowed */
  CHECK_CODE(send_with(q, a, 17), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "attribute_count is 17") != NULL &&
            strstr(spool_last_error(), "at most 16") != NULL,
        "17 pairs");

  spool_attribute bad[2] = {{"ok", "1", 1}, {"bad key!", "1", 1}};
  CHECK_CODE(send_with(q, bad, 2), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "'bad key!'") != NULL, "names the key");
  bad[1].key = "";
  CHECK_CODE(send_with(q, bad, 2), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "1 to 64 bytes") != NULL, "empty key");
  static char long_key[66];
  memset(long_key, 'k', 65);
  bad[1].key = long_key;
  CHECK_CODE(send_with(q, bad, 2), SPOOL_INVALID_ARGUMENT);
  bad[1].key = NULL;
  CHECK_CODE(send_with(q, bad, 2), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "opts->attributes[1].key is NULL") != NULL, "NULL key");
  bad[1] = (spool_attribute){"ok", "2", 1};
  CHECK_CODE(send_with(q, bad, 2), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "'ok' is given twice") != NULL, "repeated key");
  bad[1] = (spool_attribute){"big", big, 1025};
  CHECK_CODE(send_with(q, bad, 2), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "'big'") != NULL && strstr(spool_last_error(), "1025") != NULL,
        "value too long");
  bad[1].value_len = 1024;
  CHECK_CODE(send_with(q, bad, 2), SPOOL_OK); /* 1024 is allowed */
  spool_attribute total[5];
  for (int i = 0; i < 5; ++i) total[i] = (spool_attribute){keys[i], big, 1000};
  CHECK_CODE(send_with(q, total, 5), SPOOL_INVALID_ARGUMENT); /* 5010 bytes */
  CHECK(strstr(spool_last_error(), "at most 4096") != NULL, "total");
  CHECK_CODE(send_with(q, NULL, 1), SPOOL_INVALID_ARGUMENT);

  /* Dedup ids: at most 128 bytes. */
  spool_send_options so;
  spool_send_options_init(&so);
  so.dedup_id = big;
  so.dedup_id_len = 128;
  CHECK_CODE(spool_send(q, "d", 1, &so, NULL), SPOOL_OK);
  so.dedup_id_len = 129;
  CHECK_CODE(spool_send(q, "d", 1, &so, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "129 bytes; at most 128") != NULL, "long dedup id");

  /* In a batch of items, one bad item refuses the whole batch and is named. */
  spool_send_item items[3] = {
      {.payload = "i0", .len = 2},
      {.payload = "i1", .len = 2, .attributes = a, .attribute_count = 1, .dedup_id = "id-1", .dedup_id_len = 4},
      {.payload = "i2", .len = 2, .attributes = bad, .attribute_count = 1}};
  spool_attribute badkey = {"sp ace", "", 0};
  items[2].attributes = &badkey;
  const uint64_t before = sent_total(q);
  CHECK_CODE(spool_send_items(q, items, 3, sizeof items[0], NULL, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "message 2 of the batch") != NULL &&
            strstr(spool_last_error(), "'sp ace'") != NULL,
        "names the item and the key");
  items[2].attributes = a;
  items[2].attribute_count = 17;
  CHECK_CODE(spool_send_items(q, items, 3, sizeof items[0], NULL, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "items[2].attribute_count is 17") != NULL, "17 in an item");
  CHECK(sent_total(q) == before, "nothing of a refused batch was queued");
  /* Attributes and a dedup id in opts are refused with items: each item has its own. */
  items[2].attribute_count = 1;
  so.dedup_id_len = 0;
  so.attributes = a;
  so.attribute_count = 1;
  CHECK_CODE(spool_send_items(q, items, 3, sizeof items[0], &so, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "each item gives its own") != NULL, "opts with items");
  CHECK_CODE(spool_send_items(q, items, 3, sizeof items[0], NULL, NULL), SPOOL_OK);
  CHECK(sent_total(q) == before + 3, "the good batch");
  spool_close(q);
  printf("ok: attribute and dedup id bounds: clear errors, nothing queued\n");
}

/* ------------------------------------------------------------ deduplication (issue 26) */

static uint64_t send_dedup(spool_queue* q, const char* payload, const void* dedup, size_t len) {
  spool_send_options so;
  spool_send_options_init(&so);
  so.dedup_id = dedup;
  so.dedup_id_len = len;
  uint64_t id = 0;
  CHECK_CODE(spool_send(q, payload, strlen(payload), &so, &id), SPOOL_OK);
  return id;
}

static void test_dedup(void) {
  spool_options o;
  spool_options_init(&o);
  o.dedup_window_ms = 60000;
  spool_queue* q = open_in_root("dedup", &o);
  spool_options got = {.size = sizeof got};
  CHECK_CODE(spool_get_options(q, &got), SPOOL_OK);
  CHECK(got.dedup_window_ms == 60000, "stored window %llu", (unsigned long long)got.dedup_window_ms);

  const uint64_t a = send_dedup(q, "first", "order-1", 7);
  CHECK(send_dedup(q, "again", "order-1", 7) == a, "a duplicate gets the first id");
  const uint64_t b = send_dedup(q, "second", "order-2", 7);
  CHECK(b != a, "another id is another message");
  /* Any bytes: ids differing after a NUL are different ids. */
  const uint64_t c = send_dedup(q, "nul-1", "x\0a", 3);
  const uint64_t d = send_dedup(q, "nul-2", "x\0b", 3);
  CHECK(c != d, "the whole length counts");
  spool_stats st = {.size = sizeof st};
  CHECK_CODE(spool_get_stats(q, &st), SPOOL_OK);
  CHECK(st.sent_total == 4 && st.ready == 4, "4 sent, %llu", (unsigned long long)st.sent_total);
  CHECK(st.dedup_ids == 4, "4 remembered, %llu", (unsigned long long)st.dedup_ids);

  spool_message* m = NULL;
  size_t n = 0;
  CHECK_CODE(spool_receive(q, 10, 0, 0, &m, &n), SPOOL_OK);
  CHECK(n == 4 && m[0].payload_len == 5 && memcmp(m[0].payload, "first", 5) == 0 &&
            memcmp(m[1].payload, "second", 6) == 0,
        "the first message once, then the other");
  for (size_t i = 0; i < n; ++i) CHECK_CODE(spool_ack(q, m[i].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
  spool_messages_free(m);
  /* Acked is still sent: inside the window the id is still a duplicate. */
  CHECK(send_dedup(q, "late", "order-1", 7) == a, "after the ack");

  /* A batch of payloads cannot share a dedup id. */
  spool_send_options so;
  spool_send_options_init(&so);
  so.dedup_id = "shared";
  so.dedup_id_len = 6;
  const void* ptrs[2] = {"p", "q"};
  size_t lens[2] = {1, 1};
  CHECK_CODE(spool_send_batch(q, ptrs, lens, 2, &so, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "with spool_send_items") != NULL, "says what to do");

  /* Items: against an earlier send, and within the batch. */
  spool_send_item items[4] = {{.payload = "x", .len = 1, .dedup_id = "order-1", .dedup_id_len = 7},
                              {.payload = "y", .len = 1, .dedup_id = "order-3", .dedup_id_len = 7},
                              {.payload = "z", .len = 1, .dedup_id = "order-3", .dedup_id_len = 7},
                              {.payload = "w", .len = 1}};
  uint64_t ids[4];
  CHECK_CODE(spool_send_items(q, items, 4, sizeof items[0], NULL, ids), SPOOL_OK);
  CHECK(ids[0] == a, "an earlier send's id");
  CHECK(ids[2] == ids[1] && ids[3] == ids[1] + 1, "ids %llu %llu %llu", (unsigned long long)ids[1],
        (unsigned long long)ids[2], (unsigned long long)ids[3]);
  CHECK_CODE(spool_get_stats(q, &st), SPOOL_OK);
  CHECK(st.sent_total == 6 && st.dedup_ids == 5, "sent %llu, remembered %llu",
        (unsigned long long)st.sent_total, (unsigned long long)st.dedup_ids);
  spool_close(q);

  /* The window ends: the id is forgotten and a send with it is new. */
  o.dedup_window_ms = 2000; /* long enough for two sends on a loaded machine, under ASan */
  q = open_in_root("dedup-window", &o);
  const uint64_t w = send_dedup(q, "w1", "w", 1);
  CHECK(send_dedup(q, "w2", "w", 1) == w, "inside the window");
  usleep(2300 * 1000);
  CHECK_CODE(spool_get_stats(q, &st), SPOOL_OK);
  CHECK(st.dedup_ids == 0, "forgotten: %llu", (unsigned long long)st.dedup_ids);
  CHECK(send_dedup(q, "w3", "w", 1) != w, "a new message after the window");
  spool_close(q);
  printf("ok: dedup ids (same id once, different ids twice, batch items, window, stats)\n");
}

/* ------------------------------------------------------------ priorities (issue 26) */

static spool_code send_prio(spool_queue* q, const char* payload, int has, int priority) {
  spool_send_options so;
  spool_send_options_init(&so);
  so.has_priority = has;
  so.priority = priority;
  return spool_send(q, payload, strlen(payload), &so, NULL);
}

static void test_priorities(void) {
  spool_queue* q = open_in_root("priorities", NULL);
  CHECK_CODE(send_prio(q, "low", 1, 200), SPOOL_OK);
  CHECK_CODE(send_prio(q, "plain", 0, 7), SPOOL_OK); /* no has_priority: the 7 is not read */
  CHECK_CODE(send_prio(q, "urgent", 1, 0), SPOOL_OK);
  spool_send_options so;
  spool_send_options_init(&so);
  CHECK(so.has_priority == 0 && so.priority == SPOOL_DEFAULT_PRIORITY && so.duplicate == NULL, "init");
  so.has_priority = 1;
  so.priority = 10;
  const void* ptrs[2] = {"b1", "b2"};
  size_t lens[2] = {2, 2};
  CHECK_CODE(spool_send_batch(q, ptrs, lens, 2, &so, NULL), SPOOL_OK);
  spool_send_item items[3];
  memset(items, 0, sizeof items); /* a zeroed item: the default priority */
  items[0].payload = "i5";
  items[0].len = 2;
  items[0].has_priority = 1;
  items[0].priority = 5;
  items[1].payload = "i-default";
  items[1].len = 9;
  items[2].payload = "i255";
  items[2].len = 4;
  items[2].has_priority = 1;
  items[2].priority = 255;
  CHECK_CODE(spool_send_items(q, items, 3, sizeof items[0], NULL, NULL), SPOOL_OK);

  /* Peek is in id order and reports each one's priority. */
  spool_message* m = NULL;
  size_t n = 0;
  int p = -1;
  CHECK_CODE(spool_peek(q, 10, &m, &n), SPOOL_OK);
  CHECK(n == 8, "peek %zu", n);
  const int by_id[8] = {200, 128, 0, 10, 10, 5, 128, 255};
  for (size_t i = 0; i < n; ++i) {
    CHECK_CODE(spool_message_priority(m, i, &p), SPOOL_OK);
    CHECK(p == by_id[i], "peeked message %zu has priority %d, want %d", i, p, by_id[i]);
  }
  CHECK_CODE(spool_message_priority(m, 8, &p), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "message 8 of a batch of 8") != NULL, "index past the batch");
  CHECK_CODE(spool_message_priority(&m[1], 0, &p), SPOOL_INVALID_ARGUMENT);
  CHECK_CODE(spool_message_priority(m, 0, NULL), SPOOL_INVALID_ARGUMENT);
  spool_messages_free(m);

  /* Receive takes the most urgent first, the oldest first among equals. */
  const char* order[8] = {"urgent", "i5", "b1", "b2", "plain", "i-default", "low", "i255"};
  const int prio[8] = {0, 5, 10, 10, 128, 128, 200, 255};
  for (int i = 0; i < 8; ++i) {
    CHECK_CODE(spool_receive(q, 1, 60000, 0, &m, &n), SPOOL_OK);
    CHECK(m[0].payload_len == strlen(order[i]) && memcmp(m[0].payload, order[i], m[0].payload_len) == 0,
          "receive %d: %.*s, want %s", i, (int)m[0].payload_len, (const char*)m[0].payload, order[i]);
    CHECK_CODE(spool_message_priority(m, 0, &p), SPOOL_OK);
    CHECK(p == prio[i], "received %s with priority %d, want %d", order[i], p, prio[i]);
    CHECK_CODE(spool_ack(q, m[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
    spool_messages_free(m);
  }

  /* Out of range: refused, naming the field, nothing queued. */
  const uint64_t before = sent_total(q);
  CHECK_CODE(send_prio(q, "x", 1, 256), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "opts->priority is 256: 0 (most urgent) to 255") != NULL, "256");
  CHECK_CODE(send_prio(q, "x", 1, -1), SPOOL_INVALID_ARGUMENT);
  items[1].has_priority = 1;
  items[1].priority = 300;
  CHECK_CODE(spool_send_items(q, items, 3, sizeof items[0], NULL, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "items[1].priority is 300") != NULL, "names the item");
  items[1].has_priority = 0;
  CHECK_CODE(spool_send_items(q, items, 3, sizeof items[0], &so, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "each item gives its own") != NULL, "a priority in opts with items");
  CHECK(sent_total(q) == before, "nothing of the refused sends was queued");
  spool_close(q);
  printf("ok: priorities (send, batch, items, receive order, peek, bounds)\n");
}

static void test_duplicate_flags(void) {
  spool_queue* q = open_in_root("duplicates", NULL);
  spool_send_options so;
  spool_send_options_init(&so);
  int dup = 7;
  uint64_t a = 0, id = 0;
  so.duplicate = &dup;
  CHECK_CODE(spool_send(q, "plain", 5, &so, NULL), SPOOL_OK);
  CHECK(dup == 0, "no dedup id: new, %d", dup);
  so.dedup_id = "order-1";
  so.dedup_id_len = 7;
  dup = 7;
  CHECK_CODE(spool_send(q, "first", 5, &so, &a), SPOOL_OK);
  CHECK(dup == 0, "the first send of an id: new, %d", dup);
  CHECK_CODE(spool_send(q, "again", 5, &so, &id), SPOOL_OK);
  CHECK(dup == 1 && id == a, "the second: a duplicate with the first id, %d", dup);

  /* A batch of payloads has no dedup id, so no flag to set. */
  const void* ptrs[1] = {"p"};
  size_t lens[1] = {1};
  so.dedup_id = NULL;
  so.dedup_id_len = 0;
  CHECK_CODE(spool_send_batch(q, ptrs, lens, 1, &so, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "opts->duplicate is for spool_send") != NULL, "batch");
  CHECK_CODE(spool_send_items(q, NULL, 0, sizeof(spool_send_item), &so, NULL), SPOOL_INVALID_ARGUMENT);

  /* Items: each its own flag; one without a flag is left alone. */
  int flags[4] = {7, 7, 7, 7};
  spool_send_item items[4];
  memset(items, 0, sizeof items);
  const char* dedup[4] = {"order-1", "order-2", "order-2", NULL};
  for (int i = 0; i < 4; ++i) {
    items[i].payload = "i";
    items[i].len = 1;
    items[i].dedup_id = dedup[i];
    items[i].dedup_id_len = dedup[i] != NULL ? 7 : 0;
    items[i].duplicate = i < 3 ? &flags[i] : NULL;
  }
  uint64_t ids[4];
  CHECK_CODE(spool_send_items(q, items, 4, sizeof items[0], NULL, ids), SPOOL_OK);
  CHECK(flags[0] == 1 && flags[1] == 0 && flags[2] == 1 && flags[3] == 7, "flags %d %d %d %d", flags[0],
        flags[1], flags[2], flags[3]);
  CHECK(ids[0] == a && ids[2] == ids[1] && ids[3] == ids[1] + 1, "ids");
  CHECK(sent_total(q) == 4, "plain, first, order-2 and the one without an id: %llu",
        (unsigned long long)sent_total(q));
  spool_close(q);
  printf("ok: duplicate flags (send, items; refused for a batch of payloads)\n");
}

/* ------------------------------------------------------------ ordered groups (issue 26) */

static spool_code send_group(spool_queue* q, const char* payload, const void* group, size_t len) {
  spool_send_options so;
  spool_send_options_init(&so);
  so.group = group;
  so.group_len = len;
  return spool_send(q, payload, strlen(payload), &so, NULL);
}

static uint64_t blocked_now(spool_queue* q) {
  spool_stats st = {.size = sizeof st};
  CHECK_CODE(spool_get_stats(q, &st), SPOOL_OK);
  return st.blocked;
}

/* Checks that message i of `m` is `payload` in the group of `len` bytes at `group` (NULL:
 * none). */
static void check_group_of(const spool_message* m, size_t i, const char* payload, const void* group, size_t len) {
  CHECK(m[i].payload_len == strlen(payload) && memcmp(m[i].payload, payload, m[i].payload_len) == 0,
        "message %zu is %.*s, want %s", i, (int)m[i].payload_len, (const char*)m[i].payload, payload);
  const void* g = (const void*)1;
  size_t n = 99;
  CHECK_CODE(spool_message_group(m, i, &g, &n), SPOOL_OK);
  if (group == NULL) {
    CHECK(g == NULL && n == 0, "%s has no group, got %zu bytes", payload, n);
  } else {
    CHECK(g != NULL && n == len && memcmp(g, group, len) == 0, "%s's group: %zu bytes", payload, n);
    CHECK(((const char*)g)[n] == '\0', "%s's group is followed by a NUL", payload);
  }
}

/* In another process, opened there: nothing is receivable while this one holds the first
 * messages of the groups and the rest are blocked behind them. */
static void check_other_process_gets_nothing(const char* dir) {
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    spool_queue* q = NULL;
    spool_message* m = NULL;
    size_t n = 0;
    if (spool_open(dir, NULL, &q) != SPOOL_OK) _exit(2);
    spool_code c = spool_receive(q, 10, 60000, 0, &m, &n);
    if (c == SPOOL_OK) fprintf(stderr, "child received %zu messages, the first %llu\n", n, (unsigned long long)m[0].id);
    spool_messages_free(m);
    spool_close(q);
    _exit(c == SPOOL_EMPTY ? 0 : 1);
  }
  int st = 0;
  CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the other process received a blocked message (status %d)", st);
}

static void test_groups(void) {
  char dir[300];
  path_in_root(dir, sizeof dir, "groups");
  spool_queue* q = open_in_root("groups", NULL);
  static const char kB[3] = {'B', '\0', 'x'}; /* any bytes, a NUL too */
  CHECK_CODE(send_group(q, "a1", "A", 1), SPOOL_OK);
  CHECK_CODE(send_group(q, "a2", "A", 1), SPOOL_OK);
  spool_send_options so;
  spool_send_options_init(&so);
  CHECK(so.group == NULL && so.group_len == 0, "init: no group");
  so.group = "A";
  so.group_len = 1;
  const void* ptrs[2] = {"a3", "a4"};
  size_t lens[2] = {2, 2};
  CHECK_CODE(spool_send_batch(q, ptrs, lens, 2, &so, NULL), SPOOL_OK);
  spool_send_item items[3] = {{.payload = "b1", .len = 2, .group = kB, .group_len = 3},
                              {.payload = "b2", .len = 2, .group = kB, .group_len = 3},
                              {.payload = "u", .len = 1}};
  CHECK_CODE(spool_send_items(q, items, 3, sizeof items[0], NULL, NULL), SPOOL_OK);
  CHECK(blocked_now(q) == 4, "a2, a3, a4 and b2 are blocked: %llu", (unsigned long long)blocked_now(q));

  /* Peek shows every message in id order with its group, blocked ones too. */
  spool_message* m = NULL;
  size_t n = 0;
  CHECK_CODE(spool_peek(q, 10, &m, &n), SPOOL_OK);
  CHECK(n == 7, "peek %zu", n);
  check_group_of(m, 1, "a2", "A", 1);
  check_group_of(m, 5, "b2", kB, 3);
  check_group_of(m, 6, "u", NULL, 0);
  const void* g = NULL;
  size_t glen = 0;
  CHECK_CODE(spool_message_group(m, 7, &g, &glen), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "message 7 of a batch of 7") != NULL, "index past the batch");
  CHECK_CODE(spool_message_group(&m[1], 0, &g, &glen), SPOOL_INVALID_ARGUMENT);
  CHECK_CODE(spool_message_group(m, 0, NULL, &glen), SPOOL_INVALID_ARGUMENT);
  spool_messages_free(m);

  /* One receive of up to 10 gets each group's first and the ungrouped one, nothing more. */
  CHECK_CODE(spool_receive(q, 10, 60000, 0, &m, &n), SPOOL_OK);
  CHECK(n == 3, "received %zu, want a1, b1, u", n);
  check_group_of(m, 0, "a1", "A", 1);
  check_group_of(m, 1, "b1", kB, 3);
  check_group_of(m, 2, "u", NULL, 0);
  spool_message* held = m;
  spool_message* again = NULL;
  CHECK_CODE(spool_receive(q, 10, 60000, 0, &again, &n), SPOOL_EMPTY);
  check_other_process_gets_nothing(dir);

  /* A nack gives the group its first message again, not the next one. */
  CHECK_CODE(spool_nack(q, held[0].receipt, 0), SPOOL_OK);
  CHECK_CODE(spool_receive(q, 10, 60000, 0, &again, &n), SPOOL_OK);
  CHECK(n == 1 && again[0].receive_count == 2, "a1 again: %zu messages", n);
  check_group_of(again, 0, "a1", "A", 1);
  CHECK_CODE(spool_ack(q, again[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
  spool_messages_free(again);
  CHECK_CODE(spool_ack(q, held[2].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);

  /* Each ack lets exactly the next of its group through, in send order. */
  const char* order_a[3] = {"a2", "a3", "a4"};
  for (int i = 0; i < 3; ++i) {
    CHECK_CODE(spool_receive(q, 10, 60000, 0, &m, &n), SPOOL_OK);
    CHECK(n == 1, "one at a time: %zu after %s", n, i == 0 ? "a1" : order_a[i - 1]);
    check_group_of(m, 0, order_a[i], "A", 1);
    CHECK_CODE(spool_ack(q, m[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
    spool_messages_free(m);
  }
  CHECK_CODE(spool_ack(q, held[1].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
  spool_messages_free(held);
  CHECK_CODE(spool_receive(q, 10, 60000, 0, &m, &n), SPOOL_OK);
  CHECK(n == 1, "b2 alone: %zu", n);
  check_group_of(m, 0, "b2", kB, 3);
  CHECK_CODE(spool_ack(q, m[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
  spool_messages_free(m);
  CHECK(blocked_now(q) == 0, "none blocked at the end");

  /* Bounds: 1 to 128 bytes, refused naming the field, nothing queued. */
  static char big[130];
  memset(big, 'g', sizeof big);
  CHECK_CODE(send_group(q, "max", big, 128), SPOOL_OK);
  const uint64_t before = sent_total(q);
  CHECK_CODE(send_group(q, "x", big, 129), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "spool_send: opts->group_len is 129: a group key is 1 to 128 bytes") != NULL,
        "129");
  CHECK_CODE(send_group(q, "x", NULL, 5), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "opts->group is NULL with group_len 5") != NULL, "NULL group");
  so.group = big;
  so.group_len = 129;
  CHECK_CODE(spool_send_batch(q, ptrs, lens, 2, &so, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "spool_send_batch: opts->group_len is 129") != NULL, "batch");
  items[1].group = big;
  items[1].group_len = 129;
  CHECK_CODE(spool_send_items(q, items, 3, sizeof items[0], NULL, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "items[1].group_len is 129") != NULL, "names the item");
  items[1].group_len = 3;
  so.group_len = 1;
  CHECK_CODE(spool_send_items(q, items, 3, sizeof items[0], &so, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "each item gives its own") != NULL, "a group in opts with items");
  CHECK(sent_total(q) == before, "nothing of the refused sends was queued");

  /* A caller built before groups: its shorter structs end before group; what lies past
   * them (garbage here) is not read, and its shorter spool_stats gets no blocked. */
  spool_send_options old;
  memset(&old, 0xff, sizeof old);
  spool_send_options_init_size(&old, offsetof(spool_send_options, group));
  CHECK(old.group_len == (size_t)-1, "init stopped before group");
  uint64_t id1 = 0, id2 = 0;
  CHECK_CODE(spool_send(q, "o1", 2, &old, &id1), SPOOL_OK);
  spool_send_item olds[1];
  memset(olds, 0xff, sizeof olds);
  memset(olds, 0, offsetof(spool_send_item, group));
  olds[0].payload = "o2";
  olds[0].len = 2;
  CHECK_CODE(spool_send_items(q, olds, 1, offsetof(spool_send_item, group), NULL, &id2), SPOOL_OK);
  spool_stats st = stats_sized(q, offsetof(spool_stats, blocked));
  CHECK(st.blocked == 0xababababababababull && st.kept_acked_bytes == 0, "blocked left alone");
  CHECK_CODE(spool_receive(q, 10, 60000, 0, &m, &n), SPOOL_OK);
  CHECK(n == 3, "max, o1 and o2 are ungrouped or alone in theirs: %zu", n);
  check_group_of(m, 0, "max", big, 128);
  check_group_of(m, 1, "o1", NULL, 0);
  check_group_of(m, 2, "o2", NULL, 0);
  spool_messages_free(m);
  spool_close(q);
  printf("ok: ordered groups (one at a time across receives and processes, the group read back, bounds)\n");
}

/* ------------------------------------------------------------ callers of 0.1.0 (issue 26) */

/* A program built against 0.1.0's spool.h has the shorter structs: spool_send_options ends
 * after wait_for_room_ms (32 bytes), spool_options after create (88), spool_stats after
 * next_id. The library must neither read nor write past them. */
static void test_old_struct_sizes(void) {
  /* The 0.1.0 init functions (called by name, past the macros) fill only the old fields. */
  spool_options o;
  memset(&o, 0xab, sizeof o);
  (spool_options_init)(&o);
  CHECK(o.size == offsetof(spool_options, dedup_window_ms), "legacy options size %zu", o.size);
  CHECK(o.dedup_window_ms == 0xababababababababull, "legacy init wrote past 0.1.0's struct");
  CHECK(o.visibility_ms == 30000 && o.create == 1, "legacy defaults");
  spool_send_options so;
  memset(&so, 0xab, sizeof so);
  (spool_send_options_init)(&so);
  CHECK(so.size == offsetof(spool_send_options, attributes), "legacy send options size %zu", so.size);
  CHECK(so.attribute_count == (size_t)0xababababababababull && so.dedup_id_len == so.attribute_count,
        "legacy send init wrote past 0.1.0's struct");
  /* The sized init writes no byte past the size it is given. */
  memset(&so, 0xab, sizeof so);
  spool_send_options_init_size(&so, offsetof(spool_send_options, durability));
  CHECK(so.size == offsetof(spool_send_options, durability) && so.delay_ms == 0, "short init");
  CHECK(so.durability == (int)0xabababab, "short init stopped at its size");
  spool_send_options_init(&so); /* the macro: the whole struct of this header */
  CHECK(so.size == sizeof so && so.attributes == NULL && so.dedup_id_len == 0, "macro init");

  /* Open with an old options struct: the garbage past it is not read (as a window it would
   * be refused: 0xabab... ms is more than 7 days). */
  spool_queue* q = open_in_root("old-sizes", &o);
  spool_options got = {.size = sizeof got};
  CHECK_CODE(spool_get_options(q, &got), SPOOL_OK);
  CHECK(got.dedup_window_ms == 300000, "the default window, %llu", (unsigned long long)got.dedup_window_ms);

  /* Send with an old send options struct whose newer fields hold garbage (pointers that
   * would crash if read): no attributes, no dedup id. */
  memset(&so, 0xff, sizeof so);
  (spool_send_options_init)(&so);
  uint64_t id1 = 0, id2 = 0;
  CHECK_CODE(spool_send(q, "old1", 4, &so, &id1), SPOOL_OK);
  CHECK_CODE(spool_send(q, "old2", 4, &so, &id2), SPOOL_OK);
  CHECK(id2 == id1 + 1, "no dedup id was read: two messages");
  const void* ptrs[1] = {"old3"};
  size_t lens[1] = {4};
  CHECK_CODE(spool_send_batch(q, ptrs, lens, 1, &so, NULL), SPOOL_OK);
  /* Items of an older, shorter layout (payload and length only), by their stride. */
  struct {
    const void* payload;
    size_t len;
  } small[2] = {{"s1", 2}, {"s2", 2}};
  uint64_t ids[2];
  CHECK_CODE(spool_send_items(q, (const spool_send_item*)(const void*)small, 2, sizeof small[0], &so, ids),
             SPOOL_OK);
  CHECK(ids[1] == ids[0] + 1, "short items");
  CHECK_CODE(spool_send_items(q, (const spool_send_item*)(const void*)small, 2, sizeof(void*), NULL, ids),
             SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "item_size") != NULL, "too small an item size");

  spool_message* m = NULL;
  size_t n = 0;
  CHECK_CODE(spool_receive(q, 10, 0, 0, &m, &n), SPOOL_OK);
  CHECK(n == 5, "5 messages, %zu", n);
  for (size_t i = 0; i < n; ++i) {
    const spool_attribute* a = NULL;
    size_t count = 9;
    CHECK_CODE(spool_message_attributes(m, i, &a, &count), SPOOL_OK);
    CHECK(count == 0, "message %zu has no attributes", i);
  }
  spool_messages_free(m);

  /* An old spool_stats: dedup_ids is past its end and left alone. */
  spool_stats s = stats_sized(q, offsetof(spool_stats, dedup_ids));
  CHECK(s.in_flight == 5 && s.next_id != 0xababababababababull, "old fields written");
  CHECK(s.dedup_ids == 0xababababababababull, "dedup_ids left alone");
  spool_close(q);
  printf("ok: 0.1.0-sized option, send option, item and stats structs\n");
}

/* Subscriptions (issue 46): a handle opened as a subscription and the queue's own handle each
 * receive the one message, with leases and acks of their own; a receipt of one is refused by
 * the other; receive by id on a subscription; bad names and NULLs refused with a text that
 * names them. */
static void test_subscriptions(void) {
  char dir[300];
  path_in_root(dir, sizeof dir, "subs");
  spool_queue* q = NULL;
  CHECK_CODE(spool_open(dir, NULL, &q), SPOOL_OK);
  spool_subscription_info* subs = (spool_subscription_info*)1;
  size_t ns = 9;
  CHECK_CODE(spool_subscriptions(q, &subs, &ns), SPOOL_OK);
  CHECK(subs == NULL && ns == 0, "no subscriptions yet");

  /* Bad names and arguments, each with a text naming what is wrong. */
  spool_queue* s = (spool_queue*)1;
  CHECK_CODE(spool_open_subscription(dir, NULL, "audit", &s), SPOOL_NOT_FOUND);
  CHECK(s == NULL, "out is NULL after a failed open");
  CHECK(strstr(spool_last_error(), "audit") != NULL, "unknown name named");
  CHECK_CODE(spool_open_subscription(dir, NULL, NULL, &s), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "subscription is NULL") != NULL, "NULL name");
  CHECK_CODE(spool_open_subscription(dir, NULL, "", &s), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "subscription is \"\"") != NULL, "empty name");
  CHECK_CODE(spool_open_subscription(NULL, NULL, "audit", &s), SPOOL_INVALID_ARGUMENT);
  CHECK_CODE(spool_open_subscription(dir, NULL, "audit", NULL), SPOOL_INVALID_ARGUMENT);
  CHECK_CODE(spool_add_subscription(q, NULL, 0), SPOOL_INVALID_ARGUMENT);
  CHECK_CODE(spool_add_subscription(NULL, "audit", 0), SPOOL_INVALID_ARGUMENT);
  CHECK_CODE(spool_add_subscription(q, "no/slash", 0), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "no/slash") != NULL, "bad name named");
  CHECK_CODE(spool_add_subscription(q, "default", 0), SPOOL_INVALID_ARGUMENT);
  CHECK_CODE(spool_add_subscription(q, "", 0), SPOOL_INVALID_ARGUMENT);
  CHECK_CODE(spool_remove_subscription(q, "audit"), SPOOL_NOT_FOUND);
  CHECK_CODE(spool_remove_subscription(q, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK_CODE(spool_subscriptions(q, NULL, &ns), SPOOL_INVALID_ARGUMENT);

  /* "early" is added before the first send and gets it; "late" with from_start gets it too. */
  CHECK_CODE(spool_add_subscription(q, "early", 0), SPOOL_OK);
  CHECK_CODE(spool_add_subscription(q, "early", 0), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "exists") != NULL, "a second add says it exists");
  uint64_t id = 0;
  CHECK_CODE(spool_send(q, "one", 3, NULL, &id), SPOOL_OK);
  CHECK_CODE(spool_add_subscription(q, "late", 1), SPOOL_OK);
  CHECK_CODE(spool_add_subscription(q, "later", 0), SPOOL_OK);
  CHECK_CODE(spool_subscriptions(q, &subs, &ns), SPOOL_OK);
  CHECK(ns == 3, "3 subscriptions, %zu", ns);
  int seen = 0;
  for (size_t i = 0; i < ns; ++i) {
    if (strcmp(subs[i].name, "early") == 0 || strcmp(subs[i].name, "late") == 0) {
      CHECK(subs[i].messages == 1 && subs[i].in_flight == 0, "%s holds the message", subs[i].name);
      CHECK(subs[i].from <= id, "%s from %llu", subs[i].name, (unsigned long long)subs[i].from);
      ++seen;
    } else {
      CHECK(strcmp(subs[i].name, "later") == 0, "name %s", subs[i].name);
      CHECK(subs[i].messages == 0 && subs[i].from > id, "later gets only later messages");
    }
  }
  CHECK(seen == 2, "early and late listed");
  spool_free(subs);

  CHECK_CODE(spool_open_subscription(dir, NULL, "early", &s), SPOOL_OK);
  spool_message *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  CHECK_CODE(spool_receive(q, 10, 60000, 0, &a, &na), SPOOL_OK);
  CHECK_CODE(spool_receive(s, 10, 60000, 0, &b, &nb), SPOOL_OK);
  CHECK(na == 1 && nb == 1 && a[0].id == id && b[0].id == id, "both get message %llu",
        (unsigned long long)id);
  CHECK(b[0].payload_len == 3 && memcmp(b[0].payload, "one", 3) == 0, "the subscription's payload");
  /* Each receipt belongs to its own reader only. */
  CHECK_CODE(spool_ack(s, a[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "early") != NULL, "text names the subscription");
  CHECK_CODE(spool_ack(q, b[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_INVALID_ARGUMENT);
  spool_stats st = {.size = sizeof st};
  CHECK_CODE(spool_get_stats(s, &st), SPOOL_OK);
  CHECK(st.in_flight == 1 && st.ready == 0, "the subscription's lease");
  CHECK_CODE(spool_ack(s, b[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
  CHECK_CODE(spool_get_stats(s, &st), SPOOL_OK);
  CHECK(st.in_flight == 0 && st.ready == 0, "acked in the subscription");
  CHECK_CODE(spool_get_stats(q, &st), SPOOL_OK);
  CHECK(st.in_flight == 1, "still leased in the queue's own view");
  CHECK_CODE(spool_ack(q, a[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
  spool_messages_free(a);
  spool_messages_free(b);
  /* "late" still holds it: acks in the others did not touch it. */
  spool_queue* l = NULL;
  CHECK_CODE(spool_open_subscription(dir, NULL, "late", &l), SPOOL_OK);
  spool_message_info* infos = NULL;
  size_t ni = 0;
  CHECK_CODE(spool_list(l, 10, 0, &infos, &ni), SPOOL_OK);
  CHECK(ni == 1 && infos[0].id == id && infos[0].ready == 1, "late lists the message");
  spool_free(infos);
  /* Received by id in the subscription: leased there only. */
  CHECK_CODE(spool_receive_id(l, id, 60000, &a), SPOOL_OK);
  CHECK(a[0].id == id && a[0].receive_count == 1, "late's first delivery of %llu", (unsigned long long)id);
  CHECK_CODE(spool_receive_id(l, id, 60000, &b), SPOOL_EMPTY);
  CHECK_CODE(spool_receive_id(l, id + 1, 60000, &b), SPOOL_NOT_FOUND);
  CHECK(strstr(spool_last_error(), "late") != NULL, "names the subscription");
  CHECK_CODE(spool_ack(l, a[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
  spool_messages_free(a);
  /* The queue's own operations are refused on a subscription's handle. */
  CHECK_CODE(spool_purge(l, NULL), SPOOL_INVALID_ARGUMENT);
  CHECK_CODE(spool_remove(l, id, SPOOL_DURABILITY_QUEUE), SPOOL_INVALID_ARGUMENT);
  /* Removed from another handle: the open handle gets NOT_FOUND at its next call. */
  CHECK_CODE(spool_remove_subscription(q, "late"), SPOOL_OK);
  CHECK_CODE(spool_receive(l, 1, 0, 0, &a, &na), SPOOL_NOT_FOUND);
  CHECK(a == NULL && na == 0, "no batch");
  spool_close(l);
  CHECK_CODE(spool_subscriptions(s, &subs, &ns), SPOOL_OK);
  CHECK(ns == 2, "2 left, %zu", ns);
  spool_free(subs);
  spool_close(s);
  spool_close(q);
  printf("ok: subscriptions\n");
}

/* Per-subscription max_receives and dead letters (issue 46): a subscription added with
 * max_receives 2 dead-letters a message on its third receive there while the queue's own
 * view (max_receives 10) still delivers it; a redrive filtered to one subscription sends
 * back only its dead letters, to it alone; peek and purge filtered the same way. */
static int dead_mark_is(const spool_message* msgs, size_t i, const char* sub) {
  const void* v = NULL;
  size_t len = 0;
  if (spool_message_attribute(msgs, i, "spool.dead.subscription", &v, &len) != SPOOL_OK) return 0;
  return len == strlen(sub) && memcmp(v, sub, len) == 0;
}

static uint64_t dead_depth(spool_queue* q) {
  spool_queue* dlq = NULL;
  CHECK_CODE(spool_dead_letters(q, &dlq), SPOOL_OK);
  spool_stats st = {.size = sizeof st};
  CHECK_CODE(spool_get_stats(dlq, &st), SPOOL_OK);
  return st.ready + st.delayed + st.in_flight;
}

/* Receives in `s` and nacks at once, `times` times; each must deliver `id`, counted 1, 2, ... */
static void receive_and_nack(spool_queue* s, uint64_t id, int times) {
  for (int i = 1; i <= times; ++i) {
    spool_message* m = NULL;
    size_t n = 0;
    CHECK_CODE(spool_receive(s, 1, 60000, 0, &m, &n), SPOOL_OK);
    CHECK(m[0].id == id && m[0].receive_count == (uint32_t)i, "delivery %d of %llu: count %u", i,
          (unsigned long long)id, m[0].receive_count);
    CHECK_CODE(spool_nack(s, m[0].receipt, 0), SPOOL_OK);
    spool_messages_free(m);
  }
}

static void test_subscription_dead_letters(void) {
  char dir[300];
  path_in_root(dir, sizeof dir, "sub-dead");
  spool_queue* q = NULL;
  CHECK_CODE(spool_open(dir, NULL, &q), SPOOL_OK); /* the queue's max_receives: 10 */
  CHECK_CODE(spool_add_subscription_max_receives(q, "two", 0, 2), SPOOL_OK);
  CHECK_CODE(spool_add_subscription_max_receives(q, "one", 0, 1), SPOOL_OK);
  CHECK_CODE(spool_add_subscription_max_receives(q, "own", 0, 0), SPOOL_OK);
  CHECK_CODE(spool_add_subscription_max_receives(q, "two", 0, 3), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "exists") != NULL, "a second add says it exists");
  CHECK_CODE(spool_add_subscription_max_receives(NULL, "x", 0, 1), SPOOL_INVALID_ARGUMENT);
  CHECK_CODE(spool_add_subscription_max_receives(q, NULL, 0, 1), SPOOL_INVALID_ARGUMENT);

  /* Each tells its own max_receives (0: the queue's). */
  spool_subscription_info* subs = NULL;
  size_t ns = 0;
  CHECK_CODE(spool_subscriptions(q, &subs, &ns), SPOOL_OK);
  CHECK(ns == 3, "3 subscriptions, %zu", ns);
  for (size_t i = 0; i < ns; ++i) {
    uint32_t want = strcmp(subs[i].name, "two") == 0 ? 2 : strcmp(subs[i].name, "one") == 0 ? 1 : 0;
    CHECK(subs[i].max_receives == want, "%s: max_receives %u, want %u", subs[i].name, subs[i].max_receives, want);
  }
  spool_free(subs);

  uint64_t id = 0;
  CHECK_CODE(spool_send(q, "poison", 6, NULL, &id), SPOOL_OK);
  spool_queue *two = NULL, *one = NULL, *own = NULL;
  CHECK_CODE(spool_open_subscription(dir, NULL, "two", &two), SPOOL_OK);
  CHECK_CODE(spool_open_subscription(dir, NULL, "one", &one), SPOOL_OK);
  CHECK_CODE(spool_open_subscription(dir, NULL, "own", &own), SPOOL_OK);
  /* "two": delivered twice, then dead-lettered on the third receive. */
  receive_and_nack(two, id, 2);
  spool_message* m = NULL;
  size_t n = 0;
  CHECK_CODE(spool_receive(two, 1, 60000, 0, &m, &n), SPOOL_EMPTY);
  CHECK(dead_depth(q) == 1, "one dead letter, %llu", (unsigned long long)dead_depth(q));
  /* The queue's own view and "own" (the queue's 10) still have it, never received there. */
  spool_stats st = {.size = sizeof st};
  CHECK_CODE(spool_get_stats(q, &st), SPOOL_OK);
  CHECK(st.ready == 1, "the queue's own view still holds it: ready %llu", (unsigned long long)st.ready);
  receive_and_nack(q, id, 3);
  receive_and_nack(own, id, 3);
  /* "one": delivered once, dead-lettered on the second receive. */
  receive_and_nack(one, id, 1);
  CHECK_CODE(spool_receive(one, 1, 60000, 0, &m, &n), SPOOL_EMPTY);
  CHECK(dead_depth(q) == 2, "two dead letters, %llu", (unsigned long long)dead_depth(q));

  /* Peek filtered by subscription. */
  CHECK_CODE(spool_peek_dead_letters(q, "two", 10, &m, &n), SPOOL_OK);
  CHECK(n == 1 && dead_mark_is(m, 0, "two"), "two's dead letter, %zu", n);
  CHECK(m[0].payload_len == 6 && memcmp(m[0].payload, "poison", 6) == 0, "its payload");
  spool_messages_free(m);
  CHECK_CODE(spool_peek_dead_letters(q, "", 10, &m, &n), SPOOL_OK);
  CHECK(n == 2 && (dead_mark_is(m, 0, "two") ? dead_mark_is(m, 1, "one") : dead_mark_is(m, 0, "one")),
        "every dead letter with \"\", %zu", n);
  spool_messages_free(m);
  CHECK_CODE(spool_peek_dead_letters(q, "", 1, &m, &n), SPOOL_OK);
  CHECK(n == 1, "max 1, %zu", n);
  spool_messages_free(m);
  m = (spool_message*)1;
  CHECK_CODE(spool_peek_dead_letters(q, "nosuch", 10, &m, &n), SPOOL_OK);
  CHECK(m == NULL && n == 0, "no dead letters of nosuch");
  CHECK_CODE(spool_peek_dead_letters(q, NULL, 10, &m, &n), SPOOL_INVALID_ARGUMENT);
  CHECK(strstr(spool_last_error(), "subscription is NULL") != NULL, "NULL named");

  /* Redrive only "two"'s: back to "two" alone. */
  uint64_t moved = 99;
  CHECK_CODE(spool_redrive_subscription(q, 10, NULL, &moved), SPOOL_INVALID_ARGUMENT);
  CHECK(moved == 0, "moved 0 on failure");
  CHECK_CODE(spool_redrive_subscription(q, 10, "two", &moved), SPOOL_OK);
  CHECK(moved == 1, "redrove %llu", (unsigned long long)moved);
  CHECK(dead_depth(q) == 1, "one's dead letter stays, %llu", (unsigned long long)dead_depth(q));
  CHECK_CODE(spool_receive(two, 1, 60000, 0, &m, &n), SPOOL_OK);
  CHECK(m[0].id > id && m[0].receive_count == 1, "two gets it back as a new message");
  uint64_t again = m[0].id;
  CHECK_CODE(spool_ack(two, m[0].receipt, SPOOL_DURABILITY_QUEUE), SPOOL_OK);
  spool_messages_free(m);
  CHECK_CODE(spool_receive(one, 1, 60000, 0, &m, &n), SPOOL_EMPTY); /* not to "one" */
  spool_message_info* infos = NULL;
  CHECK_CODE(spool_list(own, 10, 0, &infos, &n), SPOOL_OK); /* nor to "own" */
  CHECK(n == 1 && infos[0].id == id, "own holds only the original, %zu", n);
  spool_free(infos);
  CHECK_CODE(spool_list(q, 10, 0, &infos, &n), SPOOL_OK); /* nor to the queue's own view */
  CHECK(n == 1 && infos[0].id == id && infos[0].id != again, "the queue's own view: only the original, %zu", n);
  spool_free(infos);

  /* Purge filtered: "two" has none left; "one"'s goes. */
  uint64_t removed = 99;
  CHECK_CODE(spool_purge_dead_letters(q, "two", &removed), SPOOL_OK);
  CHECK(removed == 0 && dead_depth(q) == 1, "nothing of two's to purge");
  CHECK_CODE(spool_purge_dead_letters(q, "one", &removed), SPOOL_OK);
  CHECK(removed == 1 && dead_depth(q) == 0, "one's purged: %llu", (unsigned long long)removed);
  CHECK_CODE(spool_purge_dead_letters(q, NULL, &removed), SPOOL_INVALID_ARGUMENT);
  spool_close(two);
  spool_close(one);
  spool_close(own);
  spool_close(q);
  printf("ok: max_receives per subscription, dead letters filtered by subscription\n");
}

int main(void) {
  const char* tmp = getenv("TMPDIR");
  snprintf(g_root, sizeof g_root, "%s/spool-capi-test.XXXXXX", tmp ? tmp : "/tmp");
  CHECK(mkdtemp(g_root) != NULL, "mkdtemp: %s", strerror(errno));
  test_errors();
  test_option_sizes();
  test_leases();
  test_ack_batch();
  test_delayed_send();
  test_attributes_round_trip();
  test_attribute_bounds();
  test_lengths_and_values_checked_first();
  test_dedup();
  test_priorities();
  test_duplicate_flags();
  test_groups();
  test_old_struct_sizes();
  test_subscriptions();
  test_subscription_dead_letters();
  test_killed_consumer();
  test_competing_processes();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_root);
  printf("capi_test: %d checks passed\n", g_checks);
  return 0;
}
