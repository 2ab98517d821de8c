/*
 * auto_discover_copy: an engine created with auto_discover (which lists
 * the RDMA devices, and installs TCP where there are none) moves bytes
 * within itself, verified. ctests/without_libibverbs.sh runs it on a host
 * view where libibverbs cannot be loaded.
 */
#include "transfer_engine_c.h"

#include <stdlib.h>

#include "te_check.h"
#include "te_util.h"

#define LEN ((size_t)1 << 20)

int main(void) {
  transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 1);
  REQUIRE(e != NULL);
  unsigned char *src = malloc(LEN), *dst = calloc(1, LEN);
  REQUIRE(src && dst);
  te_fill(src, LEN, 7);
  CHECK_EQ(registerLocalMemory(e, dst, LEN, "cpu:0", 1), 0);
  struct transfer_request r = {.opcode = OPCODE_WRITE, .source = src, .target_id = LOCAL_SEGMENT,
                               .target_offset = (uint64_t)(uintptr_t)dst, .length = LEN};
  batch_id_t b = allocateBatchID(e, 1);
  REQUIRE(b != INVALID_BATCH);
  CHECK_EQ(submitTransfer(e, b, &r, 1), 0);
  struct transfer_status st = {0};
  CHECK_EQ(te_wait(e, b, 0, &st), STATUS_COMPLETED);
  CHECK_EQ(te_verify(dst, LEN, 7), TE_ALL_MATCH);
  CHECK_EQ(freeBatchID(e, b), 0);
  CHECK_EQ(unregisterLocalMemory(e, dst), 0);
  destroyTransferEngine(e);
  free(src);
  free(dst);
  return te_check_exit("auto_discover_copy");
}
