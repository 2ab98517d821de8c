/*
 * gpu_memory: GPU memory handed to the engine moves, and is never copied
 * with the CPU. Device memory from cuMemAlloc is registered (as Mooncake's
 * clients do, whatever location they name); then over TCP, between two
 * engines of this process, every WRITE and READ from, to or into it
 * COMPLETES, staged through host buffers with the driver's copies (host
 * to the peer's GPU and back, this process's GPU to the peer's host and
 * back, GPU to GPU, unaligned offsets and odd lengths, requests longer
 * than a staging piece), and so do copies within the engine (GPU to GPU,
 * host to GPU and back). Every byte of every buffer is checked after each
 * request, GPU memory with cuMemcpyDtoH against a host model of it, so
 * bytes outside a request's range must stay as they were. Ranges outside
 * the registered buffers are still refused before a byte moves.
 *
 * It uses only the CUDA driver API (cuInit, cuDeviceGet,
 * cuDevicePrimaryCtxRetain/Release, cuCtxSetCurrent, cuMemAlloc_v2,
 * cuMemFree_v2, cuMemcpyHtoD_v2, cuMemcpyDtoH_v2) and runs against
 * whatever libcuda.so.1 the loader finds: in ctest, the test double
 * (tests/support/cuda_driver_double.c; NOT a GPU, it says so); on a
 * machine with a GPU, the real driver and GPU 0 (scripts/gpu-check.sh).
 * Exit 77 (skipped) when there is no libcuda.so.1 at all.
 */
#include "transfer_engine_c.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "te_check.h"
#include "te_util.h"

/* Each GPU and host buffer. */
#define LEN ((size_t)4 << 20)
/* Longer than a staging piece (1 MiB), and not a multiple of one. */
#define BIG (((size_t)3 << 20) + 5)
/* An odd length, for unaligned offsets. */
#define ODD ((size_t)4093)
/* GPU memory never registered. */
#define SMALL ((size_t)4096)

typedef int (*cu_init_t)(unsigned int);
typedef int (*cu_device_get_t)(int *, int);
typedef int (*cu_ctx_retain_t)(void **, int);
typedef int (*cu_ctx_release_t)(int);
typedef int (*cu_ctx_set_t)(void *);
typedef int (*cu_mem_alloc_t)(uint64_t *, size_t);
typedef int (*cu_mem_free_t)(uint64_t);
typedef int (*cu_htod_t)(uint64_t, const void *, size_t);
typedef int (*cu_dtoh_t)(void *, uint64_t, size_t);

static cu_htod_t cu_htod;
static cu_dtoh_t cu_dtoh;
/* Where GPU memory is copied to be checked. */
static unsigned char *scratch;

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

/* The index of the first byte where `a` and `b` differ, or TE_ALL_MATCH. */
static size_t first_diff(const unsigned char *a, const unsigned char *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i]) return i;
  return TE_ALL_MATCH;
}

/* Fills the `n` bytes of GPU buffer `d` and its host model `model` with
 * pattern `seed`, copied in by the driver. */
static void dev_fill(uint64_t d, unsigned char *model, size_t n, uint64_t seed) {
  te_fill(model, n, seed);
  REQUIRE(cu_htod(d, model, n) == 0);
}

/* The first of the `n` bytes of GPU buffer `d` that differs from its
 * model, or TE_ALL_MATCH (copied out by the driver). */
static size_t dev_verify(uint64_t d, const unsigned char *model, size_t n) {
  memset(scratch, 0, n);
  REQUIRE(cu_dtoh(scratch, d, n) == 0);
  return first_diff(scratch, model, n);
}

static void *as_ptr(uint64_t d) { return (void *)(uintptr_t)d; }

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
  cu_ctx_release_t cu_ctx_release = (cu_ctx_release_t)sym(cuda, "cuDevicePrimaryCtxRelease_v2");
  cu_ctx_set_t cu_ctx_set = (cu_ctx_set_t)sym(cuda, "cuCtxSetCurrent");
  cu_mem_alloc_t cu_mem_alloc = (cu_mem_alloc_t)sym(cuda, "cuMemAlloc_v2");
  cu_mem_free_t cu_mem_free = (cu_mem_free_t)sym(cuda, "cuMemFree_v2");
  cu_htod = (cu_htod_t)sym(cuda, "cuMemcpyHtoD_v2");
  cu_dtoh = (cu_dtoh_t)sym(cuda, "cuMemcpyDtoH_v2");
  int dev = 0;
  void *ctx = NULL;
  uint64_t d_remote = 0, d_unreg = 0, d_local = 0, d_other = 0;
  REQUIRE(cu_init(0) == 0);
  REQUIRE(cu_device_get(&dev, 0) == 0);
  REQUIRE(cu_ctx_retain(&ctx, dev) == 0);
  REQUIRE(cu_ctx_set(ctx) == 0);
  REQUIRE(cu_mem_alloc(&d_remote, LEN) == 0);
  REQUIRE(cu_mem_alloc(&d_unreg, SMALL) == 0);
  REQUIRE(cu_mem_alloc(&d_local, LEN) == 0);
  REQUIRE(cu_mem_alloc(&d_other, LEN) == 0);

  /* Host models of the GPU buffers, host buffers, and what they should hold. */
  unsigned char *m_remote = malloc(LEN), *m_unreg = malloc(SMALL), *m_local = malloc(LEN),
                *m_other = malloc(LEN), *want = malloc(LEN);
  unsigned char *target_host = calloc(1, LEN), *src = malloc(LEN), *dst = calloc(1, LEN);
  scratch = malloc(LEN);
  REQUIRE(m_remote && m_unreg && m_local && m_other && want && target_host && src && dst &&
          scratch);
  te_fill(src, LEN, 42);

  transfer_engine_t target = tcp_engine(), me = tcp_engine();
  /* Clients name GPU buffers "cpu:0" or "*" too: the engine asks the driver. */
  CHECK_EQ(registerLocalMemory(target, as_ptr(d_remote), LEN, "cpu:0", 1), 0);
  CHECK_EQ(registerLocalMemory(target, target_host, LEN, "cpu:0", 1), 0);
  CHECK_EQ(registerLocalMemory(me, as_ptr(d_local), LEN, "*", 1), 0);
  CHECK_EQ(registerLocalMemory(me, as_ptr(d_other), LEN, "cuda:0", 1), 0);
  CHECK_EQ(registerLocalMemory(me, src, LEN, "cpu:0", 1), 0);
  CHECK_EQ(registerLocalMemory(me, dst, LEN, "cpu:0", 1), 0);
  char name[128], my_name[128];
  REQUIRE(getLocalIpAndPort(target, name, sizeof name) == 0);
  REQUIRE(getLocalIpAndPort(me, my_name, sizeof my_name) == 0);
  int seg = openSegment(me, name);
  REQUIRE(seg >= 0);
  int self = openSegment(me, my_name);
  CHECK_EQ(self, LOCAL_SEGMENT);
  void *dl = as_ptr(d_local);
  uint64_t host = (uint64_t)(uintptr_t)target_host;
  uint64_t dst_addr = (uint64_t)(uintptr_t)dst;

  /* Host -> the peer's GPU buffer (WRITE), and back (READ). */
  dev_fill(d_remote, m_remote, LEN, 1);
  CHECK_EQ(run(me, OPCODE_WRITE, src, seg, d_remote, LEN), STATUS_COMPLETED);
  memcpy(m_remote, src, LEN);
  CHECK_EQ(dev_verify(d_remote, m_remote, LEN), TE_ALL_MATCH);
  dev_fill(d_remote, m_remote, LEN, 2);
  CHECK_EQ(run(me, OPCODE_READ, dst, seg, d_remote, LEN), STATUS_COMPLETED);
  CHECK_EQ(first_diff(dst, m_remote, LEN), TE_ALL_MATCH);

  /* This process's GPU buffer -> the peer's host buffer (WRITE), and back. */
  dev_fill(d_local, m_local, LEN, 3);
  CHECK_EQ(run(me, OPCODE_WRITE, dl, seg, host, LEN), STATUS_COMPLETED);
  CHECK_EQ(first_diff(target_host, m_local, LEN), TE_ALL_MATCH);
  te_fill(target_host, LEN, 4);
  CHECK_EQ(run(me, OPCODE_READ, dl, seg, host, LEN), STATUS_COMPLETED);
  memcpy(m_local, target_host, LEN);
  CHECK_EQ(dev_verify(d_local, m_local, LEN), TE_ALL_MATCH);

  /* GPU -> GPU across the engines, both ways. */
  dev_fill(d_local, m_local, LEN, 5);
  dev_fill(d_remote, m_remote, LEN, 6);
  CHECK_EQ(run(me, OPCODE_WRITE, dl, seg, d_remote, LEN), STATUS_COMPLETED);
  memcpy(m_remote, m_local, LEN);
  CHECK_EQ(dev_verify(d_remote, m_remote, LEN), TE_ALL_MATCH);
  dev_fill(d_remote, m_remote, LEN, 7);
  CHECK_EQ(run(me, OPCODE_READ, dl, seg, d_remote, LEN), STATUS_COMPLETED);
  memcpy(m_local, m_remote, LEN);
  CHECK_EQ(dev_verify(d_local, m_local, LEN), TE_ALL_MATCH);

  /* Unaligned offsets and an odd length: those bytes move, no others. */
  dev_fill(d_local, m_local, LEN, 8);
  dev_fill(d_remote, m_remote, LEN, 9);
  CHECK_EQ(run(me, OPCODE_WRITE, (char *)dl + 8, seg, d_remote + 4099, ODD), STATUS_COMPLETED);
  memcpy(m_remote + 4099, m_local + 8, ODD);
  CHECK_EQ(dev_verify(d_remote, m_remote, LEN), TE_ALL_MATCH);
  CHECK_EQ(run(me, OPCODE_READ, (char *)dl + 13, seg, d_remote + 1, ODD), STATUS_COMPLETED);
  memcpy(m_local + 13, m_remote + 1, ODD);
  CHECK_EQ(dev_verify(d_local, m_local, LEN), TE_ALL_MATCH);
  memset(dst, 0, LEN);
  memset(want, 0, LEN);
  CHECK_EQ(run(me, OPCODE_READ, dst + 5, seg, d_remote + 777, ODD), STATUS_COMPLETED);
  memcpy(want + 5, m_remote + 777, ODD);
  CHECK_EQ(first_diff(dst, want, LEN), TE_ALL_MATCH);
  te_fill(target_host, LEN, 10);
  memcpy(want, target_host, LEN);
  CHECK_EQ(run(me, OPCODE_WRITE, (char *)dl + 1, seg, host + 3, ODD), STATUS_COMPLETED);
  memcpy(want + 3, m_local + 1, ODD);
  CHECK_EQ(first_diff(target_host, want, LEN), TE_ALL_MATCH);

  /* Longer than a staging piece: cut into pieces, every byte moves. */
  dev_fill(d_remote, m_remote, LEN, 11);
  CHECK_EQ(run(me, OPCODE_WRITE, src + 3, seg, d_remote + 1, BIG), STATUS_COMPLETED);
  memcpy(m_remote + 1, src + 3, BIG);
  CHECK_EQ(dev_verify(d_remote, m_remote, LEN), TE_ALL_MATCH);
  dev_fill(d_local, m_local, LEN, 12);
  CHECK_EQ(run(me, OPCODE_READ, (char *)dl + 7, seg, d_remote + 1, BIG), STATUS_COMPLETED);
  memcpy(m_local + 7, m_remote + 1, BIG);
  CHECK_EQ(dev_verify(d_local, m_local, LEN), TE_ALL_MATCH);
  te_fill(target_host, LEN, 13);
  memcpy(want, target_host, LEN);
  CHECK_EQ(run(me, OPCODE_WRITE, (char *)dl + 7, seg, host + 9, BIG), STATUS_COMPLETED);
  memcpy(want + 9, m_local + 7, BIG);
  CHECK_EQ(first_diff(target_host, want, LEN), TE_ALL_MATCH);
  memset(dst, 0, LEN);
  memset(want, 0, LEN);
  CHECK_EQ(run(me, OPCODE_READ, dst + 2, seg, d_remote + 5, BIG), STATUS_COMPLETED);
  memcpy(want + 2, m_remote + 5, BIG);
  CHECK_EQ(first_diff(dst, want, LEN), TE_ALL_MATCH);

  /* Copies within the engine (its own segment): GPU -> GPU, host -> GPU,
   * GPU -> host, and READs the other way. */
  dev_fill(d_local, m_local, LEN, 14);
  dev_fill(d_other, m_other, LEN, 15);
  CHECK_EQ(run(me, OPCODE_WRITE, dl, self, d_other, LEN), STATUS_COMPLETED);
  memcpy(m_other, m_local, LEN);
  CHECK_EQ(dev_verify(d_other, m_other, LEN), TE_ALL_MATCH);
  CHECK_EQ(run(me, OPCODE_WRITE, src + 1, self, d_local + 5, BIG), STATUS_COMPLETED);
  memcpy(m_local + 5, src + 1, BIG);
  CHECK_EQ(dev_verify(d_local, m_local, LEN), TE_ALL_MATCH);
  memset(dst, 0, LEN);
  memset(want, 0, LEN);
  CHECK_EQ(run(me, OPCODE_WRITE, (char *)dl + 2, self, dst_addr + 11, ODD), STATUS_COMPLETED);
  memcpy(want + 11, m_local + 2, ODD);
  CHECK_EQ(first_diff(dst, want, LEN), TE_ALL_MATCH);
  CHECK_EQ(run(me, OPCODE_READ, dst + 1, self, d_other + 3, BIG), STATUS_COMPLETED);
  memcpy(want + 1, m_other + 3, BIG);
  CHECK_EQ(first_diff(dst, want, LEN), TE_ALL_MATCH);
  dev_fill(d_other, m_other, LEN, 16);
  CHECK_EQ(run(me, OPCODE_READ, (char *)dl + 9, self, d_other + 17, ODD), STATUS_COMPLETED);
  memcpy(m_local + 9, m_other + 17, ODD);
  CHECK_EQ(dev_verify(d_local, m_local, LEN), TE_ALL_MATCH);

  /* Still refused before a byte moves: ranges past the end of a
   * registered GPU buffer, and GPU memory never registered. */
  dev_fill(d_unreg, m_unreg, SMALL, 17);
  CHECK_EQ(run(me, OPCODE_WRITE, src, seg, d_remote + LEN - 100, 200), STATUS_FAILED);
  CHECK_EQ(run(me, OPCODE_READ, dl, seg, d_remote + LEN - 1, 2), STATUS_FAILED);
  CHECK_EQ(run(me, OPCODE_WRITE, src, seg, d_unreg, SMALL), STATUS_FAILED);
  CHECK_EQ(run(me, OPCODE_WRITE, src, self, d_other + LEN - 8, 16), STATUS_FAILED);
  CHECK_EQ(run(me, OPCODE_WRITE, src, self, d_unreg, SMALL), STATUS_FAILED);
  CHECK_EQ(dev_verify(d_remote, m_remote, LEN), TE_ALL_MATCH);
  CHECK_EQ(dev_verify(d_local, m_local, LEN), TE_ALL_MATCH);
  CHECK_EQ(dev_verify(d_other, m_other, LEN), TE_ALL_MATCH);
  CHECK_EQ(dev_verify(d_unreg, m_unreg, SMALL), TE_ALL_MATCH);

  /* Host memory beside it moves every byte, and the source never changed. */
  CHECK_EQ(run(me, OPCODE_WRITE, src, seg, host, LEN), STATUS_COMPLETED);
  CHECK_EQ(te_verify(target_host, LEN, 42), TE_ALL_MATCH);
  CHECK_EQ(te_verify(src, LEN, 42), TE_ALL_MATCH);

  CHECK_EQ(unregisterLocalMemory(me, dl), 0);
  CHECK_EQ(unregisterLocalMemory(me, as_ptr(d_other)), 0);
  CHECK_EQ(unregisterLocalMemory(target, as_ptr(d_remote)), 0);
  destroyTransferEngine(me);
  destroyTransferEngine(target);
  CHECK_EQ(cu_mem_free(d_other), 0);
  CHECK_EQ(cu_mem_free(d_local), 0);
  CHECK_EQ(cu_mem_free(d_unreg), 0);
  CHECK_EQ(cu_mem_free(d_remote), 0);
  CHECK_EQ(cu_ctx_release(dev), 0);
  free(m_remote);
  free(m_unreg);
  free(m_local);
  free(m_other);
  free(want);
  free(target_host);
  free(src);
  free(dst);
  free(scratch);
  return te_check_exit("gpu_memory");
}
