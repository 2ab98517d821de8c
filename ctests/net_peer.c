/*
 * net_peer: the two processes of the networked C tests, one program with
 * three modes. The shell drivers (run_two_process.sh, kill_target.sh,
 * netns_two_hosts.sh) start them and read their output.
 *
 *   The transport is TCP, or $TE_PROTOCOL (rdma) on the devices of
 *   $TE_DEVICES (a comma list).
 *
 *   net_peer target CONN NAME SIZE
 *     Creates an engine, installs the transport, registers SIZE bytes filled with the
 *     pattern TARGET_SEED (byte k = te_pattern-like(TARGET_SEED, k)), prints
 *       segment <name> base <address> size <bytes>
 *     and serves until SIGINT/SIGTERM (then exits 0). Every notification it
 *     receives is printed as "notify name=<name> msg=<msg>". A notification
 *     "check <offset> <length> <seed>" makes it verify its own memory at
 *     [offset, offset+length) against the pattern <seed> (index from 0) and
 *     print "check ok <offset> <length>" or "check FAILED ...": the target's
 *     own, independent proof that a WRITE landed.
 *
 *   net_peer initiator CONN NAME SEGMENT BASE SIZE
 *     Against a target: byte-verified READ and WRITE of 1 B .. 64 MiB at odd
 *     offsets on both sides, 8 threads at once on their own regions,
 *     notifications (genNotifyInEngine and submitTransferWithNotify), and bad
 *     requests (outside the target buffer -> FAILED, unknown segment -> 1).
 *     Prints "expect: <line>" for each line the target must print, and exits
 *     0 when every check passed.
 *
 *   net_peer reconnect CONN NAME FILE1 FILE2
 *     Reads a target's "segment" line from FILE1 (waits for it), transfers in
 *     a loop until a task FAILS (the driver kills the target), checks every
 *     task of that batch becomes terminal and a new transfer to the dead peer
 *     fails too, prints "phase1 done ...", then reads a new target from FILE2
 *     and does byte-verified WRITE and READ with it in the same process.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "te_check.h"
#include "te_util.h"

#define TARGET_SEED 0x7a11ull
#define MiB ((uint64_t)1 << 20)
/* Layout of the target buffer used by the initiator. */
#define SEQ_REGION (80 * MiB)    /* the size cases, then SCRATCH */
#define SCRATCH (72 * MiB)       /* notifications and bad inputs write here */
#define THREADS 8
#define THREAD_REGION (4 * MiB) /* per thread, after SEQ_REGION */
#define MIN_TARGET_SIZE (SEQ_REGION + THREADS * THREAD_REGION)

static volatile sig_atomic_t stop_signal;
static void on_signal(int sig) { stop_signal = sig; }

/* Byte `i` of pattern `seed`, where i counts from an arbitrary origin (so a
 * region can be checked against the pattern of the buffer that holds it). */
static inline unsigned char pat(uint64_t seed, uint64_t i) { return te_pattern(seed, (size_t)i); }

static void fill_at(unsigned char *p, uint64_t n, uint64_t seed, uint64_t origin) {
  for (uint64_t i = 0; i < n; i++) p[i] = pat(seed, origin + i);
}

/* Index of the first byte of p[0..n) that is not pattern(seed, origin+i), or -1. */
static int64_t first_bad(const unsigned char *p, uint64_t n, uint64_t seed, uint64_t origin) {
  for (uint64_t i = 0; i < n; i++)
    if (p[i] != pat(seed, origin + i)) return (int64_t)i;
  return -1;
}

static unsigned char *map_buffer(uint64_t size) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  return p;
}

/* The transport: $TE_PROTOCOL (tcp by default) on the devices of
 * $TE_DEVICES (a comma list, as the matrix {"cpu:0": [[...], []]}; unset:
 * the engine's own choice). */
static void *install(transfer_engine_t e) {
  const char *proto = getenv("TE_PROTOCOL");
  const char *devs = getenv("TE_DEVICES");
  if (!proto || !*proto) proto = "tcp";
  if (!devs || !*devs) return installTransport(e, proto, NULL);
  char matrix[1024];
  size_t n = (size_t)snprintf(matrix, sizeof matrix, "{\"cpu:0\": [[\"");
  for (const char *p = devs; *p && n + 8 < sizeof matrix; p++)
    n += (size_t)snprintf(matrix + n, sizeof matrix - n, *p == ',' ? "\",\"" : "%c", *p);
  snprintf(matrix + n, sizeof matrix - n, "\"], []]}");
  char *args[] = {matrix, NULL};
  return installTransport(e, proto, (void **)args);
}

static transfer_engine_t make_engine(const char *conn, const char *name, char *out, size_t len) {
  transfer_engine_t e = createTransferEngine(conn, name, NULL, 0, 0);
  if (!e) fprintf(stderr, "createTransferEngine(%s, %s) returned NULL\n", conn, name);
  REQUIRE(e != NULL);
  REQUIRE(install(e) != NULL);
  if (!strcmp(conn, "P2PHANDSHAKE")) REQUIRE(getLocalIpAndPort(e, out, len) == 0);
  else snprintf(out, len, "%s", name);
  return e;
}

/* ------------------------------------------------------------- target */

static int target_main(const char *conn, const char *name, uint64_t size) {
  char seg[256];
  transfer_engine_t e = make_engine(conn, name, seg, sizeof seg);
  unsigned char *buf = map_buffer(size);
  fill_at(buf, size, TARGET_SEED, 0);
  REQUIRE(registerLocalMemory(e, buf, size, "cpu:0", 1) == 0);
  printf("segment %s base %" PRIu64 " size %" PRIu64 "\n", seg, (uint64_t)(uintptr_t)buf, size);
  fflush(stdout);
  while (!stop_signal) {
    int n = 0;
    notify_msg_t *m = getNotifsFromEngine(e, &n);
    for (int i = 0; m && i < n; i++) {
      uint64_t off, len, seed;
      printf("notify name=%s msg=%s\n", m[i].name, m[i].msg);
      if (sscanf(m[i].msg, "check %" SCNu64 " %" SCNu64 " %" SCNu64, &off, &len, &seed) == 3) {
        if (off > size || len > size - off) {
          printf("check FAILED %" PRIu64 " %" PRIu64 ": outside the buffer\n", off, len);
        } else {
          int64_t bad = first_bad(buf + off, len, seed, 0);
          if (bad < 0) printf("check ok %" PRIu64 " %" PRIu64 "\n", off, len);
          else
            printf("check FAILED %" PRIu64 " %" PRIu64 ": byte %" PRId64 " is %u, want %u\n",
                   off, len, bad, buf[off + (uint64_t)bad], pat(seed, (uint64_t)bad));
        }
      }
    }
    fflush(stdout);
    if (m) freeNotifsMsgBuf(m, n);
    usleep(20 * 1000);
  }
  REQUIRE(unregisterLocalMemory(e, buf) == 0);
  destroyTransferEngine(e);
  munmap(buf, size);
  printf("target: stopped by signal %d\n", (int)stop_signal);
  return 0;
}

/* ---------------------------------------------------------- initiator */

struct peer {
  transfer_engine_t e;
  segment_id_t seg;
  uint64_t base, size;
};

/* Submits `n` requests as one batch and waits for each; returns the number
 * of tasks that did not complete (COMPLETED with the full length). */
static int transfer(const struct peer *p, struct transfer_request *r, size_t n, int want_status) {
  batch_id_t b = allocateBatchID(p->e, n);
  CHECK(b != INVALID_BATCH);
  if (b == INVALID_BATCH) return (int)n;
  int rc = submitTransfer(p->e, b, r, n);
  CHECK_EQ(rc, 0);
  int bad = 0;
  if (rc == 0)
    for (size_t i = 0; i < n; i++) {
      struct transfer_status st = {0};
      int s = te_wait(p->e, b, i, &st);
      if (s != want_status) {
        fprintf(stderr, "task %zu (op %d, offset %#" PRIx64 ", %" PRIu64 " bytes): status %d, "
                "want %d\n", i, r[i].opcode, r[i].target_offset, r[i].length, s, want_status);
        bad++;
      } else if (s == STATUS_COMPLETED && st.transferred_bytes != r[i].length) {
        fprintf(stderr, "task %zu: transferred_bytes %" PRIu64 ", want %" PRIu64 "\n", i,
                st.transferred_bytes, r[i].length);
        bad++;
      }
    }
  CHECK_EQ(freeBatchID(p->e, b), 0);
  CHECK_EQ(bad, 0);
  return bad;
}

static struct transfer_request req(const struct peer *p, int op, void *src, uint64_t toff,
                                   uint64_t len) {
  return (struct transfer_request){
      .opcode = op, .source = src, .target_id = p->seg, .target_offset = p->base + toff, .length = len};
}

static int expected_checks;

/* Asks the target to verify [toff, toff+len) against pattern seed. */
static void remote_check(const struct peer *p, uint64_t toff, uint64_t len, uint64_t seed) {
  char msg[128];
  snprintf(msg, sizeof msg, "check %" PRIu64 " %" PRIu64 " %" PRIu64, toff, len, seed);
  notify_msg_t n = {.name = "net_peer", .msg = msg};
  int rc = genNotifyInEngine(p->e, (uint64_t)p->seg, n);
  CHECK_EQ(rc, 0);
  if (rc == 0) {
    printf("expect: check ok %" PRIu64 " %" PRIu64 "\n", toff, len);
    expected_checks++;
  }
}

/* Guard bytes around a local region must survive a READ into it. */
#define GUARD 0xC3

/*
 * One size case: READ the target's initial pattern, WRITE a new pattern,
 * READ it back elsewhere, and ask the target to check it. Local offsets
 * `loff` and target offsets `toff` are odd.
 */
static void size_case(const struct peer *p, unsigned char *local, uint64_t toff, uint64_t loff,
                      uint64_t len, uint64_t seed) {
  struct transfer_request r;
  unsigned char *dst = local + loff;
  /* 1. READ what the target was started with. */
  memset(dst - 1, GUARD, len + 2);
  r = req(p, OPCODE_READ, dst, toff, len);
  if (transfer(p, &r, 1, STATUS_COMPLETED) == 0) {
    int64_t bad = first_bad(dst, len, TARGET_SEED, toff);
    if (bad >= 0)
      fprintf(stderr, "READ %" PRIu64 " bytes at +%" PRIu64 ": byte %" PRId64 " differs\n", len,
              toff, bad);
    CHECK(bad < 0);
  }
  CHECK_EQ(dst[-1], GUARD);
  CHECK_EQ(dst[len], GUARD);

  /* 2. WRITE a new pattern from an odd local offset. */
  fill_at(dst, len, seed, 0);
  r = req(p, OPCODE_WRITE, dst, toff, len);
  int wrote = transfer(p, &r, 1, STATUS_COMPLETED) == 0;

  /* 3. READ it back into another odd local offset. */
  unsigned char *back = local + loff + len + 4099;
  memset(back - 1, GUARD, len + 2);
  r = req(p, OPCODE_READ, back, toff, len);
  if (transfer(p, &r, 1, STATUS_COMPLETED) == 0) {
    int64_t bad = first_bad(back, len, seed, 0);
    if (bad >= 0)
      fprintf(stderr, "read-back of %" PRIu64 " bytes at +%" PRIu64 ": byte %" PRId64 " differs\n",
              len, toff, bad);
    CHECK(bad < 0);
  }
  CHECK_EQ(back[-1], GUARD);
  CHECK_EQ(back[len], GUARD);
  /* 4. The target checks its own memory. */
  if (wrote) remote_check(p, toff, len, seed);
  printf("size %" PRIu64 " at target +%" PRIu64 " local +%" PRIu64 ": done\n", len, toff, loff);
  fflush(stdout);
}

struct thread_arg {
  const struct peer *p;
  unsigned char *local; /* this thread's local region, THREAD_REGION bytes */
  uint64_t toff;        /* this thread's target region */
  int index, failures;
};

/* Each thread: a few rounds of a 3-request WRITE batch, then a 3-request
 * READ batch into other memory, verified byte by byte. */
static void *thread_main(void *argp) {
  struct thread_arg *a = argp;
  const uint64_t lens[3] = {MiB + 3 + (uint64_t)a->index * 4097, 65537, 333};
  for (int round = 0; round < 4; round++) {
    uint64_t seed = 1000 + (uint64_t)a->index * 16 + (uint64_t)round;
    struct transfer_request w[3], r[3];
    uint64_t lo = 1, to = 1 + (uint64_t)a->index; /* odd-ish offsets */
    unsigned char *readback = a->local + THREAD_REGION / 2;
    memset(readback, 0, THREAD_REGION / 2);
    for (int k = 0; k < 3; k++) {
      fill_at(a->local + lo, lens[k], seed + (uint64_t)k, 0);
      w[k] = req(a->p, OPCODE_WRITE, a->local + lo, a->toff + to, lens[k]);
      r[k] = req(a->p, OPCODE_READ, readback + lo, a->toff + to, lens[k]);
      lo += lens[k] + 7;
      to += lens[k] + 11;
    }
    if (transfer(a->p, w, 3, STATUS_COMPLETED) || transfer(a->p, r, 3, STATUS_COMPLETED)) {
      a->failures++;
      continue;
    }
    lo = 1;
    for (int k = 0; k < 3; k++) {
      int64_t bad = first_bad(readback + lo, lens[k], seed + (uint64_t)k, 0);
      if (bad >= 0) {
        fprintf(stderr, "thread %d round %d request %d: byte %" PRId64 " differs\n", a->index,
                round, k, bad);
        a->failures++;
      }
      lo += lens[k] + 7;
    }
  }
  return NULL;
}

static void notifications(const struct peer *p, unsigned char *local) {
  char gen[64], sub[64];
  snprintf(gen, sizeof gen, "gen-hello-%d", (int)getpid());
  snprintf(sub, sizeof sub, "submit-hello-%d", (int)getpid());

  notify_msg_t n = {.name = "net_peer_gen", .msg = gen};
  int rc = genNotifyInEngine(p->e, (uint64_t)p->seg, n);
  CHECK_EQ(rc, 0);
  if (rc == 0) printf("expect: notify name=net_peer_gen msg=%s\n", gen);

  /* The notify goes once the whole batch is seen COMPLETED. */
  fill_at(local + 1, 4096, 77, 0);
  struct transfer_request r[2] = {req(p, OPCODE_WRITE, local + 1, SCRATCH + 1, 4096),
                                  req(p, OPCODE_WRITE, local + 1, SCRATCH + 8193, 4096)};
  batch_id_t b = allocateBatchID(p->e, 2);
  REQUIRE(b != INVALID_BATCH);
  notify_msg_t sn = {.name = "net_peer_submit", .msg = sub};
  rc = submitTransferWithNotify(p->e, b, r, 2, sn);
  CHECK_EQ(rc, 0);
  if (rc == 0) {
    CHECK_EQ(te_wait(p->e, b, 0, NULL), STATUS_COMPLETED);
    CHECK_EQ(te_wait(p->e, b, 1, NULL), STATUS_COMPLETED);
    printf("expect: notify name=net_peer_submit msg=%s\n", sub);
  }
  CHECK_EQ(freeBatchID(p->e, b), 0);
  remote_check(p, SCRATCH + 1, 4096, 77);
  remote_check(p, SCRATCH + 8193, 4096, 77);
}

static void bad_inputs(const struct peer *p, unsigned char *local) {
  struct transfer_request r;
  /* Just past the end of the target buffer. */
  r = req(p, OPCODE_WRITE, local, p->size, 16);
  CHECK_EQ(transfer(p, &r, 1, STATUS_FAILED), 0);
  /* Spanning the end. */
  r = req(p, OPCODE_READ, local, p->size - 8, 16);
  CHECK_EQ(transfer(p, &r, 1, STATUS_FAILED), 0);
  /* Before the start. */
  r = req(p, OPCODE_READ, local, 0, 16);
  r.target_offset = p->base - 4096;
  CHECK_EQ(transfer(p, &r, 1, STATUS_FAILED), 0);
  /* An address range that wraps around 2^64. */
  r = req(p, OPCODE_WRITE, local, 0, 4096);
  r.target_offset = UINT64_MAX - 7;
  CHECK_EQ(transfer(p, &r, 1, STATUS_FAILED), 0);
  /* A bad request in a batch fails alone. */
  struct transfer_request mix[2] = {req(p, OPCODE_READ, local, 0, 4096),
                                    req(p, OPCODE_READ, local + 8192, p->size, 4096)};
  batch_id_t b = allocateBatchID(p->e, 2);
  REQUIRE(b != INVALID_BATCH);
  CHECK_EQ(submitTransfer(p->e, b, mix, 2), 0);
  CHECK_EQ(te_wait(p->e, b, 0, NULL), STATUS_COMPLETED);
  CHECK_EQ(te_wait(p->e, b, 1, NULL), STATUS_FAILED);
  CHECK_EQ(freeBatchID(p->e, b), 0);

  /* A segment id that was never opened: submit says 1, nothing is queued. */
  b = allocateBatchID(p->e, 1);
  REQUIRE(b != INVALID_BATCH);
  r = req(p, OPCODE_WRITE, local, 0, 16);
  r.target_id = 4242;
  CHECK_EQ(submitTransfer(p->e, b, &r, 1), 1);
  r.target_id = -5;
  CHECK_EQ(submitTransfer(p->e, b, &r, 1), 1);
  struct transfer_status st;
  CHECK(getTransferStatus(p->e, b, 0, &st) != 0); /* no task was created */
  CHECK_EQ(freeBatchID(p->e, b), 0);
  /* A segment name nobody serves. */
  CHECK(openSegment(p->e, "127.0.0.1:1") < 0);

  /* The peer still serves good requests after all that. */
  fill_at(local + 5, 100000, 99, 0);
  r = req(p, OPCODE_WRITE, local + 5, SCRATCH + 65537, 100000);
  CHECK_EQ(transfer(p, &r, 1, STATUS_COMPLETED), 0);
  memset(local + 200001, 0, 100000);
  r = req(p, OPCODE_READ, local + 200001, SCRATCH + 65537, 100000);
  CHECK_EQ(transfer(p, &r, 1, STATUS_COMPLETED), 0);
  CHECK(first_bad(local + 200001, 100000, 99, 0) < 0);
  printf("bad inputs: done\n");
}

static int initiator_main(const char *conn, const char *name, const char *segname, uint64_t base,
                          uint64_t size) {
  REQUIRE(size >= MIN_TARGET_SIZE);
  char me[256];
  struct peer p = {.base = base, .size = size};
  p.e = make_engine(conn, name, me, sizeof me);
  uint64_t lsize = 2 * SEQ_REGION + THREADS * THREAD_REGION;
  unsigned char *local = map_buffer(lsize);
  REQUIRE(registerLocalMemory(p.e, local, lsize, "cpu:0", 1) == 0);
  p.seg = openSegment(p.e, segname);
  if (p.seg < 0) fprintf(stderr, "openSegment(%s) = %d\n", segname, p.seg);
  REQUIRE(p.seg >= 0);
  CHECK(p.seg != LOCAL_SEGMENT);
  CHECK_EQ(openSegment(p.e, segname), p.seg); /* cached: same id */
  printf("initiator %s: segment %s is id %d\n", me, segname, p.seg);

  /* Sizes 1 B .. 64 MiB at odd offsets on both sides. */
  const uint64_t sizes[] = {1, 4095, 65537, MiB + 13, 64 * MiB};
  uint64_t toff = 1, loff = 3;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    REQUIRE(toff + sizes[i] <= SCRATCH);
    size_case(&p, local, toff, loff, sizes[i], 500 + i);
    toff += sizes[i] + 4096 + 2;
    toff |= 1;
  }

  /* 8 threads at once, each on its own region on both sides. */
  pthread_t tids[THREADS];
  struct thread_arg args[THREADS];
  for (int t = 0; t < THREADS; t++) {
    args[t] = (struct thread_arg){.p = &p,
                                  .local = local + 2 * SEQ_REGION + (uint64_t)t * THREAD_REGION,
                                  .toff = SEQ_REGION + (uint64_t)t * THREAD_REGION,
                                  .index = t};
    REQUIRE(pthread_create(&tids[t], NULL, thread_main, &args[t]) == 0);
  }
  for (int t = 0; t < THREADS; t++) {
    pthread_join(tids[t], NULL);
    CHECK_EQ(args[t].failures, 0);
  }
  printf("threads: done\n");

  notifications(&p, local);
  bad_inputs(&p, local);

  printf("expected checks: %d\n", expected_checks);
  CHECK_EQ(unregisterLocalMemory(p.e, local), 0);
  destroyTransferEngine(p.e);
  munmap(local, lsize);
  fflush(stdout);
  return te_check_exit("net_peer initiator");
}

/* ---------------------------------------------------------- reconnect */

/* Waits up to `secs` for `path` to hold a "segment" line. */
static int read_segment_file(const char *path, double secs, char *name, size_t len, uint64_t *base,
                             uint64_t *size) {
  double end = te_now() + secs;
  char fmt[64];
  snprintf(fmt, sizeof fmt, "segment %%%zus base %%" SCNu64 " size %%" SCNu64, len - 1);
  while (te_now() < end && !stop_signal) {
    FILE *f = fopen(path, "r");
    if (f) {
      int n = fscanf(f, fmt, name, base, size);
      fclose(f);
      if (n == 3) return 0;
    }
    usleep(50 * 1000);
  }
  fprintf(stderr, "no segment line in %s after %.0f s\n", path, secs);
  return -1;
}

static int reconnect_main(const char *conn, const char *name, const char *file1, const char *file2) {
  char me[256], seg1[256], seg2[256];
  uint64_t base1, size1, base2, size2;
  transfer_engine_t e = make_engine(conn, name, me, sizeof me);
  const uint64_t block = MiB, nblk = 16, lsize = 2 * nblk * block;
  unsigned char *local = map_buffer(lsize);
  REQUIRE(registerLocalMemory(e, local, lsize, "cpu:0", 1) == 0);

  REQUIRE(read_segment_file(file1, 60, seg1, sizeof seg1, &base1, &size1) == 0);
  REQUIRE(size1 >= nblk * block);
  struct peer p = {.e = e, .seg = openSegment(e, seg1), .base = base1, .size = size1};
  REQUIRE(p.seg > 0);
  printf("phase1: running against %s\n", seg1);
  fflush(stdout);

  /* Phase 1: WRITE batches until one fails. */
  double t0 = te_now(), failed_at = 0;
  struct transfer_request r[16];
  for (uint64_t i = 0; i < nblk; i++)
    r[i] = req(&p, i % 2 ? OPCODE_READ : OPCODE_WRITE, local + i * block, i * block, block);
  uint64_t batches = 0;
  while (!failed_at) {
    if (te_now() - t0 > 120) {
      fprintf(stderr, "phase1: no transfer failed in 120 s (was the target killed?)\n");
      return 1;
    }
    batch_id_t b = allocateBatchID(e, nblk);
    REQUIRE(b != INVALID_BATCH);
    int rc = submitTransfer(e, b, r, nblk);
    if (rc != 0) {
      /* The engine may refuse at submit once it knows the peer is gone. */
      printf("phase1: submitTransfer returned %d\n", rc);
      failed_at = te_now();
      CHECK_EQ(freeBatchID(e, b), 0);
      break;
    }
    int failed = 0;
    double b0 = te_now();
    for (uint64_t i = 0; i < nblk; i++) {
      int s = te_wait(e, b, i, NULL);
      if (s == -2) {
        fprintf(stderr, "phase1: task %" PRIu64 " never became terminal (hang)\n", i);
        return 1;
      }
      CHECK(s == STATUS_COMPLETED || s == STATUS_FAILED);
      if (s != STATUS_COMPLETED) failed++;
    }
    CHECK_EQ(freeBatchID(e, b), 0); /* every task was seen terminal */
    batches++;
    if (failed) {
      failed_at = te_now();
      printf("phase1: batch %" PRIu64 ": %d of %" PRIu64 " tasks FAILED; the batch took %.2f s "
             "to become terminal\n", batches, failed, nblk, failed_at - b0);
    }
  }
  /* Work for the dead peer fails too (no hang), within the status timeout. */
  {
    double s0 = te_now();
    struct transfer_request one = req(&p, OPCODE_WRITE, local, 0, 4096);
    batch_id_t b = allocateBatchID(e, 1);
    REQUIRE(b != INVALID_BATCH);
    int rc = submitTransfer(e, b, &one, 1);
    if (rc == 0) {
      int s = te_wait(e, b, 0, NULL);
      CHECK_EQ(s, STATUS_FAILED);
    }
    CHECK_EQ(freeBatchID(e, b), 0);
    printf("phase1: a new request to the dead peer ended (submit %d) after %.2f s\n", rc,
           te_now() - s0);
  }
  printf("phase1 done: %" PRIu64 " batches before the failure\n", batches);
  fflush(stdout);

  /* Phase 2: a new target, same process and engine. */
  REQUIRE(read_segment_file(file2, 120, seg2, sizeof seg2, &base2, &size2) == 0);
  REQUIRE(size2 >= nblk * block);
  struct peer q = {.e = e, .seg = openSegment(e, seg2), .base = base2, .size = size2};
  if (q.seg < 0) fprintf(stderr, "phase2: openSegment(%s) = %d\n", seg2, q.seg);
  REQUIRE(q.seg > 0);
  const uint64_t lens[] = {MiB + 13, 8 * MiB - 1, 1};
  for (int k = 0; k < 3; k++) {
    struct transfer_request w = req(&q, OPCODE_WRITE, local + 1, 3, lens[k]);
    fill_at(local + 1, lens[k], 300 + (uint64_t)k, 0);
    CHECK_EQ(transfer(&q, &w, 1, STATUS_COMPLETED), 0);
    memset(local + 16 * MiB + 5, 0, lens[k]);
    struct transfer_request rd = req(&q, OPCODE_READ, local + 16 * MiB + 5, 3, lens[k]);
    CHECK_EQ(transfer(&q, &rd, 1, STATUS_COMPLETED), 0);
    CHECK(first_bad(local + 16 * MiB + 5, lens[k], 300 + (uint64_t)k, 0) < 0);
  }
  /* The new target's initial pattern is readable too. */
  struct transfer_request rd = req(&q, OPCODE_READ, local + 7, 9 * MiB + 1, 2 * MiB);
  CHECK_EQ(transfer(&q, &rd, 1, STATUS_COMPLETED), 0);
  CHECK(first_bad(local + 7, 2 * MiB, TARGET_SEED, 9 * MiB + 1) < 0);
  int status = te_check_exit("net_peer reconnect");
  if (status == 0) printf("phase2: OK with %s\n", seg2);
  CHECK_EQ(unregisterLocalMemory(e, local), 0);
  destroyTransferEngine(e);
  munmap(local, lsize);
  return status;
}

static uint64_t num(const char *s) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno || end == s || *end) {
    fprintf(stderr, "not a number: %s\n", s);
    exit(2);
  }
  return (uint64_t)v;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* If the driver script dies without its trap (SIGKILL from a ctest
   * timeout), do not outlive it. */
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  if (argc == 5 && !strcmp(argv[1], "target")) return target_main(argv[2], argv[3], num(argv[4]));
  if (argc == 7 && !strcmp(argv[1], "initiator"))
    return initiator_main(argv[2], argv[3], argv[4], num(argv[5]), num(argv[6]));
  if (argc == 6 && !strcmp(argv[1], "reconnect"))
    return reconnect_main(argv[2], argv[3], argv[4], argv[5]);
  fprintf(stderr,
          "usage: net_peer target CONN NAME SIZE\n"
          "       net_peer initiator CONN NAME SEGMENT BASE SIZE\n"
          "       net_peer reconnect CONN NAME SEGFILE1 SEGFILE2\n");
  return 2;
}
