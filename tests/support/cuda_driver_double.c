/*
 * A test double of the CUDA driver (libcuda.so.1) for the engine's GPU
 * memory detection: NOT a GPU, and no GPU coverage.
 *
 * It answers cuInit and cuPointerGetAttribute as the driver does, for
 * "device memory" it hands out itself with te_cuda_double_alloc: pages
 * mapped PROT_NONE, so any CPU access to them kills the process, as a
 * CPU touching real device memory would. Any other address is unknown to
 * it (CUDA_ERROR_INVALID_VALUE), as host memory is to the real driver.
 * The few calls a program makes to get device memory (cuDeviceGet,
 * cuDevicePrimaryCtxRetain, cuCtxSetCurrent, cuMemAlloc_v2, cuMemFree_v2)
 * are answered too, so ctests/gpu_memory.c runs unchanged against it and
 * against the real driver (scripts/gpu-check.sh).
 *
 * Built by the tests with: cc -shared -fPIC -Wl,-soname,libcuda.so.1
 * With -DTE_DOUBLE_MUSA it is a double of MUSA's driver (libmusa.so.1),
 * whose API mirrors CUDA's: muInit and muPointerGetAttribute.
 */
#include "device_memory_double.h"

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_MEMORYTYPE_DEVICE 2

#ifdef TE_DOUBLE_MUSA
#define cuInit muInit
#define cuPointerGetAttribute muPointerGetAttribute
#endif

static int initialised;
static long attribute_queries;

int cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  initialised = 1;
  return CUDA_SUCCESS;
}

int cuPointerGetAttribute(void *data, int attribute, uint64_t ptr) {
  __atomic_add_fetch(&attribute_queries, 1, __ATOMIC_RELAXED);
  if (!initialised) return 3; /* CUDA_ERROR_NOT_INITIALIZED */
  int i = device_memory_find((uintptr_t)ptr);
  if (i >= 0) {
    switch (attribute) {
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned int *)data = 0;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = allocations[i].ordinal;
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

/* "Device memory" of GPU `ordinal`: `len` bytes no CPU access survives. */
void *te_cuda_double_alloc(size_t len, int ordinal) { return device_memory_alloc(len, ordinal); }

int cuDeviceGet(int *device, int ordinal) {
  if (ordinal < 0) return CUDA_ERROR_INVALID_VALUE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

int cuDevicePrimaryCtxRetain(void **ctx, int device) {
  *ctx = (void *)(uintptr_t)(device + 1);
  return CUDA_SUCCESS;
}

static int current_device;

int cuCtxSetCurrent(void *ctx) {
  current_device = (int)((uintptr_t)ctx - 1);
  return CUDA_SUCCESS;
}

int cuMemAlloc_v2(uint64_t *dptr, size_t len) {
  void *p = te_cuda_double_alloc(len, current_device);
  if (p == NULL) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  *dptr = (uint64_t)(uintptr_t)p;
  return CUDA_SUCCESS;
}

int cuMemFree_v2(uint64_t dptr) {
  return device_memory_free((uintptr_t)dptr) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* How many times cuPointerGetAttribute was asked. */
long te_cuda_double_queries(void) { return __atomic_load_n(&attribute_queries, __ATOMIC_RELAXED); }
