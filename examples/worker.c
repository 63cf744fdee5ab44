/* spool-c-worker: a competing consumer in C, on the C API (spool.h). Receives up to 16
 * messages at a time, renews each one's lease with a keeper while it "works", and acks it.
 * Run as many as you like beside workers in C++, Python or the shell (`spool work`): each
 * message is processed by one of them at a time.
 *
 *   spool-c-worker DIR [--idle-exit SECONDS] [--out FILE] [--work-ms MS]
 *
 *   --idle-exit S   stop once no message has arrived for S seconds (default: never)
 *   --out FILE      append "ID PAYLOAD" per processed message to FILE (one write each,
 *                   O_APPEND: several workers may share the file); default stdout
 *   --work-ms MS    pretend each message takes MS milliseconds of work (default 0)
 *
 * SIGINT / SIGTERM: finish the messages in hand, then exit 0. Killed instead, its bound
 * leases return to ready at once and another worker gets the messages.
 *
 * Build against an installed libspool:
 *   cc -std=c99 worker.c $(pkg-config --cflags --libs spool) -o spool-c-worker
 *
 * Exit codes: 0 stopped (signal or idle), 1 a queue error (printed), 64 usage.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <signal.h>
#include <spool/spool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop = 0;

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The "work": recording the message as one line. */
static int process(int fd, const spool_message* m, long work_ms) {
  if (work_ms > 0) {
    struct timespec d = {work_ms / 1000, (work_ms % 1000) * 1000000L};
    nanosleep(&d, NULL);
  }
  size_t cap = m->payload_len + 32;
  char* line = malloc(cap);
  if (line == NULL) return 0;
  int head = snprintf(line, cap, "%llu ", (unsigned long long)m->id);
  memcpy(line + head, m->payload, m->payload_len);
  line[(size_t)head + m->payload_len] = '\n';
  ssize_t len = (ssize_t)((size_t)head + m->payload_len + 1);
  int ok = write(fd, line, (size_t)len) == len;
  free(line);
  return ok;
}

int main(int argc, char** argv) {
  double idle_exit = 0;
  long work_ms = 0;
  const char* out_path = NULL;
  if (argc < 2) goto usage;
  for (int i = 2; i < argc; ++i) {
    if (strcmp(argv[i], "--idle-exit") == 0 && i + 1 < argc) {
      idle_exit = atof(argv[++i]);
    } else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
      out_path = argv[++i];
    } else if (strcmp(argv[i], "--work-ms") == 0 && i + 1 < argc) {
      work_ms = atol(argv[++i]);
    } else {
      goto usage;
    }
  }

  int fd = 1;
  if (out_path != NULL && (fd = open(out_path, O_WRONLY | O_CREAT | O_APPEND, 0644)) < 0) {
    perror(out_path);
    return 1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);

  spool_queue* q = NULL;
  if (spool_open(argv[1], NULL, &q) != SPOOL_OK) {
    fprintf(stderr, "spool-c-worker: %s\n", spool_last_error());
    return 1;
  }
  int rc = 0;
  double last_message = now_s();
  while (!g_stop) {
    spool_message* msgs = NULL;
    size_t n = 0;
    /* A long poll of at most 500 ms, so signals and --idle-exit are seen. */
    spool_code c = spool_receive(q, 16, 30000, 500, &msgs, &n);
    if (c == SPOOL_EMPTY) {
      if (idle_exit > 0 && now_s() - last_message >= idle_exit) break;
      continue;
    }
    if (c != SPOOL_OK) {
      fprintf(stderr, "spool-c-worker: receive: %s\n", spool_last_error());
      rc = 1;
      break;
    }
    last_message = now_s();
    for (size_t i = 0; i < n; ++i) {
      /* Renews the 30 s lease every 10 s while this message is processed. */
      spool_keeper* k = NULL;
      if (spool_keeper_start(q, msgs[i].receipt, 10000, 30000, 3600000, &k) != SPOOL_OK) {
        fprintf(stderr, "spool-c-worker: keeper: %s\n", spool_last_error());
      }
      int ok = process(fd, &msgs[i], work_ms);
      spool_keeper_free(k);
      spool_code s = ok ? spool_ack(q, msgs[i].receipt, SPOOL_DURABILITY_QUEUE)
                        : spool_nack(q, msgs[i].receipt, 1000);
      if (s == SPOOL_LEASE_LOST) {
        /* Another worker has it now: our result is stale. Not an error of this worker. */
        fprintf(stderr, "spool-c-worker: message %llu: %s\n", (unsigned long long)msgs[i].id,
                spool_last_error());
      } else if (s != SPOOL_OK) {
        fprintf(stderr, "spool-c-worker: settle: %s\n", spool_last_error());
        rc = 1;
      }
    }
    spool_messages_free(msgs);
  }
  spool_close(q);
  return rc;

usage:
  fprintf(stderr, "usage: %s DIR [--idle-exit SECONDS] [--out FILE] [--work-ms MS]\n", argv[0]);
  return 64;
}
