/*
 * local_copy: the smallest complete use of the transfer engine's C API.
 *
 * It creates an engine, registers two buffers, copies one into the other
 * through the engine (a WRITE to the engine's own segment), waits for the
 * copy, checks every byte, and cleans up. Exit code 0 means success.
 *
 * Build, against the CMake build tree (cmake -S . -B build && cmake --build build):
 *           cc -std=c11 c-examples/local_copy.c -Iinclude -Lbuild/lib -ltransfer_engine
 *         or against an installed copy (cmake --install build --prefix /opt/te):
 *           cc -std=c11 local_copy.c $(PKG_CONFIG_PATH=/opt/te/lib/pkgconfig \
 *               pkg-config --cflags --libs transfer_engine)
 * Run:    LD_LIBRARY_PATH=build/lib ./a.out   (or /opt/te/lib)
 *
 * The same steps move bytes to another process: open the peer's segment
 * by its name instead of our own, and use addresses inside the peer's
 * registered buffers as target_offset.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transfer_engine_c.h"

#define NAME "127.0.0.1:12345" /* this engine's name: "host:port" */
#define SIZE ((size_t)4 << 20) /* 4 MiB */

int main(void) {
  int ok = 0;

  /* 1. An engine. "P2PHANDSHAKE" needs no metadata server; auto_discover 0
   *    installs no network transport, which local copies do not need. */
  transfer_engine_t engine = createTransferEngine("P2PHANDSHAKE", NAME, "", 0, 0);
  if (engine == NULL) {
    fprintf(stderr, "createTransferEngine failed (see the log above)\n");
    return 1;
  }

  /* 2. Two buffers. The target of a request must lie inside memory
   *    registered with the engine; registering the source too is what a
   *    network transport needs, and costs nothing here. */
  unsigned char *src = malloc(SIZE), *dst = malloc(SIZE);
  if (src == NULL || dst == NULL) goto out_free;
  for (size_t i = 0; i < SIZE; i++) src[i] = (unsigned char)(i * 131 + 7);
  memset(dst, 0, SIZE);
  if (registerLocalMemory(engine, src, SIZE, "cpu:0", 1) != 0) goto out_free;
  if (registerLocalMemory(engine, dst, SIZE, "cpu:0", 1) != 0) goto out_unreg_src;

  /* 3. The target segment: our own name gives LOCAL_SEGMENT (0). */
  segment_id_t segment = openSegment(engine, NAME);
  if (segment < 0) goto out_unreg;

  /* 4. A batch holding one request: WRITE src -> dst. target_offset is the
   *    absolute address of the destination, as in Mooncake. */
  batch_id_t batch = allocateBatchID(engine, 1);
  if (batch == INVALID_BATCH) goto out_unreg;
  struct transfer_request req = {
      .opcode = OPCODE_WRITE,
      .source = src,
      .target_id = segment,
      .target_offset = (uint64_t)(uintptr_t)dst,
      .length = SIZE,
  };
  int rc = submitTransfer(engine, batch, &req, 1);
  if (rc != 0) {
    fprintf(stderr, "submitTransfer returned %d\n", rc);
    freeBatchID(engine, batch);
    goto out_unreg;
  }

  /* 5. Poll until the task is terminal. freeBatchID succeeds only after
   *    every task was seen COMPLETED or FAILED here. */
  struct transfer_status status = {0};
  do {
    rc = getTransferStatus(engine, batch, 0, &status);
  } while (rc == 0 && status.status != STATUS_COMPLETED && status.status != STATUS_FAILED);
  freeBatchID(engine, batch);

  /* 6. Check the result. */
  if (rc != 0 || status.status != STATUS_COMPLETED) {
    fprintf(stderr, "transfer failed: rc %d, status %d\n", rc, status.status);
  } else if (status.transferred_bytes != SIZE || memcmp(src, dst, SIZE) != 0) {
    fprintf(stderr, "transfer completed but the bytes differ\n");
  } else {
    printf("copied %zu bytes through the engine; every byte verified\n", SIZE);
    ok = 1;
  }

  /* 7. Clean up: unregister, destroy (joins the engine's threads), free. */
out_unreg:
  unregisterLocalMemory(engine, dst);
out_unreg_src:
  unregisterLocalMemory(engine, src);
out_free:
  destroyTransferEngine(engine);
  free(src);
  free(dst);
  return ok ? 0 : 1;
}
