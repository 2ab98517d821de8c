/*
 * gpu_memory: GPU memory handed to the engine is never copied with the CPU.
 * Device memory from cuMemAlloc is registered (as Mooncake's clients do,
 * whatever location they name); then over TCP, between two engines of
 * this process, every WRITE or READ from, to or into it FAILS before a
 * byte moves, and so does a copy within the engine, while host buffers
 * beside it still move every byte.
 *
 * It runs against whatever libcuda.so.1 the loader finds: in ctest, the
 * test double (tests/support/cuda_driver_double.c; NOT a GPU, it says so);
 * on a machine with a GPU, the real driver (scripts/gpu-check.sh).
 * Exit 77 (skipped) when there is no libcuda.so.1 at all.
 */
#include "transfer_engine_c.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "te_check.h"
#include "te_util.h"

#define LEN ((size_t)1 << 20)

typedef int (*cu_init_t)(unsigned int);
typedef int (*cu_device_get_t)(int *, int);
typedef int (*cu_ctx_retain_t)(void **, int);
typedef int (*cu_ctx_set_t)(void *);
typedef int (*cu_mem_alloc_t)(uint64_t *, size_t);
typedef int (*cu_mem_free_t)(uint64_t);

static void *sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (p == NULL) {
    fprintf(stderr, "gpu_memory: libcuda.so.1 has no %s\n", name);
    exit(1);
  }
  return p;
}

/* Runs one request; returns its final status. */
static int run(transfer_engine_t e, int opcode, void *local, int seg, uint64_t target,
               size_t len) {
  struct transfer_request r = {.opcode = opcode, .source = local, .target_id = seg,
                               .target_offset = target, .length = len};
  batch_id_t b = allocateBatchID(e, 1);
  REQUIRE(b != INVALID_BATCH);
  REQUIRE(submitTransfer(e, b, &r, 1) == 0);
  struct transfer_status st = {0};
  int s = te_wait(e, b, 0, &st);
  CHECK_EQ(freeBatchID(e, b), 0);
  return s;
}

static transfer_engine_t tcp_engine(void) {
  transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
  REQUIRE(e != NULL);
  REQUIRE(installTransport(e, "tcp", NULL) != NULL);
  return e;
}

int main(void) {
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (cuda == NULL) {
    printf("SKIPPED: no libcuda.so.1 here (%s)\n", dlerror());
    return 77;
  }
  int is_double = dlsym(cuda, "te_cuda_double_alloc") != NULL;
  fprintf(stderr, "gpu_memory: against %s\n",
          is_double ? "the CUDA driver TEST DOUBLE (not a GPU)" : "the real CUDA driver and GPU 0");

  cu_init_t cu_init = (cu_init_t)sym(cuda, "cuInit");
  cu_device_get_t cu_device_get = (cu_device_get_t)sym(cuda, "cuDeviceGet");
  cu_ctx_retain_t cu_ctx_retain = (cu_ctx_retain_t)sym(cuda, "cuDevicePrimaryCtxRetain");
  cu_ctx_set_t cu_ctx_set = (cu_ctx_set_t)sym(cuda, "cuCtxSetCurrent");
  cu_mem_alloc_t cu_mem_alloc = (cu_mem_alloc_t)sym(cuda, "cuMemAlloc_v2");
  cu_mem_free_t cu_mem_free = (cu_mem_free_t)sym(cuda, "cuMemFree_v2");
  int dev = 0;
  void *ctx = NULL;
  uint64_t d_remote = 0, d_local = 0;
  REQUIRE(cu_init(0) == 0);
  REQUIRE(cu_device_get(&dev, 0) == 0);
  REQUIRE(cu_ctx_retain(&ctx, dev) == 0);
  REQUIRE(cu_ctx_set(ctx) == 0);
  REQUIRE(cu_mem_alloc(&d_remote, LEN) == 0);
  REQUIRE(cu_mem_alloc(&d_local, LEN) == 0);

  transfer_engine_t target = tcp_engine(), me = tcp_engine();
  unsigned char *target_host = calloc(1, LEN), *src = malloc(LEN);
  REQUIRE(target_host && src);
  te_fill(src, LEN, 42);
  /* Clients name GPU buffers "cpu:0" or "*" too: the engine asks the driver. */
  CHECK_EQ(registerLocalMemory(target, (void *)(uintptr_t)d_remote, LEN, "cpu:0", 1), 0);
  CHECK_EQ(registerLocalMemory(target, target_host, LEN, "cpu:0", 1), 0);
  CHECK_EQ(registerLocalMemory(me, (void *)(uintptr_t)d_local, LEN, "*", 1), 0);
  CHECK_EQ(registerLocalMemory(me, src, LEN, "cpu:0", 1), 0);
  char name[128];
  REQUIRE(getLocalIpAndPort(target, name, sizeof name) == 0);
  int seg = openSegment(me, name);
  REQUIRE(seg >= 0);
  void *dl = (void *)(uintptr_t)d_local;
  uint64_t host = (uint64_t)(uintptr_t)target_host;

  /* Into and out of the peer's GPU buffer: its data server refuses. */
  CHECK_EQ(run(me, OPCODE_WRITE, src, seg, d_remote, LEN), STATUS_FAILED);
  CHECK_EQ(run(me, OPCODE_READ, src, seg, d_remote + 4096, 4096), STATUS_FAILED);
  /* From and into this process's GPU buffer: refused before sending. */
  CHECK_EQ(run(me, OPCODE_WRITE, dl, seg, host, LEN), STATUS_FAILED);
  CHECK_EQ(run(me, OPCODE_READ, (char *)dl + 8, seg, host, 64), STATUS_FAILED);
  /* A copy within the engine. */
  CHECK_EQ(run(me, OPCODE_WRITE, src, LOCAL_SEGMENT, d_local, 4096), STATUS_FAILED);
  CHECK_EQ(run(me, OPCODE_WRITE, dl, LOCAL_SEGMENT, (uint64_t)(uintptr_t)src, 4096),
           STATUS_FAILED);
  CHECK_EQ(te_verify_byte(target_host, LEN, 0), TE_ALL_MATCH);
  CHECK_EQ(te_verify(src, LEN, 42), TE_ALL_MATCH);

  /* Host memory beside it moves every byte. */
  CHECK_EQ(run(me, OPCODE_WRITE, src, seg, host, LEN), STATUS_COMPLETED);
  CHECK_EQ(te_verify(target_host, LEN, 42), TE_ALL_MATCH);

  CHECK_EQ(unregisterLocalMemory(me, dl), 0);
  CHECK_EQ(unregisterLocalMemory(target, (void *)(uintptr_t)d_remote), 0);
  destroyTransferEngine(me);
  destroyTransferEngine(target);
  CHECK_EQ(cu_mem_free(d_local), 0);
  CHECK_EQ(cu_mem_free(d_remote), 0);
  free(target_host);
  free(src);
  return te_check_exit("gpu_memory");
}
