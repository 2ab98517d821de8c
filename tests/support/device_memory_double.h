/*
 * The "device memory" of the GPU library test doubles
 * (cuda_driver_double.c, hip_runtime_double.c): NOT a GPU, and no GPU
 * coverage. Each allocation is pages mapped PROT_NONE, so any CPU access
 * to them kills the process, as a CPU touching real device memory would,
 * and is known with the GPU ordinal it was made for.
 *
 * The bytes the "device" holds live in a hidden host "shadow" store of the
 * allocation's length (calloc'd, so they start zeroed, and freed with the
 * allocation), which only the doubles' copy calls and test helpers reach
 * (device_memory_copy, device_memory_shadow_fill), never the mapping.
 *
 * The table is shared by threads: allocating and freeing take its lock for
 * writing; lookups and copies take it for reading, so copies from many
 * threads run at once and a free waits for the copies that use it. An
 * allocation keeps its slot (its index) until it is freed.
 */
#ifndef TE_DEVICE_MEMORY_DOUBLE_H
#define TE_DEVICE_MEMORY_DOUBLE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_ALLOCATIONS 256

/* A slot is free while its base is 0. */
static struct {
  uintptr_t base;
  size_t len;
  int ordinal;
  unsigned char *shadow;
} allocations[MAX_ALLOCATIONS];
/* Slots ever used: [0, allocation_count). */
static int allocation_count;
static pthread_rwlock_t allocation_lock = PTHREAD_RWLOCK_INITIALIZER;

/* `len` bytes of "device memory" of GPU `ordinal`, or NULL. */
static inline void *device_memory_alloc(size_t len, int ordinal) {
  if (len == 0) return NULL;
  unsigned char *shadow = calloc(1, len);
  if (shadow == NULL) return NULL;
  void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    free(shadow);
    return NULL;
  }
  pthread_rwlock_wrlock(&allocation_lock);
  int slot = -1;
  for (int i = 0; i < allocation_count && slot < 0; i++)
    if (allocations[i].base == 0) slot = i;
  if (slot < 0 && allocation_count < MAX_ALLOCATIONS) slot = allocation_count++;
  if (slot >= 0) {
    allocations[slot].len = len;
    allocations[slot].ordinal = ordinal;
    allocations[slot].shadow = shadow;
    allocations[slot].base = (uintptr_t)p;
  }
  pthread_rwlock_unlock(&allocation_lock);
  if (slot < 0) {
    munmap(p, len);
    free(shadow);
    return NULL;
  }
  return p;
}

/* Unlocked: the index of the allocation holding `p`, or -1. */
static inline int device_memory_find_locked(uintptr_t p) {
  for (int i = 0; i < allocation_count; i++)
    if (allocations[i].base != 0 && p >= allocations[i].base &&
        p - allocations[i].base < allocations[i].len)
      return i;
  return -1;
}

/* The index of the allocation holding `p`, or -1 (valid until that
 * allocation is freed). */
static inline int device_memory_find(uintptr_t p) {
  pthread_rwlock_rdlock(&allocation_lock);
  int i = device_memory_find_locked(p);
  pthread_rwlock_unlock(&allocation_lock);
  return i;
}

/* The GPU ordinal of the allocation holding `p`, or -1. */
static inline int device_memory_ordinal(uintptr_t p) {
  pthread_rwlock_rdlock(&allocation_lock);
  int i = device_memory_find_locked(p);
  int ordinal = i >= 0 ? allocations[i].ordinal : -1;
  pthread_rwlock_unlock(&allocation_lock);
  return ordinal;
}

/* Unlocked: whether [p, p + n) touches any allocation. */
static inline int device_memory_overlaps_locked(uintptr_t p, size_t n) {
  for (int i = 0; i < allocation_count; i++)
    if (allocations[i].base != 0 && p < allocations[i].base + allocations[i].len &&
        allocations[i].base < p + n)
      return 1;
  return 0;
}

/* Unlocked: where the bytes of [p, p + n) (n > 0) are: the shadow of the
 * allocation holding all of it (*device = 1), the memory itself where no
 * allocation touches it (*device = 0), or NULL when it runs out of its
 * allocation, into one, or past the end of the address space. */
static inline unsigned char *device_memory_bytes_locked(uintptr_t p, size_t n, int *device) {
  if (p + n < p) return NULL;
  int i = device_memory_find_locked(p);
  if (i < 0) {
    *device = 0;
    return device_memory_overlaps_locked(p, n) ? NULL : (unsigned char *)p;
  }
  *device = 1;
  if (n > allocations[i].len - (p - allocations[i].base)) return NULL;
  return allocations[i].shadow + (p - allocations[i].base);
}

/* What each side of a copy must be. */
#define DEVICE_MEMORY_ANY 0
#define DEVICE_MEMORY_DEVICE 1

/*
 * Copies n bytes from src to dst (memmove semantics); each side is the
 * shadow of "device memory" when it starts in an allocation (all of it
 * must then lie in that one), else host memory used directly (which must
 * touch no allocation). `src_must` / `dst_must`: DEVICE_MEMORY_DEVICE
 * where that side has to be device memory. 0 (always for n == 0), or -1
 * (nothing copied).
 */
static inline int device_memory_copy(uintptr_t dst, uintptr_t src, size_t n, int dst_must,
                                     int src_must) {
  if (n == 0) return 0;
  pthread_rwlock_rdlock(&allocation_lock);
  int dst_device = 0, src_device = 0, rc = -1;
  unsigned char *to = device_memory_bytes_locked(dst, n, &dst_device);
  unsigned char *from = device_memory_bytes_locked(src, n, &src_device);
  if (to != NULL && from != NULL && (dst_device || !dst_must) && (src_device || !src_must)) {
    memmove(to, from, n);
    rc = 0;
  }
  pthread_rwlock_unlock(&allocation_lock);
  return rc;
}

/* Test helper: writes byte i of [p, p + n) = (seed + i) % 251 into the
 * shadow, where all of it lies in one allocation: 0, or -1. */
static inline int device_memory_shadow_fill(uintptr_t p, uint8_t seed, size_t n) {
  int rc = -1;
  pthread_rwlock_rdlock(&allocation_lock);
  int device = 0;
  unsigned char *to = n ? device_memory_bytes_locked(p, n, &device) : NULL;
  if (n == 0) {
    rc = device_memory_find_locked(p) >= 0 ? 0 : -1;
  } else if (to != NULL && device) {
    for (size_t i = 0; i < n; i++) to[i] = (unsigned char)(((size_t)seed + i) % 251);
    rc = 0;
  }
  pthread_rwlock_unlock(&allocation_lock);
  return rc;
}

/* Frees the allocation starting at `base` with its shadow: 0, or -1 if
 * there is none. */
static inline int device_memory_free(uintptr_t base) {
  if (base == 0) return -1;
  pthread_rwlock_wrlock(&allocation_lock);
  int found = -1;
  for (int i = 0; i < allocation_count && found < 0; i++)
    if (allocations[i].base == base) found = i;
  size_t len = 0;
  unsigned char *shadow = NULL;
  if (found >= 0) {
    len = allocations[found].len;
    shadow = allocations[found].shadow;
    allocations[found].base = 0;
    allocations[found].len = 0;
    allocations[found].shadow = NULL;
  }
  pthread_rwlock_unlock(&allocation_lock);
  if (found < 0) return -1;
  munmap((void *)base, len);
  free(shadow);
  return 0;
}

#endif
