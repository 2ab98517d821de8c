/*
 * cancel_bench: how long te_cancel_batch takes against a running peer.
 *
 * Against a transfer_bench target (transfer_bench --mode target
 * --buffer_size BYTES), each round submits one --size request (READ or
 * WRITE) from a registered buffer, waits a random time within what a
 * whole transfer took (measured first), cancels the batch with a bound
 * of 10 s, and records how long the cancel took. Then it checks that the
 * task ended (CANCELED, or COMPLETED when every byte had moved already),
 * that the cancel said TE_CANCEL_DONE, and that freeBatchID succeeds.
 * Prints one line per operation:
 *
 *   cancel write over tcp: 50 rounds (41 cut mid-transfer), whole 25.1 ms,
 *   cancel p50 0.42 ms p99 2.10 ms max 2.60 ms
 *
 * Usage: cancel_bench --segment_id NAME [--protocol tcp|shm (tcp)]
 *            [--size BYTES (64 MiB)] [--rounds N (50)] [--operation read|write|both]
 * The target's buffer must be at least --size bytes; the initiator's
 * engine is named 127.0.0.1 on the P2P handshake.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transfer_engine_c.h"
#include "transfer_engine_ext.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(double ms) {
  struct timespec ts = {(time_t)(ms / 1e3), (long)((ms - (time_t)(ms / 1e3) * 1e3) * 1e6)};
  nanosleep(&ts, NULL);
}

static const char *last_error(void) {
  static char buf[512];
  te_last_error(buf, sizeof buf);
  return buf;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Submits one request as a batch of one; the batch id, or 0. */
static uint64_t submit(transfer_engine_t e, int op, void *src, segment_id_t seg, uint64_t base,
                       uint64_t size) {
  batch_id_t b = allocateBatchID(e, 1);
  struct transfer_request r = {op, src, seg, base, size};
  if (b == INVALID_BATCH || submitTransfer(e, b, &r, 1) != 0) {
    fprintf(stderr, "cancel_bench: submit failed: %s\n", last_error());
    exit(1);
  }
  return b;
}

static int run(transfer_engine_t e, int op, const char *name, const char *protocol, void *buf,
               segment_id_t seg, uint64_t base, uint64_t size, int rounds) {
  /* One whole transfer sets the range of the delays. */
  double t0 = now_ms();
  batch_id_t b = submit(e, op, buf, seg, base, size);
  if (te_wait_batch(e, b, 60000) != TE_WAIT_COMPLETED) {
    fprintf(stderr, "cancel_bench: the whole %s did not complete: %s\n", name, last_error());
    return 1;
  }
  double whole = now_ms() - t0;
  freeBatchID(e, b);
  double *lat = calloc((size_t)rounds, sizeof *lat);
  int cut = 0;
  srand(12345);
  for (int i = 0; i < rounds; i++) {
    b = submit(e, op, buf, seg, base, size);
    sleep_ms(whole * (rand() % 1000) / 1000.0);
    double t = now_ms();
    int rc = te_cancel_batch(e, b, 10000);
    lat[i] = now_ms() - t;
    struct transfer_status s;
    if (rc != TE_CANCEL_DONE || getTransferStatus(e, b, 0, &s) != 0 ||
        (s.status != STATUS_CANCELED && s.status != STATUS_COMPLETED)) {
      fprintf(stderr, "cancel_bench: round %d: cancel %d, status %d: %s\n", i, rc, s.status,
              last_error());
      return 1;
    }
    cut += s.status == STATUS_CANCELED;
    if (freeBatchID(e, b) != 0) {
      fprintf(stderr, "cancel_bench: freeBatchID after DONE failed: %s\n", last_error());
      return 1;
    }
  }
  qsort(lat, (size_t)rounds, sizeof *lat, cmp_double);
  int p99 = rounds * 99 / 100;
  printf("cancel %s over %s: %d rounds (%d cut mid-transfer), whole %.1f ms, cancel p50 %.2f ms "
         "p99 %.2f ms max %.2f ms\n",
         name, protocol, rounds, cut, whole, lat[rounds / 2], lat[p99 < rounds ? p99 : rounds - 1],
         lat[rounds - 1]);
  free(lat);
  return 0;
}

int main(int argc, char **argv) {
  const char *segment = NULL, *protocol = "tcp", *operation = "both";
  uint64_t size = 64ull << 20;
  int rounds = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--segment_id"))
      segment = argv[i + 1];
    else if (!strcmp(argv[i], "--protocol"))
      protocol = argv[i + 1];
    else if (!strcmp(argv[i], "--size"))
      size = strtoull(argv[i + 1], NULL, 0);
    else if (!strcmp(argv[i], "--rounds"))
      rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--operation"))
      operation = argv[i + 1];
    else {
      fprintf(stderr, "cancel_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (!segment || rounds < 1 || size == 0) {
    fprintf(stderr, "usage: cancel_bench --segment_id NAME [--protocol tcp|shm] [--size BYTES] "
                    "[--rounds N] [--operation read|write|both]\n");
    return 2;
  }
  transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0);
  if (!e || !installTransport(e, "tcp", NULL) ||
      (!strcmp(protocol, "shm") && !installTransport(e, "shm", NULL))) {
    fprintf(stderr, "cancel_bench: engine setup failed: %s\n", last_error());
    return 1;
  }
  void *buf = !strcmp(protocol, "shm") ? te_allocate_buffer(e, size) : malloc(size);
  if (!buf || registerLocalMemory(e, buf, size, "cpu:0", 1) != 0) {
    fprintf(stderr, "cancel_bench: buffer setup failed: %s\n", last_error());
    return 1;
  }
  memset(buf, 0x5a, size);
  segment_id_t seg = openSegment(e, segment);
  struct te_buffer_info first;
  size_t count = 0;
  if (seg < 0 || te_segment_buffers(e, seg, &first, 1, &count) != 0 || count == 0 ||
      first.length < size) {
    fprintf(stderr, "cancel_bench: the target %s has no buffer of %llu bytes: %s\n", segment,
            (unsigned long long)size, last_error());
    return 1;
  }
  int rc = 0;
  if (strcmp(operation, "read"))
    rc |= run(e, OPCODE_WRITE, "write", protocol, buf, seg, first.addr, size, rounds);
  if (strcmp(operation, "write"))
    rc |= run(e, OPCODE_READ, "read", protocol, buf, seg, first.addr, size, rounds);
  unregisterLocalMemory(e, buf);
  destroyTransferEngine(e);
  return rc;
}
