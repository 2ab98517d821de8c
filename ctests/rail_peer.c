/*
 * rail_peer: a long-lived initiator for the multi-rail tests
 * (ctests/netns_rails.sh). It keeps one engine for the whole run, so a test
 * can break and repair rails under it and check that the same process
 * recovers, and it takes commands, one per line, on stdin:
 *
 *   rail_peer CONN NAME MATRIX SEGMENT BASE SIZE
 *     CONN, NAME   createTransferEngine's metadata connection and local name
 *     MATRIX       priority-matrix JSON for installTransport("tcp"), or "-"
 *     SEGMENT BASE SIZE
 *                  the target's "segment" line: its name, buffer address and
 *                  size. Requests use [BASE, BASE + SIZE) on the target and a
 *                  local buffer of 2 * SIZE registered as "cpu:0".
 *
 * Commands (each answered by one line, flushed):
 *   xfer LEN COUNT   one round: a batch of COUNT WRITEs of LEN bytes (a new
 *                    pattern each round) to consecutive target offsets, then
 *                    a batch of COUNT READs of them into a scrubbed buffer,
 *                    every byte checked. Answers
 *                      xfer ok secs S submit_max M
 *                      xfer FAILED write_failed W read_failed R secs S submit_max M
 *                      xfer CORRUPT task T byte B got X want Y
 *                    S: from the first submit to the last task terminal;
 *                    M: the longest submitTransfer call. A task still not
 *                    terminal after 120 s prints "xfer HUNG ..." and exits 3.
 *   loop SECS LEN COUNT
 *                    xfer rounds until SECS pass or one does not succeed:
 *                      loop ok rounds N bytes B secs S submit_max M
 *                      loop FAILED round N <the xfer answer>
 *   stats            getNicLoadStats: "nic DEV inflight N ewma BPS" per
 *                    device, then "stats end".
 *   write1 LEN SEED  one WRITE of LEN bytes of pattern SEED to BASE:
 *                      write1 COMPLETED secs S | write1 FAILED secs S
 *   verify1 LEN SEED one READ of LEN bytes from BASE, checked against
 *                    pattern SEED:
 *                      verify1 ok | verify1 FAILED |
 *                      verify1 CORRUPT byte B got X want Y
 *   count1 LEN SEED  one READ of LEN bytes from BASE; counts the bytes that
 *                    equal pattern SEED at their position:
 *                      count1 N | count1 FAILED
 *   quit             destroys the engine and exits 0.
 * At start it prints "ready <own name>".
 */
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "te_util.h"

#define HANG_SECS 120.0
#define MAX_TASKS 4096

static transfer_engine_t engine;
static segment_id_t seg;
static uint64_t base, size;
static unsigned char *src, *dst;
static uint64_t round_no;

struct result {
  int write_failed, read_failed, corrupt;
  double secs, submit_max;
  char detail[256];
};

/* Submits `count` requests of `len` bytes and waits for them all; returns
 * the number that FAILED. */
static int run(int opcode, unsigned char *local, uint64_t len, uint64_t count, struct result *r) {
  struct transfer_request reqs[MAX_TASKS];
  for (uint64_t i = 0; i < count; i++)
    reqs[i] = (struct transfer_request){.opcode = opcode,
                                        .source = local + i * len,
                                        .target_id = seg,
                                        .target_offset = base + i * len,
                                        .length = len};
  batch_id_t b = allocateBatchID(engine, count);
  if (b == INVALID_BATCH) {
    printf("xfer ERROR allocateBatchID\n");
    fflush(stdout);
    exit(2);
  }
  double t = te_now();
  int rc = submitTransfer(engine, b, reqs, count);
  double dt = te_now() - t;
  if (dt > r->submit_max) r->submit_max = dt;
  if (rc != 0) {
    freeBatchID(engine, b);
    return (int)count;
  }
  int failed = 0;
  for (uint64_t i = 0; i < count; i++) {
    struct transfer_status st = {0};
    for (unsigned long spins = 0;; spins++) {
      if (getTransferStatus(engine, b, i, &st) != 0) {
        printf("xfer ERROR getTransferStatus task %" PRIu64 "\n", i);
        fflush(stdout);
        exit(2);
      }
      if (st.status == STATUS_COMPLETED || st.status == STATUS_FAILED) break;
      if ((spins & 255) == 255) {
        if (te_now() - t > HANG_SECS) {
          printf("xfer HUNG task %" PRIu64 " status %d after %.0f s\n", i, st.status, HANG_SECS);
          fflush(stdout);
          exit(3);
        }
        usleep(200);
      }
    }
    if (st.status == STATUS_FAILED) failed++;
    else if (st.transferred_bytes != len) {
      snprintf(r->detail, sizeof r->detail, "task %" PRIu64 " COMPLETED with %" PRIu64 " bytes", i,
               (uint64_t)st.transferred_bytes);
      failed++;
    }
  }
  freeBatchID(engine, b);
  return failed;
}

static void xfer(uint64_t len, uint64_t count, struct result *r) {
  memset(r, 0, sizeof *r);
  uint64_t seed = ++round_no * 7919 + 17;
  uint64_t total = len * count;
  for (uint64_t i = 0; i < total; i++) src[i] = te_pattern(seed, (size_t)i);
  memset(dst, 0xA5, total);
  double t0 = te_now();
  r->write_failed = run(OPCODE_WRITE, src, len, count, r);
  if (!r->write_failed) r->read_failed = run(OPCODE_READ, dst, len, count, r);
  r->secs = te_now() - t0;
  if (r->write_failed || r->read_failed) return;
  for (uint64_t i = 0; i < total; i++)
    if (dst[i] != te_pattern(seed, (size_t)i)) {
      r->corrupt = 1;
      snprintf(r->detail, sizeof r->detail, "task %" PRIu64 " byte %" PRIu64 " got %u want %u",
               i / len, i % len, dst[i], te_pattern(seed, (size_t)i));
      return;
    }
}

/* write1, verify1 and count1: one request of `len` bytes at BASE. */
static void one(const char *cmd, uint64_t len, uint64_t seed) {
  struct result r;
  memset(&r, 0, sizeof r);
  if (!strcmp(cmd, "write1")) {
    for (uint64_t i = 0; i < len; i++) src[i] = te_pattern(seed, (size_t)i);
    double t0 = te_now();
    int failed = run(OPCODE_WRITE, src, len, 1, &r);
    printf("write1 %s secs %.3f\n", failed ? "FAILED" : "COMPLETED", te_now() - t0);
    return;
  }
  memset(dst, 0xA5, len);
  if (run(OPCODE_READ, dst, len, 1, &r)) {
    printf("%s FAILED\n", cmd);
    return;
  }
  uint64_t same = 0, first_bad = UINT64_MAX;
  for (uint64_t i = 0; i < len; i++) {
    if (dst[i] == te_pattern(seed, (size_t)i)) same++;
    else if (first_bad == UINT64_MAX) first_bad = i;
  }
  if (!strcmp(cmd, "count1"))
    printf("count1 %" PRIu64 "\n", same);
  else if (first_bad == UINT64_MAX)
    printf("verify1 ok\n");
  else
    printf("verify1 CORRUPT byte %" PRIu64 " got %u want %u\n", first_bad, dst[first_bad],
           te_pattern(seed, (size_t)first_bad));
}

static void format(const struct result *r, char *out, size_t n) {
  if (r->write_failed || r->read_failed)
    snprintf(out, n, "xfer FAILED write_failed %d read_failed %d secs %.3f submit_max %.3f %s",
             r->write_failed, r->read_failed, r->secs, r->submit_max, r->detail);
  else if (r->corrupt)
    snprintf(out, n, "xfer CORRUPT %s", r->detail);
  else
    snprintf(out, n, "xfer ok secs %.3f submit_max %.3f", r->secs, r->submit_max);
}

static int check_args(uint64_t len, uint64_t count) {
  if (len == 0 || count == 0 || count > MAX_TASKS || len * count > size) {
    printf("error: need 0 < COUNT <= %d and 0 < LEN * COUNT <= %" PRIu64 "\n", MAX_TASKS, size);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: rail_peer CONN NAME MATRIX|- SEGMENT BASE SIZE\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  base = strtoull(argv[5], NULL, 0);
  size = strtoull(argv[6], NULL, 0);
  engine = createTransferEngine(argv[1], argv[2], NULL, 0, 0);
  if (!engine) return fprintf(stderr, "createTransferEngine failed\n"), 1;
  char *matrix = strcmp(argv[3], "-") ? argv[3] : NULL;
  if (!installTransport(engine, "tcp", matrix ? (void **)&matrix : NULL))
    return fprintf(stderr, "installTransport(tcp, %s) failed\n", argv[3]), 1;
  void *p = mmap(NULL, 2 * size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return perror("mmap"), 1;
  src = p;
  dst = src + size;
  memset(p, 0, 2 * size);
  if (registerLocalMemory(engine, p, 2 * size, "cpu:0", 1) != 0)
    return fprintf(stderr, "registerLocalMemory failed\n"), 1;
  seg = openSegment(engine, argv[4]);
  if (seg < 0) return fprintf(stderr, "openSegment(%s) failed\n", argv[4]), 1;
  char name[256] = "";
  getLocalIpAndPort(engine, name, sizeof name);
  printf("ready %s\n", name);
  fflush(stdout);

  char line[512];
  while (fgets(line, sizeof line, stdin)) {
    char cmd[32] = "";
    uint64_t a = 0, b = 0, c = 0;
    int n = sscanf(line, "%31s %" SCNu64 " %" SCNu64 " %" SCNu64, cmd, &a, &b, &c);
    if (n < 1) continue;
    struct result r;
    char out[512];
    if (!strcmp(cmd, "quit")) {
      break;
    } else if (!strcmp(cmd, "xfer") && n == 3) {
      if (check_args(a, b) == 0) {
        xfer(a, b, &r);
        format(&r, out, sizeof out);
        printf("%s\n", out);
      }
    } else if (!strcmp(cmd, "loop") && n == 4) {
      if (check_args(b, c) == 0) {
        double t0 = te_now(), submit_max = 0;
        uint64_t rounds = 0;
        int ok = 1;
        while (te_now() - t0 < (double)a) {
          xfer(b, c, &r);
          if (r.submit_max > submit_max) submit_max = r.submit_max;
          rounds++;
          if (r.write_failed || r.read_failed || r.corrupt) {
            format(&r, out, sizeof out);
            printf("loop FAILED round %" PRIu64 " %s\n", rounds, out);
            ok = 0;
            break;
          }
        }
        if (ok)
          printf("loop ok rounds %" PRIu64 " bytes %" PRIu64 " secs %.3f submit_max %.3f\n",
                 rounds, rounds * b * c * 2, te_now() - t0, submit_max);
      }
    } else if ((!strcmp(cmd, "write1") || !strcmp(cmd, "verify1") || !strcmp(cmd, "count1")) &&
               n == 3) {
      if (check_args(a, 1) == 0) one(cmd, a, b);
    } else if (!strcmp(cmd, "stats")) {
      nic_load_stat_t st[64];
      size_t count = 64;
      if (getNicLoadStats(engine, st, &count) != 0) {
        printf("stats ERROR\n");
      } else {
        for (size_t i = 0; i < count && i < 64; i++)
          printf("nic %s inflight %" PRIu64 " ewma %.0f\n", st[i].device_name, st[i].inflight_bytes,
                 st[i].ewma_bandwidth_bps);
        printf("stats end\n");
      }
    } else {
      printf("error: unknown command: %s", line);
    }
    fflush(stdout);
  }
  unregisterLocalMemory(engine, p);
  destroyTransferEngine(engine);
  munmap(p, 2 * size);
  printf("bye\n");
  return 0;
}
