/*
 * dlopen_cycle: the library survives being loaded, used and unloaded three
 * times in one process, and leaves no thread behind. This program does not
 * link against libtransfer_engine: it dlopen()s the .so by absolute path
 * (argv[1], else the path CMake compiled in), looks every function up with
 * dlsym(), creates an engine, registers memory, runs a byte-verified
 * transfer large enough to be sliced (so copy threads start), destroys the
 * engine and dlclose()s. Afterwards /proc/self/task must list as many
 * threads as before the first cycle.
 */
#include "transfer_engine_c.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "te_check.h"

#ifndef TE_SO_PATH
#define TE_SO_PATH "libtransfer_engine.so"
#endif

/* The functions this test calls, resolved with dlsym. */
struct api {
  __typeof__(createTransferEngine) *create;
  __typeof__(destroyTransferEngine) *destroy;
  __typeof__(openSegment) *open_segment;
  __typeof__(registerLocalMemory) *reg;
  __typeof__(unregisterLocalMemory) *unreg;
  __typeof__(allocateBatchID) *alloc_batch;
  __typeof__(submitTransfer) *submit;
  __typeof__(getTransferStatus) *status;
  __typeof__(freeBatchID) *free_batch;
};

static int count_threads(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  struct dirent *ent;
  while ((ent = readdir(d)) != NULL)
    if (ent->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static void *sym(void *lib, const char *name) {
  dlerror();
  void *p = dlsym(lib, name);
  const char *err = dlerror();
  if (err || !p) fprintf(stderr, "dlsym(%s): %s\n", name, err ? err : "NULL");
  return p;
}

/* void * -> function pointer through memcpy: ISO C has no direct cast. */
#define LOAD(lib, field, name)                                   \
  do {                                                           \
    void *p_ = sym(lib, name);                                   \
    CHECK(p_ != NULL);                                           \
    if (!p_) return;                                             \
    memcpy(&api.field, &p_, sizeof p_);                          \
  } while (0)

static void cycle(const char *path, int round) {
  fprintf(stderr, "-- cycle %d: dlopen %s\n", round, path);
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) fprintf(stderr, "dlopen: %s\n", dlerror());
  REQUIRE(lib != NULL);
  struct api api;
  LOAD(lib, create, "createTransferEngine");
  LOAD(lib, destroy, "destroyTransferEngine");
  LOAD(lib, open_segment, "openSegment");
  LOAD(lib, reg, "registerLocalMemory");
  LOAD(lib, unreg, "unregisterLocalMemory");
  LOAD(lib, alloc_batch, "allocateBatchID");
  LOAD(lib, submit, "submitTransfer");
  LOAD(lib, status, "getTransferStatus");
  LOAD(lib, free_batch, "freeBatchID");

  const size_t len = (size_t)8 << 20; /* many slices: the copy pool runs */
  unsigned char *src = malloc(len), *dst = malloc(len);
  REQUIRE(src && dst);
  for (size_t i = 0; i < len; i++) src[i] = (unsigned char)(i * 7 + (size_t)round);
  memset(dst, 0, len);

  transfer_engine_t e = api.create("P2PHANDSHAKE", "127.0.0.1:12345", "", 0, 0);
  CHECK(e != NULL);
  if (e) {
    CHECK_EQ(api.reg(e, dst, len, "cpu:0", 1), 0);
    CHECK_EQ(api.open_segment(e, "127.0.0.1:12345"), LOCAL_SEGMENT);
    struct transfer_request r = {.opcode = OPCODE_WRITE, .source = src,
                                 .target_id = LOCAL_SEGMENT,
                                 .target_offset = (uint64_t)(uintptr_t)dst, .length = len};
    batch_id_t b = api.alloc_batch(e, 1);
    CHECK(b != INVALID_BATCH);
    CHECK_EQ(api.submit(e, b, &r, 1), 0);
    struct transfer_status st = {0};
    int rc;
    do {
      rc = api.status(e, b, 0, &st);
    } while (rc == 0 && st.status != STATUS_COMPLETED && st.status != STATUS_FAILED);
    CHECK_EQ(rc, 0);
    CHECK_EQ(st.status, STATUS_COMPLETED);
    CHECK(memcmp(src, dst, len) == 0);
    CHECK_EQ(api.free_batch(e, b), 0);
    CHECK_EQ(api.unreg(e, dst), 0);
    fprintf(stderr, "   %d threads while the engine lives\n", count_threads());
    api.destroy(e);
  }
  free(src);
  free(dst);
  CHECK_EQ(dlclose(lib), 0);
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : TE_SO_PATH;
  int before = count_threads();
  REQUIRE(before > 0);
  for (int round = 1; round <= 3; round++) cycle(path, round);

  /* A joined thread can still be listed for an instant while the kernel
   * reaps it; a leaked thread stays. Re-read for up to 5 s. */
  int after = count_threads();
  for (int i = 0; i < 500 && after != before; i++) {
    usleep(10000);
    after = count_threads();
  }
  fprintf(stderr, "-- threads: %d before the first dlopen, %d after the last dlclose\n", before,
          after);
  CHECK_EQ(after, before);
  return te_check_exit("dlopen_cycle");
}
