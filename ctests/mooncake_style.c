/*
 * mooncake_style: code written the way Mooncake's C users write it (the Go
 * P2P store, NIXL's plugin, the Rust bindings): segment_id_t and batch_id_t
 * as macro types, struct transfer_request with designated initialisers,
 * transfer_status_t, notify_msg_t passed by value, INVALID_BATCH compared
 * directly. It must compile unchanged against Mooncake's own header and,
 * linked against libtransfer_engine.so, perform a local WRITE and READ.
 * It includes nothing but <transfer_engine_c.h> and libc.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transfer_engine_c.h"

#define POOL_SIZE (1 << 20)
#define XFER_SIZE (256 * 1024)

static int wait_task(transfer_engine_t engine, batch_id_t batch_id, size_t task_id) {
  transfer_status_t status;
  for (;;) {
    int ret = getTransferStatus(engine, batch_id, task_id, &status);
    if (ret != 0) return -1;
    if (status.status == STATUS_COMPLETED) return 0;
    if (status.status == STATUS_FAILED || status.status == STATUS_TIMEOUT ||
        status.status == STATUS_CANCELED || status.status == STATUS_INVALID)
      return -1;
  }
}

static int submit_and_wait(transfer_engine_t engine, struct transfer_request *requests, size_t n) {
  batch_id_t batch_id = allocateBatchID(engine, n);
  if (batch_id == INVALID_BATCH) return -1;
  int ret = submitTransfer(engine, batch_id, requests, n);
  for (size_t i = 0; ret == 0 && i < n; i++) ret = wait_task(engine, batch_id, i);
  if (freeBatchID(engine, batch_id) != 0) ret = -1;
  return ret;
}

int main(void) {
  const char *local_server_name = "127.0.0.1:12345";
  transfer_engine_t engine =
      createTransferEngine("P2PHANDSHAKE", local_server_name, "127.0.0.1", 12345, 0);
  if (engine == NULL) {
    fprintf(stderr, "createTransferEngine failed\n");
    return 1;
  }

  char *pool = (char *)aligned_alloc(4096, POOL_SIZE);
  if (pool == NULL) return 1;
  buffer_entry_t buffers[1] = {{.addr = pool, .length = POOL_SIZE}};
  if (registerLocalMemoryBatch(engine, buffers, 1, "cpu:0") != 0) {
    fprintf(stderr, "registerLocalMemoryBatch failed\n");
    return 1;
  }

  segment_id_t segment_id = openSegment(engine, local_server_name);
  if (segment_id == (segment_id_t)-1) {
    fprintf(stderr, "openSegment failed\n");
    return 1;
  }
  segment_handle_t handle = segment_id;
  uint64_t remote_base = (uint64_t)(uintptr_t)pool; /* absolute address */

  for (int i = 0; i < XFER_SIZE; i++) pool[i] = (char)(i * 31 + 7);

  /* WRITE pool[0, XFER) -> pool[XFER, 2*XFER) */
  struct transfer_request write_req = {
      .opcode = OPCODE_WRITE,
      .source = pool,
      .target_id = handle,
      .target_offset = remote_base + XFER_SIZE,
      .length = XFER_SIZE,
  };
  if (submit_and_wait(engine, &write_req, 1) != 0 ||
      memcmp(pool, pool + XFER_SIZE, XFER_SIZE) != 0) {
    fprintf(stderr, "WRITE failed\n");
    return 1;
  }

  /* READ pool[XFER, 2*XFER) -> a zeroed local buffer. */
  char *local = (char *)calloc(1, XFER_SIZE);
  if (local == NULL) return 1;
  transfer_request_t read_req = {
      .opcode = OPCODE_READ,
      .source = local,
      .target_id = segment_id,
      .target_offset = remote_base + XFER_SIZE,
      .length = XFER_SIZE,
  };
  if (submit_and_wait(engine, &read_req, 1) != 0 || memcmp(local, pool, XFER_SIZE) != 0) {
    fprintf(stderr, "READ failed\n");
    return 1;
  }

  /* Notifications: none arrive on a local-only engine; the by-value API
   * must still be callable. */
  int size = 0;
  notify_msg_t *msgs = getNotifsFromEngine(engine, &size);
  if (msgs != NULL) freeNotifsMsgBuf(msgs, size);
  notify_msg_t notify = {.name = (char *)"mooncake_style", .msg = (char *)"done"};
  (void)notify;

  void *addrs[1] = {pool};
  if (unregisterLocalMemoryBatch(engine, addrs, 1) != 0) {
    fprintf(stderr, "unregisterLocalMemoryBatch failed\n");
    return 1;
  }
  destroyTransferEngine(engine);
  free(local);
  free(pool);
  printf("mooncake_style: WRITE and READ of %d bytes verified\n", XFER_SIZE);
  return 0;
}
