/* The C API's side of bench/bench_bindings.sh: the cost of one spool_send and of one
 * spool_send_batch of 100 (64-byte payloads, a fresh queue each, the default interval sync
 * policy), the baseline the Go and Node bindings are measured against.
 * Usage: bench_capi DIR N   (DIR: a directory to create two queues in; N: sends)
 * Prints "send_ns X" and "batch100_ns Y": nanoseconds per call, wall time; the same with
 * _cpu_ns: CPU time of the process per call. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <spool/spool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* CPU time of this process (user + system): on a loaded machine the wall time mostly
 * measures waiting for a core, this what a call costs. */
static double cpu_ns(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e9 +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e3;
}

static spool_queue* open_queue(const char* dir, const char* name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  spool_options o;
  spool_options_init(&o);
  o.segment_size = 256u << 20;
  spool_queue* q = NULL;
  if (spool_open(path, &o, &q) != SPOOL_OK) {
    fprintf(stderr, "bench_capi: %s\n", spool_last_error());
    exit(1);
  }
  return q;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: bench_capi DIR N\n");
    return 2;
  }
  long n = atol(argv[2]);
  char payload[64];
  memset(payload, 'x', sizeof payload);

  spool_queue* q = open_queue(argv[1], "c-send");
  double t0 = now_ns(), c0 = cpu_ns();
  for (long i = 0; i < n; i++) {
    if (spool_send(q, payload, sizeof payload, NULL, NULL) != SPOOL_OK) {
      fprintf(stderr, "bench_capi: %s\n", spool_last_error());
      return 1;
    }
  }
  printf("send_ns %.0f\nsend_cpu_ns %.0f\n", (now_ns() - t0) / n, (cpu_ns() - c0) / n);
  spool_close(q);

  enum { BATCH = 100 };
  const void* ptrs[BATCH];
  size_t lens[BATCH];
  for (int i = 0; i < BATCH; i++) {
    ptrs[i] = payload;
    lens[i] = sizeof payload;
  }
  uint64_t ids[BATCH];
  q = open_queue(argv[1], "c-batch");
  long calls = n / BATCH > 0 ? n / BATCH : 1;
  t0 = now_ns();
  c0 = cpu_ns();
  for (long i = 0; i < calls; i++) {
    if (spool_send_batch(q, ptrs, lens, BATCH, NULL, ids) != SPOOL_OK) {
      fprintf(stderr, "bench_capi: %s\n", spool_last_error());
      return 1;
    }
  }
  printf("batch100_ns %.0f\nbatch100_cpu_ns %.0f\n", (now_ns() - t0) / calls,
         (cpu_ns() - c0) / calls);
  spool_close(q);
  return 0;
}
