/*
 * te_util.h: small helpers shared by the C tests that move bytes: create a
 * local engine, poll one task to a terminal state, fill and verify patterns.
 */
#ifndef TE_UTIL_H
#define TE_UTIL_H

#include "transfer_engine_c.h"

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* The name every local test engine uses; openSegment(own name) gives 0. */
#define TE_TEST_NAME "127.0.0.1:12345"

static inline double te_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * Polls task `task` until it is COMPLETED or FAILED and returns that status
 * (the batch then counts the task as observed). Returns -1 if
 * getTransferStatus itself fails, and -2 if the task is still not terminal
 * after 60 s, which only a hung engine produces.
 */
static inline int te_wait(transfer_engine_t e, batch_id_t b, size_t task,
                          struct transfer_status *out) {
  struct transfer_status st = {0};
  double deadline = 0;
  for (unsigned long spins = 0;; spins++) {
    int rc = getTransferStatus(e, b, task, &st);
    if (rc != 0) {
      fprintf(stderr, "getTransferStatus(task %zu) returned %d\n", task, rc);
      return -1;
    }
    if (st.status == STATUS_COMPLETED || st.status == STATUS_FAILED) {
      if (out) *out = st;
      return st.status;
    }
    if ((spins & 1023) == 1023) {
      double now = te_now();
      if (deadline == 0) deadline = now + 60;
      if (now > deadline) {
        fprintf(stderr, "task %zu still in status %d after 60 s\n", task, st.status);
        return -2;
      }
      sched_yield();
    }
  }
}

/* A byte pattern that differs per buffer (seed) and per position, with a
 * period (251, prime) that no power-of-two size or offset lines up with. */
static inline unsigned char te_pattern(uint64_t seed, size_t i) {
  return (unsigned char)((i % 251) ^ (seed * 0x9e3779b97f4a7c15ull >> 56) ^ (i >> 12));
}

static inline void te_fill(unsigned char *p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) p[i] = te_pattern(seed, i);
}

/* Returns the index of the first byte that differs from the pattern, or
 * (size_t)-1 when all match. */
static inline size_t te_verify(const unsigned char *p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != te_pattern(seed, i)) return i;
  return (size_t)-1;
}

/* Returns the index of the first byte != v, or (size_t)-1. */
static inline size_t te_verify_byte(const unsigned char *p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v) return i;
  return (size_t)-1;
}

#define TE_ALL_MATCH ((size_t)-1)

#endif /* TE_UTIL_H */
