/*
 * local_bench: throughput of local transfers through the C API, beside a
 * plain memcpy of the same blocks by the same number of threads in the same
 * run.
 *
 * For each block size (4 KiB, 64 KiB, 1 MiB, 16 MiB) and thread count (1, 2)
 * each thread owns its source and target buffers and loops for --duration
 * seconds: allocate a batch, submit --batch WRITE requests, poll each until
 * complete, free the batch. Request i copies block i of the source ring to
 * block i of the target ring; rings are block x batch bytes, capped at
 * 256 MiB per side per thread (offsets wrap). The memcpy baseline does the
 * same copies with memcpy. Each case is measured --runs times (engine and
 * memcpy alternating) and the medians are printed:
 *
 *   block=1MiB threads=1 engine=9.81 GB/s (9357 req/s) memcpy=10.12 GB/s ratio=0.97
 *
 * GB/s is 1e9 bytes per second. Before timing, one batch per thread is
 * verified byte by byte. Usage:
 *   local_bench [--duration S] [--runs N] [--batch N] [--threads N,..] [--blocks K,..]
 * (--blocks takes sizes in KiB, e.g. --blocks 4,1024).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transfer_engine_c.h"

#define NAME "127.0.0.1:12345"
#define RING_CAP ((size_t)256 << 20)
#define MAX_THREADS 64

static transfer_engine_t engine;
static double duration = 1.0;
static int runs = 5;
static size_t batch = 128;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct worker {
  pthread_t tid;
  size_t block, ring;
  unsigned char *src, *dst;
  int use_engine;
  pthread_barrier_t *start;
  uint64_t requests; /* completed in the timed loop */
  double elapsed;
  int failed;
};

static uint64_t offset_of(const struct worker *w, size_t i) {
  return (uint64_t)((i * w->block) % w->ring);
}

/* One batch through the engine; returns 0 when every task completed. */
static int engine_batch(struct worker *w, struct transfer_request *reqs) {
  batch_id_t b = allocateBatchID(engine, batch);
  if (b == INVALID_BATCH) return -1;
  int rc = submitTransfer(engine, b, reqs, batch);
  for (size_t i = 0; rc == 0 && i < batch; i++) {
    struct transfer_status st;
    do {
      if (getTransferStatus(engine, b, i, &st) != 0) return -1;
    } while (st.status == STATUS_WAITING);
    if (st.status != STATUS_COMPLETED) rc = -1;
  }
  if (freeBatchID(engine, b) != 0) rc = -1;
  (void)w;
  return rc;
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  struct transfer_request *reqs = calloc(batch, sizeof *reqs);
  if (!reqs) {
    w->failed = 1;
    pthread_barrier_wait(w->start);
    return NULL;
  }
  for (size_t i = 0; i < batch; i++)
    reqs[i] = (struct transfer_request){
        .opcode = OPCODE_WRITE, .source = w->src + offset_of(w, i), .target_id = LOCAL_SEGMENT,
        .target_offset = (uint64_t)(uintptr_t)(w->dst + offset_of(w, i)), .length = w->block};
  pthread_barrier_wait(w->start);
  double t0 = now(), t = t0;
  uint64_t n = 0;
  do {
    if (w->use_engine) {
      if (engine_batch(w, reqs) != 0) {
        w->failed = 1;
        break;
      }
    } else {
      for (size_t i = 0; i < batch; i++)
        memcpy(w->dst + offset_of(w, i), w->src + offset_of(w, i), w->block);
      /* Keep the compiler from dropping copies nobody reads. */
      __asm__ __volatile__("" : : "r"(w->dst) : "memory");
    }
    n += batch;
    t = now();
  } while (t - t0 < duration);
  w->requests = n;
  w->elapsed = t - t0;
  free(reqs);
  return NULL;
}

/* Runs one timed pass; returns bytes per second (and requests per second). */
static double run_pass(struct worker *ws, int threads, int use_engine, double *req_per_s) {
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads);
  for (int i = 0; i < threads; i++) {
    ws[i].use_engine = use_engine;
    ws[i].start = &start;
    ws[i].requests = 0;
    ws[i].failed = 0;
    if (pthread_create(&ws[i].tid, NULL, worker_main, &ws[i]) != 0) {
      fprintf(stderr, "pthread_create failed\n");
      exit(1);
    }
  }
  double longest = 0;
  uint64_t total = 0, bytes = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(ws[i].tid, NULL);
    if (ws[i].failed) {
      fprintf(stderr, "a transfer failed during the benchmark\n");
      exit(1);
    }
    if (ws[i].elapsed > longest) longest = ws[i].elapsed;
    total += ws[i].requests;
    bytes += ws[i].requests * ws[i].block;
  }
  pthread_barrier_destroy(&start);
  *req_per_s = (double)total / longest;
  return (double)bytes / longest;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void size_name(size_t b, char *out, size_t len) {
  if (b >= (1u << 20) && b % (1u << 20) == 0)
    snprintf(out, len, "%zuMiB", b >> 20);
  else if (b >= 1024 && b % 1024 == 0)
    snprintf(out, len, "%zuKiB", b >> 10);
  else
    snprintf(out, len, "%zuB", b);
}

/* Checks one engine batch of each worker byte by byte. */
static void verify(struct worker *ws, int threads) {
  for (int t = 0; t < threads; t++) {
    struct worker *w = &ws[t];
    size_t span = w->block * batch < w->ring ? w->block * batch : w->ring;
    for (size_t i = 0; i < span; i++) w->src[i] = (unsigned char)(i * 13 + (size_t)t);
    memset(w->dst, 0, span);
    struct transfer_request *reqs = calloc(batch, sizeof *reqs);
    if (!reqs) exit(1);
    for (size_t i = 0; i < batch; i++)
      reqs[i] = (struct transfer_request){
          .opcode = OPCODE_WRITE, .source = w->src + offset_of(w, i), .target_id = LOCAL_SEGMENT,
          .target_offset = (uint64_t)(uintptr_t)(w->dst + offset_of(w, i)), .length = w->block};
    if (engine_batch(w, reqs) != 0 || memcmp(w->src, w->dst, span) != 0) {
      fprintf(stderr, "verification failed: block %zu thread %d\n", w->block, t);
      exit(1);
    }
    free(reqs);
  }
}

static void run_case(size_t block, int threads) {
  struct worker ws[MAX_THREADS];
  memset(ws, 0, sizeof ws);
  size_t ring = block * batch < RING_CAP ? block * batch : RING_CAP;
  ring -= ring % block;
  for (int t = 0; t < threads; t++) {
    ws[t].block = block;
    ws[t].ring = ring;
    ws[t].src = aligned_alloc(4096, ring);
    ws[t].dst = aligned_alloc(4096, ring);
    if (!ws[t].src || !ws[t].dst) {
      fprintf(stderr, "out of memory for %zu-byte rings\n", ring);
      exit(1);
    }
    memset(ws[t].src, 1, ring); /* fault the pages in before timing */
    memset(ws[t].dst, 2, ring);
    if (registerLocalMemory(engine, ws[t].dst, ring, "cpu:0", 1) != 0 ||
        registerLocalMemory(engine, ws[t].src, ring, "cpu:0", 1) != 0) {
      fprintf(stderr, "registerLocalMemory failed\n");
      exit(1);
    }
  }
  verify(ws, threads);

  double eng[64], eng_req[64], mem[64], mem_req[64];
  for (int r = 0; r < runs; r++) {
    eng[r] = run_pass(ws, threads, 1, &eng_req[r]);
    mem[r] = run_pass(ws, threads, 0, &mem_req[r]);
  }
  double e = median(eng, runs), er = median(eng_req, runs), m = median(mem, runs);
  char name[32];
  size_name(block, name, sizeof name);
  printf("block=%s threads=%d engine=%.2f GB/s (%.0f req/s) memcpy=%.2f GB/s ratio=%.2f\n", name,
         threads, e / 1e9, er, m / 1e9, e / m);
  fflush(stdout);

  for (int t = 0; t < threads; t++) {
    unregisterLocalMemory(engine, ws[t].dst);
    unregisterLocalMemory(engine, ws[t].src);
    free(ws[t].src);
    free(ws[t].dst);
  }
}

/* Parses "a,b,c" into up to `max` sizes, each multiplied by `unit`. */
static int parse_list(const char *s, size_t *out, int max, size_t unit) {
  int n = 0;
  while (*s && n < max) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || v == 0) return -1;
    out[n++] = (size_t)v * unit;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return n;
}

static void usage(void) {
  fprintf(stderr, "usage: local_bench [--duration S] [--runs N] [--batch N] "
                  "[--threads N,..] [--blocks KiB,..]\n");
  exit(2);
}

int main(int argc, char **argv) {
  size_t blocks[16] = {4 << 10, 64 << 10, 1 << 20, 16 << 20}, thread_counts[16] = {1, 2};
  int nblocks = 4, nthreads = 2;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) usage();
    if (!strcmp(a, "--duration")) duration = atof(v);
    else if (!strcmp(a, "--runs")) runs = atoi(v);
    else if (!strcmp(a, "--batch")) batch = (size_t)atol(v);
    else if (!strcmp(a, "--threads")) nthreads = parse_list(v, thread_counts, 16, 1);
    else if (!strcmp(a, "--blocks")) nblocks = parse_list(v, blocks, 16, 1024);
    else usage();
    i++;
  }
  if (duration <= 0 || runs < 1 || runs > 64 || batch < 1 || nblocks < 1 || nthreads < 1) usage();
  for (int i = 0; i < nthreads; i++)
    if (thread_counts[i] > MAX_THREADS) usage();

  engine = createTransferEngine("P2PHANDSHAKE", NAME, "", 0, 0);
  if (!engine || openSegment(engine, NAME) != LOCAL_SEGMENT) {
    fprintf(stderr, "could not create a local engine\n");
    return 1;
  }
  printf("# local transfers, batch %zu, %.1f s per run, median of %d runs; GB = 1e9 bytes\n",
         batch, duration, runs);
  for (int b = 0; b < nblocks; b++)
    for (int t = 0; t < nthreads; t++) run_case(blocks[b], (int)thread_counts[t]);
  destroyTransferEngine(engine);
  return 0;
}
