/*
 * A test double of the CUDA driver (libcuda.so.1) for the engine's GPU
 * memory detection and its copies of GPU memory: NOT a GPU, and no GPU
 * coverage. Nothing here runs on a device; it only answers the driver's
 * calls as the real driver would, so the engine's code paths around them
 * run.
 *
 * It answers cuInit and cuPointerGetAttribute as the driver does, for
 * "device memory" it hands out itself (te_cuda_double_alloc,
 * cuMemAlloc_v2): pages mapped PROT_NONE, so any CPU access to them kills
 * the process, as a CPU touching real device memory would. Their bytes
 * live in a hidden host shadow store (device_memory_double.h) that only
 * the copy calls below and the te_cuda_double_* helpers reach. Host memory
 * is unknown to cuPointerGetAttribute (CUDA_ERROR_INVALID_VALUE), as it is
 * to the real driver, except pinned memory from cuMemHostAlloc
 * (CU_MEMORYTYPE_HOST).
 *
 * The driver API it answers (signatures as in cuda.h: CUdeviceptr is
 * uint64_t, CUcontext an opaque pointer, CUresult int):
 *   cuInit, cuDeviceGet, cuPointerGetAttribute;
 *   cuDevicePrimaryCtxRetain (the context of device d, 0..7, is the value
 *     d + 1), cuDevicePrimaryCtxRelease_v2;
 *   the calling thread's context stack (thread-local, as the driver's):
 *     cuCtxSetCurrent (replaces the top, or pushes onto an empty stack;
 *     NULL pops the top), cuCtxGetCurrent, cuCtxPushCurrent_v2,
 *     cuCtxPopCurrent_v2;
 *   cuMemAlloc_v2 (on the device of the current context), cuMemFree_v2;
 *   cuMemHostAlloc (page-aligned heap memory standing for pinned memory),
 *     cuMemFreeHost;
 *   cuMemcpy (unified addressing: a side starting in "device memory" must
 *     lie in that one allocation, any other address is host memory used
 *     directly), cuMemcpyDtoH_v2 and cuMemcpyHtoD_v2 (whose device side
 *     must be device memory); memmove semantics. Allocating and copying
 *     need a current context on the calling thread
 *     (CUDA_ERROR_INVALID_CONTEXT without one).
 * So ctests/gpu_memory.c runs unchanged against it and against the real
 * driver (scripts/gpu-check.sh).
 *
 * Test helpers, which need no context and make no copy the counter sees:
 *   void *te_cuda_double_alloc(size_t len, int ordinal): device memory;
 *   int te_cuda_double_fill(uint64_t dptr, uint8_t seed, size_t n): byte i
 *     of the device range becomes (seed + i) % 251;
 *   int te_cuda_double_write(uint64_t dptr, const void *src, size_t n),
 *   int te_cuda_double_read(void *dst, uint64_t dptr, size_t n): bytes
 *     into and out of device memory;
 *     (these three: 0, or -1 where the range is not inside one allocation)
 *   long te_cuda_double_queries(void): cuPointerGetAttribute calls;
 *   long te_cuda_double_copies(void): successful cuMemcpy* calls;
 *   long te_cuda_double_pinned(void): cuMemHostAlloc allocations live.
 *
 * Built by the tests with: cc -shared -fPIC -Wl,-soname,libcuda.so.1
 * With -DTE_DOUBLE_MUSA it is a double of MUSA's driver (libmusa.so.1),
 * whose API mirrors CUDA's: muInit and muPointerGetAttribute (the other
 * calls keep their CUDA names there).
 */
#include "device_memory_double.h"

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_MEMORYTYPE_HOST 1
#define CU_MEMORYTYPE_DEVICE 2
/* CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED */
#define CU_MEMHOSTALLOC_FLAGS 7u

/* Devices 0..MAX_DEVICES-1 exist. */
#define MAX_DEVICES 8
/* How deep a thread's context stack may grow. */
#define MAX_CONTEXT_DEPTH 64

#ifdef TE_DOUBLE_MUSA
#define cuInit muInit
#define cuPointerGetAttribute muPointerGetAttribute
#endif

typedef int CUresult;
typedef void *CUcontext;
typedef uint64_t CUdeviceptr;

static int initialised;
static long attribute_queries;
static long copies;

/* The calling thread's context stack (contexts are device + 1). */
static __thread CUcontext context_stack[MAX_CONTEXT_DEPTH];
static __thread int context_depth;

/* Pinned host allocations live: start, length, device. */
static struct pinned {
  void *p;
  size_t len;
  int device;
} *pinned_table;
static long pinned_count, pinned_capacity;
static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;

static int is_initialised(void) { return __atomic_load_n(&initialised, __ATOMIC_ACQUIRE); }

/* The device of context `ctx`, or -1 if it is none of the primary ones. */
static int context_device(CUcontext ctx) {
  uintptr_t v = (uintptr_t)ctx;
  return v >= 1 && v <= MAX_DEVICES ? (int)(v - 1) : -1;
}

/* The device of the calling thread's current context, or -1. */
static int current_device(void) {
  return context_depth > 0 ? context_device(context_stack[context_depth - 1]) : -1;
}

/* The device of the pinned allocation holding [p, p + 1), or -1. */
static int pinned_device(uintptr_t p) {
  int device = -1;
  pthread_mutex_lock(&pinned_lock);
  for (long i = 0; i < pinned_count && device < 0; i++)
    if (p >= (uintptr_t)pinned_table[i].p && p - (uintptr_t)pinned_table[i].p < pinned_table[i].len)
      device = pinned_table[i].device;
  pthread_mutex_unlock(&pinned_lock);
  return device;
}

CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  __atomic_store_n(&initialised, 1, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
  __atomic_add_fetch(&attribute_queries, 1, __ATOMIC_RELAXED);
  if (!is_initialised()) return CUDA_ERROR_NOT_INITIALIZED;
  if (data == NULL) return CUDA_ERROR_INVALID_VALUE;
  int ordinal = -1;
  unsigned int type = 0;
  pthread_rwlock_rdlock(&allocation_lock);
  int i = device_memory_find_locked((uintptr_t)ptr);
  if (i >= 0) {
    type = CU_MEMORYTYPE_DEVICE;
    ordinal = allocations[i].ordinal;
  }
  pthread_rwlock_unlock(&allocation_lock);
  if (i < 0 && (ordinal = pinned_device((uintptr_t)ptr)) >= 0) type = CU_MEMORYTYPE_HOST;
  if (type == 0) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *(CUcontext *)data = (CUcontext)(uintptr_t)(ordinal + 1);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *(unsigned int *)data = type;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *(unsigned int *)data = 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *(int *)data = ordinal;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult cuDeviceGet(int *device, int ordinal) {
  if (!is_initialised()) return CUDA_ERROR_NOT_INITIALIZED;
  if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= MAX_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, int device) {
  if (!is_initialised()) return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (device < 0 || device >= MAX_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = (CUcontext)(uintptr_t)(device + 1);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(int device) {
  if (!is_initialised()) return CUDA_ERROR_NOT_INITIALIZED;
  if (device < 0 || device >= MAX_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (ctx == NULL) {
    if (context_depth > 0) context_depth--;
    return CUDA_SUCCESS;
  }
  if (context_device(ctx) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (context_depth == 0) context_depth = 1;
  context_stack[context_depth - 1] = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *ctx) {
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  *ctx = context_depth > 0 ? context_stack[context_depth - 1] : NULL;
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  if (context_device(ctx) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (context_depth == MAX_CONTEXT_DEPTH) return CUDA_ERROR_OUT_OF_MEMORY;
  context_stack[context_depth++] = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
  if (context_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  context_depth--;
  if (ctx != NULL) *ctx = context_stack[context_depth];
  return CUDA_SUCCESS;
}

/* "Device memory" of GPU `ordinal`: `len` bytes no CPU access survives. */
void *te_cuda_double_alloc(size_t len, int ordinal) { return device_memory_alloc(len, ordinal); }

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t len) {
  if (!is_initialised()) return CUDA_ERROR_NOT_INITIALIZED;
  int device = current_device();
  if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (dptr == NULL || len == 0) return CUDA_ERROR_INVALID_VALUE;
  void *p = device_memory_alloc(len, device);
  if (p == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  *dptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return device_memory_free((uintptr_t)dptr) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags) {
  if (!is_initialised()) return CUDA_ERROR_NOT_INITIALIZED;
  int device = current_device();
  if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (pp == NULL || bytes == 0 || (flags & ~CU_MEMHOSTALLOC_FLAGS) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  void *p = NULL;
  if (posix_memalign(&p, 4096, bytes) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&pinned_lock);
  if (pinned_count == pinned_capacity) {
    long capacity = pinned_capacity ? 2 * pinned_capacity : 16;
    struct pinned *grown = realloc(pinned_table, (size_t)capacity * sizeof *pinned_table);
    if (grown == NULL) {
      pthread_mutex_unlock(&pinned_lock);
      free(p);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pinned_table = grown;
    pinned_capacity = capacity;
  }
  pinned_table[pinned_count].p = p;
  pinned_table[pinned_count].len = bytes;
  pinned_table[pinned_count].device = device;
  pinned_count++;
  pthread_mutex_unlock(&pinned_lock);
  *pp = p;
  return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
  int found = 0;
  pthread_mutex_lock(&pinned_lock);
  for (long i = 0; i < pinned_count && !found; i++) {
    if (pinned_table[i].p != p) continue;
    pinned_table[i] = pinned_table[--pinned_count];
    found = 1;
  }
  if (pinned_count == 0) {
    free(pinned_table);
    pinned_table = NULL;
    pinned_capacity = 0;
  }
  pthread_mutex_unlock(&pinned_lock);
  if (!found) return CUDA_ERROR_INVALID_VALUE;
  free(p);
  return CUDA_SUCCESS;
}

/* One copy call: the context check, the copy, the count. */
static CUresult copy(uintptr_t dst, uintptr_t src, size_t n, int dst_must, int src_must) {
  if (!is_initialised()) return CUDA_ERROR_NOT_INITIALIZED;
  if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (device_memory_copy(dst, src, n, dst_must, src_must) != 0) return CUDA_ERROR_INVALID_VALUE;
  __atomic_add_fetch(&copies, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy((uintptr_t)dst, (uintptr_t)src, n, DEVICE_MEMORY_ANY, DEVICE_MEMORY_ANY);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  return copy((uintptr_t)dst, (uintptr_t)src, n, DEVICE_MEMORY_ANY, DEVICE_MEMORY_DEVICE);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  return copy((uintptr_t)dst, (uintptr_t)src, n, DEVICE_MEMORY_DEVICE, DEVICE_MEMORY_ANY);
}

/* Test helper: byte i of [dptr, dptr + n) becomes (seed + i) % 251. */
int te_cuda_double_fill(uint64_t dptr, uint8_t seed, size_t n) {
  return device_memory_shadow_fill((uintptr_t)dptr, seed, n);
}

/* Test helper: n bytes from host `src` into device memory at `dptr`. */
int te_cuda_double_write(uint64_t dptr, const void *src, size_t n) {
  return device_memory_copy((uintptr_t)dptr, (uintptr_t)src, n, DEVICE_MEMORY_DEVICE,
                            DEVICE_MEMORY_ANY);
}

/* Test helper: n bytes of device memory at `dptr` into host `dst`. */
int te_cuda_double_read(void *dst, uint64_t dptr, size_t n) {
  return device_memory_copy((uintptr_t)dst, (uintptr_t)dptr, n, DEVICE_MEMORY_ANY,
                            DEVICE_MEMORY_DEVICE);
}

/* How many times cuPointerGetAttribute was asked. */
long te_cuda_double_queries(void) { return __atomic_load_n(&attribute_queries, __ATOMIC_RELAXED); }

/* How many cuMemcpy, cuMemcpyDtoH_v2 and cuMemcpyHtoD_v2 calls copied. */
long te_cuda_double_copies(void) { return __atomic_load_n(&copies, __ATOMIC_RELAXED); }

/* How many cuMemHostAlloc allocations are live. */
long te_cuda_double_pinned(void) {
  pthread_mutex_lock(&pinned_lock);
  long n = pinned_count;
  pthread_mutex_unlock(&pinned_lock);
  return n;
}
