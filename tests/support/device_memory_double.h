/*
 * The "device memory" of the GPU library test doubles
 * (cuda_driver_double.c, hip_runtime_double.c): NOT a GPU. Each
 * allocation is pages mapped PROT_NONE, so any CPU access to them kills
 * the process, as a CPU touching real device memory would, and is known
 * with the GPU ordinal it was made for.
 */
#ifndef TE_DEVICE_MEMORY_DOUBLE_H
#define TE_DEVICE_MEMORY_DOUBLE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#define MAX_ALLOCATIONS 64

static struct {
  uintptr_t base;
  size_t len;
  int ordinal;
} allocations[MAX_ALLOCATIONS];
static int allocation_count;

/* `len` bytes of "device memory" of GPU `ordinal`, or NULL. */
static inline void *device_memory_alloc(size_t len, int ordinal) {
  if (allocation_count == MAX_ALLOCATIONS) return NULL;
  void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  allocations[allocation_count].base = (uintptr_t)p;
  allocations[allocation_count].len = len;
  allocations[allocation_count].ordinal = ordinal;
  allocation_count++;
  return p;
}

/* The index of the allocation holding `p`, or -1. */
static inline int device_memory_find(uintptr_t p) {
  for (int i = 0; i < allocation_count; i++)
    if (p >= allocations[i].base && p - allocations[i].base < allocations[i].len) return i;
  return -1;
}

/* Frees the allocation starting at `base`: 0, or -1 if there is none. */
static inline int device_memory_free(uintptr_t base) {
  for (int i = 0; i < allocation_count; i++) {
    if (allocations[i].base != base) continue;
    munmap((void *)allocations[i].base, allocations[i].len);
    allocations[i] = allocations[--allocation_count];
    return 0;
  }
  return -1;
}

#endif
