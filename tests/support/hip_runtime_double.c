/*
 * A test double of the HIP runtime (libamdhip64.so.6) for the engine's
 * GPU memory detection: NOT a GPU, and no GPU coverage.
 *
 * It answers hipRuntimeGetVersion (ROCm 6.2) and hipPointerGetAttributes
 * as the runtime does, for "device memory" it hands out itself with
 * te_hip_double_alloc: pages mapped PROT_NONE, so any CPU access to them
 * kills the process, as a CPU touching real device memory would. Any
 * other address is unknown to it (hipErrorInvalidValue).
 *
 * Built by the tests with: cc -shared -fPIC -Wl,-soname,libamdhip64.so.6
 */
#include "device_memory_double.h"

#define HIP_SUCCESS 0
#define HIP_ERROR_INVALID_VALUE 1
/* hipMemoryTypeDevice since ROCm 6. */
#define HIP_MEMORY_TYPE_DEVICE 2

struct hip_pointer_attribute {
  int type;
  int device;
  void *device_pointer;
  void *host_pointer;
  int is_managed;
  unsigned allocation_flags;
};

int hipRuntimeGetVersion(int *version) {
  if (version == NULL) return HIP_ERROR_INVALID_VALUE;
  *version = 60200000;
  return HIP_SUCCESS;
}

int hipPointerGetAttributes(struct hip_pointer_attribute *a, const void *ptr) {
  if (a == NULL) return HIP_ERROR_INVALID_VALUE;
  int ordinal = device_memory_ordinal((uintptr_t)ptr);
  if (ordinal >= 0) {
    a->type = HIP_MEMORY_TYPE_DEVICE;
    a->device = ordinal;
    a->device_pointer = (void *)ptr;
    a->host_pointer = NULL;
    a->is_managed = 0;
    a->allocation_flags = 0;
    return HIP_SUCCESS;
  }
  return HIP_ERROR_INVALID_VALUE;
}

/* "Device memory" of GPU `ordinal`: `len` bytes no CPU access survives. */
void *te_hip_double_alloc(size_t len, int ordinal) { return device_memory_alloc(len, ordinal); }
