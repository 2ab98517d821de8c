/*
 * consumer: the smallest program of a project that uses transfer-engine:
 * both headers, an engine, a byte-verified copy through it, and the te_*
 * extensions (version, buffers, last error). Exit code 0 means success.
 */
#include <transfer_engine_ext.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIZE ((size_t)1 << 20)

int main(void) {
  transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0);
  if (!e) {
    char msg[512];
    te_last_error(msg, sizeof msg);
    fprintf(stderr, "consumer: createTransferEngine failed: %s\n", msg);
    return 1;
  }
  unsigned char *src = malloc(SIZE), *dst = calloc(1, SIZE);
  int ok = src && dst;
  for (size_t i = 0; ok && i < SIZE; i++) src[i] = (unsigned char)(i * 7 + 1);
  ok = ok && registerLocalMemory(e, dst, SIZE, "cpu:0", 1) == 0;
  te_buffer_info_t info;
  size_t count = 0;
  ok = ok && te_segment_buffers(e, LOCAL_SEGMENT, &info, 1, &count) == 0 && count == 1 &&
       info.addr == (uint64_t)(uintptr_t)dst && info.length == SIZE;
  batch_id_t b = ok ? allocateBatchID(e, 1) : INVALID_BATCH;
  struct transfer_request r = {OPCODE_WRITE, src, LOCAL_SEGMENT, (uint64_t)(uintptr_t)dst, SIZE};
  ok = ok && b != INVALID_BATCH && submitTransfer(e, b, &r, 1) == 0;
  struct transfer_status st = {STATUS_WAITING, 0};
  while (ok && st.status == STATUS_WAITING) ok = getTransferStatus(e, b, 0, &st) == 0;
  ok = ok && st.status == STATUS_COMPLETED && memcmp(src, dst, SIZE) == 0;
  if (b != INVALID_BATCH) freeBatchID(e, b);
  if (dst) unregisterLocalMemory(e, dst);
  destroyTransferEngine(e);
  free(src);
  free(dst);
  printf("consumer: transfer-engine %s: %s\n", te_version(), ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
