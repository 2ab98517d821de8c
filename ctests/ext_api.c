/*
 * ext_api: the te_* functions of transfer_engine_ext.h.
 *
 * te_version is the library's version; te_last_error explains failing
 * calls of both return-code families (and of te_* itself) on the thread
 * that made them, is cleared by a call that succeeds, is truncated like
 * snprintf and reports the full length; te_segment_buffers lists this
 * engine's own buffers (LOCAL_SEGMENT) and, over TCP, the buffers a second
 * engine in this process published, with the capacity / count protocol;
 * te_segment_transport names "local" for LOCAL_SEGMENT and "tcp" for that
 * engine, truncates like snprintf, and refuses a NULL engine or buffer and
 * a segment not open.
 * A misspelled backend is refused with a suggestion, the lower-case one
 * accepted. te_allocate_buffer gives memory only with "shm" installed;
 * it is zeroed, registers and carries a local transfer, and
 * te_free_buffer refuses it while registered, frees it once, then refuses
 * it again. te_wait_batch and te_cancel_batch, between two engines over
 * TCP: COMPLETED once
 * every byte landed, TIMED_OUT when the timeout passes first, FAILED for
 * a WRITE into memory the target unregistered, COMPLETED for two callers
 * waiting on one batch at once, and each time the batch can be freed
 * without a getTransferStatus (a freeBatchID racing a wait is refused
 * until the waiter has seen every task end); a batch cancelled at once
 * is DONE, its tasks CANCELED or COMPLETED, and it can be freed; a
 * batch's notification is DELIVERED (te_notify_status) once the wait
 * says COMPLETED, and the target holds it; a bad engine or batch is
 * refused.
 */
#include "transfer_engine_ext.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "te_check.h"

/* The last error text (empty when none). */
static const char *last(void) {
  static char msg[1024];
  msg[0] = 0;
  te_last_error(msg, sizeof msg);
  return msg;
}

#define CHECK_ERROR_MENTIONS(what)                                                     \
  do {                                                                                 \
    const char *te_msg_ = last();                                                      \
    CHECK(strstr(te_msg_, (what)) != NULL);                                            \
    if (!strstr(te_msg_, (what)))                                                      \
      fprintf(stderr, "  last error \"%s\" does not mention \"%s\"\n", te_msg_, (what)); \
  } while (0)

static void *other_thread(void *arg) {
  (void)arg;
  /* Nothing failed on this thread. */
  return (void *)(uintptr_t)te_last_error(NULL, 0);
}

static void check_last_error(transfer_engine_t e) {
  /* The Status family: a NULL status pointer. */
  batch_id_t b = allocateBatchID(e, 1);
  REQUIRE(b != INVALID_BATCH);
  CHECK_EQ(te_last_error(NULL, 0), 0);
  CHECK_EQ(getTransferStatus(e, b, 0, NULL), 1);
  CHECK_ERROR_MENTIONS("getTransferStatus: status is NULL");
  /* The 0 / TE_ERR_* family: an unregistered address. */
  char local;
  CHECK_EQ(unregisterLocalMemory(e, &local), TE_ERR_ADDRESS_NOT_REGISTERED);
  CHECK_ERROR_MENTIONS("unregisterLocalMemory");
  CHECK_ERROR_MENTIONS("no buffer is registered");
  /* NULL returns. */
  CHECK(installTransport(e, "no-such-protocol", NULL) == NULL);
  CHECK_ERROR_MENTIONS("no-such-protocol");
  CHECK(openSegment(e, NULL) == -1);
  CHECK_ERROR_MENTIONS("openSegment: segment_name is NULL");
  /* A bad handle, also for a void function. */
  destroyTransferEngine((transfer_engine_t)(uintptr_t)0x1234);
  CHECK_ERROR_MENTIONS("destroyTransferEngine: engine handle");
  size_t full = te_last_error(NULL, 0);
  CHECK(full > 0);
  /* Reading does not clear; truncation like snprintf. */
  char small[8];
  memset(small, 'x', sizeof small);
  CHECK_EQ(te_last_error(small, sizeof small), full);
  CHECK_EQ(strlen(small), 7);
  CHECK_EQ(te_last_error(small, 1), full);
  CHECK_EQ(small[0], 0);
  /* te_version leaves it; a call that succeeds clears it. */
  CHECK(te_version() != NULL);
  CHECK_EQ(te_last_error(NULL, 0), full);
  /* Each thread has its own. */
  pthread_t t;
  void *other = (void *)1;
  REQUIRE(pthread_create(&t, NULL, other_thread, NULL) == 0);
  pthread_join(t, &other);
  CHECK(other == NULL);
  CHECK_EQ(freeBatchID(e, b), 0);
  CHECK_EQ(te_last_error(NULL, 0), 0);
  CHECK_EQ(last()[0], 0);
}

static void check_local_buffers(transfer_engine_t e, unsigned char *a, size_t na,
                                unsigned char *b, size_t nb) {
  size_t count = 99;
  CHECK_EQ(te_segment_buffers(e, LOCAL_SEGMENT, NULL, 0, &count), 0);
  CHECK_EQ(count, 0);
  REQUIRE(registerLocalMemory(e, a, na, "cpu:0", 1) == 0);
  REQUIRE(registerLocalMemory(e, b, nb, "*", 0) == 0);
  te_buffer_info_t info[3];
  memset(info, 0x5a, sizeof info);
  count = 0;
  CHECK_EQ(te_segment_buffers(e, LOCAL_SEGMENT, info, 3, &count), 0);
  CHECK_EQ(count, 2);
  /* By address. */
  unsigned char *lo = a < b ? a : b, *hi = a < b ? b : a;
  CHECK_EQ_U64(info[0].addr, (uintptr_t)lo);
  CHECK_EQ_U64(info[1].addr, (uintptr_t)hi);
  CHECK_EQ_U64(info[0].length, lo == a ? na : nb);
  CHECK(!strcmp(info[lo == a ? 0 : 1].location, "cpu:0"));
  /* "*" is published as the NUMA node of the buffer's first page when that
     page has one (it was touched), else stays "*". */
  const char *wild = info[lo == a ? 1 : 0].location;
  CHECK(!strcmp(wild, "*") || !strncmp(wild, "cpu:", 4));
  /* Only the first `capacity` entries are written; the total is reported. */
  memset(info, 0x5a, sizeof info);
  count = 0;
  CHECK_EQ(te_segment_buffers(e, LOCAL_SEGMENT, info, 1, &count), 0);
  CHECK_EQ(count, 2);
  CHECK_EQ_U64(info[0].addr, (uintptr_t)lo);
  CHECK_EQ_U64(info[1].addr, 0x5a5a5a5a5a5a5a5aull);
  /* Bad input. */
  CHECK_EQ(te_segment_buffers(e, LOCAL_SEGMENT, info, 1, NULL), TE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("count is NULL");
  CHECK_EQ(te_segment_buffers(e, LOCAL_SEGMENT, NULL, 1, &count), TE_ERR_INVALID_ARGUMENT);
  CHECK_EQ(te_segment_buffers(e, 4242, info, 1, &count), TE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("segment id 4242 is not open");
  CHECK_EQ(te_segment_buffers(NULL, LOCAL_SEGMENT, info, 1, &count), TE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("engine handle");
}

/* Two engines over TCP: the target registered `theirs`, the initiator
   opened the target's segment. */
struct pair {
  transfer_engine_t target, initiator;
  segment_id_t seg;
};

static struct pair open_pair(unsigned char *theirs, size_t n) {
  struct pair p = {createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0),
                   createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0), 0};
  REQUIRE(p.target && p.initiator);
  REQUIRE(installTransport(p.target, "tcp", NULL) != NULL);
  REQUIRE(installTransport(p.initiator, "tcp", NULL) != NULL);
  REQUIRE(registerLocalMemory(p.target, theirs, n, "cpu:0", 1) == 0);
  char name[128];
  REQUIRE(getLocalIpAndPort(p.target, name, sizeof name) == 0);
  p.seg = openSegment(p.initiator, name);
  REQUIRE(p.seg > 0);
  return p;
}

static void close_pair(struct pair p) {
  destroyTransferEngine(p.initiator);
  destroyTransferEngine(p.target);
}

/* A second engine over TCP: its published buffers, as an initiator sees them. */
static void check_remote_buffers(unsigned char *buf, size_t n) {
  struct pair p = open_pair(buf, n);
  te_buffer_info_t info[2];
  size_t count = 0;
  CHECK_EQ(te_segment_buffers(p.initiator, p.seg, info, 2, &count), 0);
  CHECK_EQ(count, 1);
  CHECK_EQ_U64(info[0].addr, (uintptr_t)buf);
  CHECK_EQ_U64(info[0].length, n);
  /* A TCP descriptor does not say where its buffers live. */
  CHECK_EQ(info[0].location[0], 0);
  char name[8];
  CHECK_EQ(te_segment_transport(p.initiator, p.seg, name, sizeof name), 0);
  CHECK(strcmp(name, "tcp") == 0);
  CHECK_EQ(te_segment_transport(p.initiator, LOCAL_SEGMENT, name, sizeof name), 0);
  CHECK(strcmp(name, "local") == 0);
  CHECK_EQ(te_segment_transport(p.initiator, LOCAL_SEGMENT, name, 3), 0);
  CHECK(strcmp(name, "lo") == 0);
  CHECK_EQ(te_segment_transport(p.initiator, 4242, name, sizeof name), TE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("segment id 4242 is not open");
  CHECK_EQ(te_segment_transport(p.initiator, p.seg, NULL, 8), TE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("buf is NULL");
  CHECK_EQ(te_segment_transport(NULL, p.seg, name, sizeof name), TE_ERR_INVALID_ARGUMENT);
  close_pair(p);
}

/* A second caller's te_wait_batch on the same batch. */
struct waiter {
  transfer_engine_t engine;
  batch_id_t batch;
  int result;
};

static void *wait_on_batch(void *arg) {
  struct waiter *w = arg;
  w->result = te_wait_batch(w->engine, w->batch, 30000);
  return NULL;
}

static void check_wait_batch(void) {
  size_t n = 16 << 20;
  unsigned char *theirs = calloc(1, n), *ours = malloc(n);
  REQUIRE(theirs && ours);
  for (size_t i = 0; i < n; i++) ours[i] = (unsigned char)(i * 7 + (i >> 12));
  struct pair p = open_pair(theirs, n);
  transfer_engine_t e = p.initiator;
  REQUIRE(registerLocalMemory(e, ours, n, "cpu:0", 1) == 0);

  /* 16 MiB cannot cross loopback between the submit and the first poll:
     a timeout of 0 returns TIMED_OUT; then the wait sees every task end. */
  struct transfer_request w[16];
  for (size_t i = 0; i < 16; i++)
    w[i] = (struct transfer_request){OPCODE_WRITE, ours + (i << 20), p.seg,
                                     (uint64_t)(uintptr_t)(theirs + (i << 20)), 1 << 20};
  batch_id_t b = allocateBatchID(e, 16);
  REQUIRE(b != INVALID_BATCH);
  CHECK_EQ(submitTransfer(e, b, w, 16), 0);
  CHECK_EQ(te_wait_batch(e, b, 0), TE_WAIT_TIMED_OUT);
  CHECK_EQ(freeBatchID(e, b), 4); /* tasks not seen ended yet */
  CHECK_EQ(te_wait_batch(e, b, 30000), TE_WAIT_COMPLETED);
  CHECK(memcmp(theirs, ours, n) == 0);
  CHECK_EQ(freeBatchID(e, b), 0);

  /* Two callers waiting on one batch at once both see it complete. */
  memset(theirs, 0, n);
  b = allocateBatchID(e, 16);
  REQUIRE(b != INVALID_BATCH);
  CHECK_EQ(submitTransfer(e, b, w, 16), 0);
  struct waiter other = {e, b, -100};
  pthread_t tid;
  REQUIRE(pthread_create(&tid, NULL, wait_on_batch, &other) == 0);
  CHECK_EQ(te_wait_batch(e, b, 30000), TE_WAIT_COMPLETED);
  REQUIRE(pthread_join(tid, NULL) == 0);
  CHECK_EQ(other.result, TE_WAIT_COMPLETED);
  CHECK(memcmp(theirs, ours, n) == 0);
  CHECK_EQ(freeBatchID(e, b), 0);

  /* freeBatchID racing a wait: refused (4) until the waiter has seen
     every task end, which it reports; then the batch is gone. */
  memset(theirs, 0, n);
  b = allocateBatchID(e, 16);
  REQUIRE(b != INVALID_BATCH);
  CHECK_EQ(submitTransfer(e, b, w, 16), 0);
  other = (struct waiter){e, b, -100};
  REQUIRE(pthread_create(&tid, NULL, wait_on_batch, &other) == 0);
  int freed = 4;
  for (time_t until = time(NULL) + 30; freed == 4 && time(NULL) < until;) freed = freeBatchID(e, b);
  CHECK_EQ(freed, 0);
  REQUIRE(pthread_join(tid, NULL) == 0);
  CHECK_EQ(other.result, TE_WAIT_COMPLETED);
  CHECK(memcmp(theirs, ours, n) == 0);
  CHECK_EQ(te_wait_batch(e, b, 0), TE_ERR_INVALID_ARGUMENT);

  /* Memory the target no longer has: the WRITE fails, the wait says so. */
  REQUIRE(unregisterLocalMemory(p.target, theirs) == 0);
  b = allocateBatchID(e, 1);
  REQUIRE(b != INVALID_BATCH);
  CHECK_EQ(submitTransfer(e, b, w, 1), 0);
  CHECK_EQ(te_wait_batch(e, b, 30000), TE_WAIT_FAILED);
  struct transfer_status st = {0};
  CHECK_EQ(getTransferStatus(e, b, 0, &st), 0);
  CHECK_EQ(st.status, STATUS_FAILED);
  CHECK_EQ(freeBatchID(e, b), 0);

  /* A 16 MiB WRITE cancelled at once: DONE, every task ended (CANCELED,
     or COMPLETED if it had moved), the batch free to go; a later cancel of
     the freed batch is refused. */
  REQUIRE(registerLocalMemory(p.target, theirs, n, "cpu:0", 1) == 0);
  b = allocateBatchID(e, 16);
  REQUIRE(b != INVALID_BATCH);
  CHECK_EQ(submitTransfer(e, b, w, 16), 0);
  CHECK_EQ(te_cancel_batch(e, b, 10000), TE_CANCEL_DONE);
  int canceled = 0;
  for (int i = 0; i < 16; i++) {
    CHECK_EQ(getTransferStatus(e, b, i, &st), 0);
    CHECK(st.status == STATUS_CANCELED || st.status == STATUS_COMPLETED);
    canceled += st.status == STATUS_CANCELED;
  }
  CHECK(canceled > 0);
  CHECK_EQ(freeBatchID(e, b), 0);
  CHECK_EQ(te_cancel_batch(e, b, 0), TE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("te_cancel_batch");
  CHECK_EQ(te_cancel_batch(NULL, 1, 0), TE_ERR_INVALID_ARGUMENT);

  /* A batch with a notification: PENDING or DELIVERED at once, COMPLETED
     once delivered, and the target holds it; one without: NONE. */
  b = allocateBatchID(e, 1);
  REQUIRE(b != INVALID_BATCH);
  CHECK_EQ(te_notify_status(e, b), TE_NOTIFY_NONE);
  notify_msg_t note = {(char *)"kv", (char *)"ready"};
  CHECK_EQ(submitTransferWithNotify(e, b, w, 1, note), 0);
  int ns = te_notify_status(e, b);
  CHECK(ns == TE_NOTIFY_PENDING || ns == TE_NOTIFY_DELIVERED);
  CHECK_EQ(te_wait_batch(e, b, 30000), TE_WAIT_COMPLETED);
  CHECK_EQ(te_notify_status(e, b), TE_NOTIFY_DELIVERED);
  CHECK_EQ(freeBatchID(e, b), 0);
  int got_n = 0;
  notify_msg_t *got = getNotifsFromEngine(p.target, &got_n);
  CHECK_EQ(got_n, 1);
  if (got_n == 1) CHECK(strcmp(got[0].msg, "ready") == 0);
  freeNotifsMsgBuf(got, got_n);
  CHECK_EQ(te_notify_status(e, b), TE_ERR_INVALID_ARGUMENT);
  CHECK_EQ(te_notify_status(NULL, 1), TE_ERR_INVALID_ARGUMENT);

  /* The metrics text, snprintf-style: the full length, truncated copies
     NUL-terminated, the families named; 0 for a NULL engine. */
  size_t full = te_metrics_text(e, NULL, 0);
  CHECK(full > 0);
  char *text = malloc(full + 1);
  REQUIRE(text);
  CHECK_EQ(te_metrics_text(e, text, full + 1), full);
  CHECK(strstr(text, "transfer_engine_transferred_bytes_total") != NULL);
  CHECK(strstr(text, "transfer_engine_inflight_tasks") != NULL);
  char small[8];
  CHECK_EQ(te_metrics_text(e, small, sizeof small), full);
  CHECK_EQ(strlen(small), sizeof small - 1);
  free(text);
  CHECK_EQ(te_metrics_text(NULL, small, sizeof small), 0);

  /* Bad input. */
  CHECK_EQ(te_wait_batch(e, b, 0), TE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("te_wait_batch");
  CHECK_EQ(te_wait_batch(NULL, 1, 0), TE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("engine handle");
  close_pair(p);
  free(theirs);
  free(ours);
}

static void check_backend_names(void) {
  CHECK(createTransferEngine("P2PHANDSHAK", "127.0.0.1", NULL, 0, 0) == NULL);
  CHECK_ERROR_MENTIONS("did you mean P2PHANDSHAKE?");
  transfer_engine_t e = createTransferEngine("p2phandshake", "127.0.0.1", NULL, 0, 0);
  CHECK(e != NULL);
  if (e) destroyTransferEngine(e);
}

static void check_engine_buffers(void) {
  transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1:12346", NULL, 0, 0);
  REQUIRE(e != NULL);
  CHECK(te_allocate_buffer(NULL, 4096) == NULL);
  CHECK_ERROR_MENTIONS("te_allocate_buffer");
  REQUIRE(installTransport(e, "tcp", NULL) != NULL);
  CHECK(te_allocate_buffer(e, 4096) == NULL);
  CHECK_ERROR_MENTIONS("install \"shm\"");
  REQUIRE(installTransport(e, "shm", NULL) != NULL);
  CHECK(te_allocate_buffer(e, 0) == NULL);
  size_t n = 3 << 20;
  unsigned char *m = te_allocate_buffer(e, n);
  REQUIRE(m != NULL);
  size_t zeros = 0;
  for (size_t i = 0; i < n; i++) zeros += m[i] == 0;
  CHECK_EQ(zeros, n);
  CHECK_EQ(registerLocalMemory(e, m, n, "cpu:0", 1), 0);
  memset(m, 0x5a, n / 2);
  batch_id_t b = allocateBatchID(e, 1);
  struct transfer_request r = {OPCODE_WRITE, m, LOCAL_SEGMENT, (uint64_t)(uintptr_t)(m + n / 2), n / 2};
  CHECK_EQ(submitTransfer(e, b, &r, 1), 0);
  struct transfer_status st = {0};
  for (int i = 0; i < 10000 && getTransferStatus(e, b, 0, &st) == 0 && st.status == STATUS_WAITING; i++)
    ;
  CHECK_EQ(st.status, STATUS_COMPLETED);
  CHECK_EQ(freeBatchID(e, b), 0);
  size_t same = 0;
  for (size_t i = n / 2; i < n; i++) same += m[i] == 0x5a;
  CHECK_EQ(same, n / 2);
  CHECK_EQ(te_free_buffer(e, m), TE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("still registered");
  CHECK_EQ(unregisterLocalMemory(e, m), 0);
  CHECK_EQ(te_free_buffer(e, m), 0);
  CHECK_EQ(te_free_buffer(e, m), TE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("not a buffer the engine allocated");
  destroyTransferEngine(e);
}

int main(void) {
  const char *v = te_version();
  REQUIRE(v != NULL);
  CHECK(strlen(v) >= 5 && strchr(v, '.') != NULL);
  transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1:12345", NULL, 0, 0);
  REQUIRE(e != NULL);
  CHECK_EQ(te_last_error(NULL, 0), 0);
  check_last_error(e);
  size_t na = 1 << 20, nb = 4096;
  unsigned char *a = calloc(1, na), *b = calloc(1, nb);
  REQUIRE(a && b);
  check_local_buffers(e, a, na, b, nb);
  destroyTransferEngine(e);
  size_t count = 0;
  CHECK_EQ(te_segment_buffers(e, LOCAL_SEGMENT, NULL, 0, &count), TE_ERR_INVALID_ARGUMENT);
  check_remote_buffers(a, na);
  check_wait_batch();
  check_backend_names();
  check_engine_buffers();
  free(a);
  free(b);
  printf("ext_api: library version %s\n", v);
  return te_check_exit("ext_api");
}
