/*
 * local_transfer: WRITE and READ on the engine's own (LOCAL_SEGMENT) memory
 * move exactly the requested bytes, verified byte by byte:
 *   - sizes 1 B, 4 KiB-1, 64 KiB, 64 KiB+1, 1 MiB+13 and 64 MiB, with source
 *     and target at odd, unaligned offsets, and the bytes just around the
 *     target range left untouched;
 *   - many tasks in one batch, and several submits into one batch;
 *   - 8 threads at once, each with its own buffers and batches.
 */
#include "transfer_engine_c.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "te_check.h"
#include "te_util.h"

#define GUARD 64 /* bytes checked on each side of a target range */

static transfer_engine_t engine;

/* Moves `len` bytes in one request and checks transferred_bytes. */
static int transfer(int opcode, void *local, void *target, size_t len) {
  struct transfer_request r = {.opcode = opcode, .source = local, .target_id = LOCAL_SEGMENT,
                               .target_offset = (uint64_t)(uintptr_t)target, .length = len};
  batch_id_t b = allocateBatchID(engine, 1);
  CHECK(b != INVALID_BATCH);
  CHECK_EQ(submitTransfer(engine, b, &r, 1), 0);
  struct transfer_status st = {0};
  int s = te_wait(engine, b, 0, &st);
  CHECK_EQ(s, STATUS_COMPLETED);
  CHECK_EQ_U64(st.transferred_bytes, len);
  CHECK_EQ(freeBatchID(engine, b), 0);
  return s;
}

/* WRITE local->target then READ target->another local buffer, at odd
 * offsets; `remote` is registered, the local buffers are not. */
static void sizes(void) {
  static const size_t lens[] = {1, 4095, 65536, 65537, (1u << 20) + 13, (size_t)64 << 20};
  const size_t max = (size_t)64 << 20, pad = 4096;
  unsigned char *remote = malloc(max + 2 * pad);
  unsigned char *src = malloc(max + 2 * pad);
  unsigned char *back = malloc(max + 2 * pad);
  REQUIRE(remote && src && back);
  REQUIRE(registerLocalMemory(engine, remote, max + 2 * pad, "cpu:0", 1) == 0);

  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    size_t len = lens[i];
    size_t soff = 1 + 2 * i, toff = pad - 3 - 5 * i; /* odd, different alignments */
    fprintf(stderr, "-- %zu bytes, source offset %zu, target offset %zu\n", len, soff, toff);
    memset(remote, 0xEE, max + 2 * pad);
    te_fill(src + soff, len, 100 + i);

    transfer(OPCODE_WRITE, src + soff, remote + toff, len);
    CHECK_EQ(te_verify(remote + toff, len, 100 + i), TE_ALL_MATCH);
    CHECK_EQ(te_verify_byte(remote + toff - GUARD, GUARD, 0xEE), TE_ALL_MATCH);
    CHECK_EQ(te_verify_byte(remote + toff + len, GUARD, 0xEE), TE_ALL_MATCH);

    memset(back, 0x11, len + 2 * GUARD);
    transfer(OPCODE_READ, back + GUARD + 1, remote + toff, len);
    CHECK_EQ(te_verify(back + GUARD + 1, len, 100 + i), TE_ALL_MATCH);
    CHECK_EQ(te_verify_byte(back, GUARD + 1, 0x11), TE_ALL_MATCH);
    CHECK_EQ(te_verify_byte(back + GUARD + 1 + len, GUARD - 1, 0x11), TE_ALL_MATCH);
  }
  CHECK_EQ(unregisterLocalMemory(engine, remote), 0);
  free(remote);
  free(src);
  free(back);
}

/* 256 tasks in one batch, then the same batch filled by 4 submits of 64:
 * each task writes its own block, of its own size, to its own place. */
static void many_tasks(void) {
  enum { TASKS = 256, BLOCK = 9000 };
  unsigned char *remote = malloc((size_t)TASKS * BLOCK);
  unsigned char *src = malloc((size_t)TASKS * BLOCK);
  REQUIRE(remote && src);
  REQUIRE(registerLocalMemory(engine, remote, (size_t)TASKS * BLOCK, "cpu:0", 1) == 0);
  struct transfer_request reqs[TASKS];

  for (int round = 0; round < 2; round++) {
    fprintf(stderr, "-- %d tasks in one batch, %s\n", TASKS,
            round ? "4 submits of 64" : "one submit");
    memset(remote, 0, (size_t)TASKS * BLOCK);
    for (int t = 0; t < TASKS; t++) {
      size_t len = BLOCK - (size_t)(t % 7) * 3; /* differing lengths */
      te_fill(src + (size_t)t * BLOCK, BLOCK, (uint64_t)(round * TASKS + t));
      reqs[t] = (struct transfer_request){
          .opcode = OPCODE_WRITE, .source = src + (size_t)t * BLOCK, .target_id = LOCAL_SEGMENT,
          .target_offset = (uint64_t)(uintptr_t)(remote + (size_t)((t * 37) % TASKS) * BLOCK),
          .length = len};
    }
    batch_id_t b = allocateBatchID(engine, TASKS);
    REQUIRE(b != INVALID_BATCH);
    if (round == 0) {
      CHECK_EQ(submitTransfer(engine, b, reqs, TASKS), 0);
    } else {
      for (int k = 0; k < 4; k++) CHECK_EQ(submitTransfer(engine, b, reqs + 64 * k, 64), 0);
      CHECK_EQ(submitTransfer(engine, b, reqs, 1), 2); /* full */
    }
    for (int t = 0; t < TASKS; t++) {
      struct transfer_status st = {0};
      CHECK_EQ(te_wait(engine, b, (size_t)t, &st), STATUS_COMPLETED);
      CHECK_EQ_U64(st.transferred_bytes, reqs[t].length);
    }
    CHECK_EQ(freeBatchID(engine, b), 0);
    for (int t = 0; t < TASKS; t++) {
      unsigned char *dst = remote + (size_t)((t * 37) % TASKS) * BLOCK;
      size_t len = reqs[t].length;
      CHECK_EQ(te_verify(dst, len, (uint64_t)(round * TASKS + t)), TE_ALL_MATCH);
      CHECK_EQ(te_verify_byte(dst + len, BLOCK - len, 0), TE_ALL_MATCH);
    }
  }
  CHECK_EQ(unregisterLocalMemory(engine, remote), 0);
  free(remote);
  free(src);
}

/* Threads: each registers its own target, and runs batches of 16 WRITEs
 * of mixed sizes followed by a READ back of the same ranges. */
enum { THREADS = 8, ROUNDS = 6, PER_BATCH = 16, TBLOCK = 70000 };

struct worker {
  int id;
  int failures;
};

static void *worker_main(void *arg) {
  struct worker *w = arg;
  const size_t region = (size_t)PER_BATCH * TBLOCK;
  unsigned char *remote = malloc(region), *src = malloc(region), *back = malloc(region);
  if (!remote || !src || !back || registerLocalMemory(engine, remote, region, "cpu:0", 1) != 0) {
    w->failures++;
    return NULL;
  }
  for (int round = 0; round < ROUNDS && !w->failures; round++) {
    for (int op = 0; op < 2; op++) {
      struct transfer_request reqs[PER_BATCH];
      uint64_t seed = (uint64_t)(w->id * 1000 + round * PER_BATCH);
      size_t len = (size_t)TBLOCK - (size_t)(round * 4099 + w->id);
      if (op == 0) {
        for (int t = 0; t < PER_BATCH; t++) te_fill(src + (size_t)t * TBLOCK, len, seed + (uint64_t)t);
        memset(remote, 0, region);
      } else {
        memset(back, 0, region);
      }
      for (int t = 0; t < PER_BATCH; t++)
        reqs[t] = (struct transfer_request){
            .opcode = op ? OPCODE_READ : OPCODE_WRITE,
            .source = (op ? back : src) + (size_t)t * TBLOCK,
            .target_id = LOCAL_SEGMENT,
            .target_offset = (uint64_t)(uintptr_t)(remote + (size_t)t * TBLOCK),
            .length = len};
      batch_id_t b = allocateBatchID(engine, PER_BATCH);
      if (b == INVALID_BATCH || submitTransfer(engine, b, reqs, PER_BATCH) != 0) {
        w->failures++;
        break;
      }
      for (int t = 0; t < PER_BATCH; t++) {
        struct transfer_status st = {0};
        if (te_wait(engine, b, (size_t)t, &st) != STATUS_COMPLETED || st.transferred_bytes != len)
          w->failures++;
      }
      if (freeBatchID(engine, b) != 0) w->failures++;
      unsigned char *check = op ? back : remote;
      for (int t = 0; t < PER_BATCH; t++) {
        size_t bad = te_verify(check + (size_t)t * TBLOCK, len, seed + (uint64_t)t);
        if (bad != TE_ALL_MATCH) {
          fprintf(stderr, "thread %d round %d %s task %d: byte %zu differs\n", w->id, round,
                  op ? "READ" : "WRITE", t, bad);
          w->failures++;
        }
      }
    }
  }
  if (unregisterLocalMemory(engine, remote) != 0) w->failures++;
  free(remote);
  free(src);
  free(back);
  return NULL;
}

static void threads(void) {
  fprintf(stderr, "-- %d threads, each with its own batches\n", THREADS);
  pthread_t tid[THREADS];
  struct worker w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (struct worker){.id = i, .failures = 0};
    REQUIRE(pthread_create(&tid[i], NULL, worker_main, &w[i]) == 0);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(tid[i], NULL);
    CHECK_EQ(w[i].failures, 0);
  }
}

int main(void) {
  engine = createTransferEngine("P2PHANDSHAKE", TE_TEST_NAME, "", 0, 0);
  REQUIRE(engine != NULL);
  REQUIRE(openSegment(engine, TE_TEST_NAME) == LOCAL_SEGMENT);
  sizes();
  many_tasks();
  threads();
  destroyTransferEngine(engine);
  return te_check_exit("local_transfer");
}
