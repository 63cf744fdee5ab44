/* The C API (include/spool/spool.h), compiled as C99 and linked against libspool.so.0, with
 * real processes: a producer and two competing consumers forked from this test, each opening
 * the queue itself, every message acked exactly once; a consumer killed with SIGKILL while it
 * holds a bound lease; stale receipts; the error texts and their thread-locality; the size
 * field of the option structs; dead letters and redrive.
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
  struct {
    spool_stats head;
    uint64_t guard;
  } s;
  memset(&s, 0xab, sizeof s);
  s.head.size = offsetof(spool_stats, in_flight);
  CHECK_CODE(spool_get_stats(q, &s.head), SPOOL_OK);
  CHECK(s.head.ready == 0, "ready written");
  CHECK(s.head.in_flight == 0xababababababababull, "in_flight left alone");
  CHECK(s.head.size == offsetof(spool_stats, in_flight), "size kept");
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
  usleep(150 * 1000);
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
  CHECK_CODE(spool_send_batch(q, ptrs, lens, 2, &so, NULL), SPOOL_OK);
  spool_message* m = NULL;
  size_t n = 0;
  CHECK_CODE(spool_receive(q, 2, 0, 0, &m, &n), SPOOL_EMPTY);
  double start = now_s();
  CHECK_CODE(spool_receive(q, 2, 0, 3000, &m, &n), SPOOL_OK);
  double took = now_s() - start;
  CHECK(took > 0.2, "delay honoured (%.3f s)", took);
  CHECK(n >= 1, "batch");
  spool_messages_free(m);
  spool_close(q);
  spool_stats st = {.size = sizeof st, .ready = 101};
  CHECK(spool_workers_needed(&st, 10, 1) == 11, "workers_needed %llu",
        (unsigned long long)spool_workers_needed(&st, 10, 1));
}

int main(void) {
  const char* tmp = getenv("TMPDIR");
  snprintf(g_root, sizeof g_root, "%s/spool-capi-test.XXXXXX", tmp ? tmp : "/tmp");
  CHECK(mkdtemp(g_root) != NULL, "mkdtemp: %s", strerror(errno));
  test_errors();
  test_option_sizes();
  test_leases();
  test_delayed_send();
  test_killed_consumer();
  test_competing_processes();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_root);
  printf("capi_test: %d checks passed\n", g_checks);
  return 0;
}
