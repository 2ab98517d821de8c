/*
 * create_destroy_rss: repeated engine create / installTransport("tcp") /
 * destroy does not grow memory. Servers do this in tests and on
 * reconfiguration; each cycle discovers the machine's topology (hwloc, sysfs)
 * and starts and stops the listeners and their threads.
 *
 * After WARMUP cycles (allocator arenas, lazily initialised libraries and
 * the process-wide topology are in place) the resident set size is taken;
 * after CYCLES cycles in all it must be within MAX_GROWTH_KB of it. A leak
 * of 0.75 MB per cycle would add ~145 MB here. Every tenth cycle also calls
 * discoverTopology explicitly, which rescans the machine.
 */
#include "transfer_engine_c.h"

#include <stdio.h>
#include <string.h>

#include "te_check.h"
#include "te_util.h"

#ifndef CYCLES
#define CYCLES 200
#endif
#ifndef WARMUP
#define WARMUP 10
#endif
#define MAX_GROWTH_KB (8 * 1024)

/* VmRSS of this process in KiB, or -1. */
static long rss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  fclose(f);
  return kb;
}

/* One cycle; returns 0 on success. */
static int cycle(int i) {
  transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0);
  if (!e) {
    fprintf(stderr, "cycle %d: createTransferEngine returned NULL\n", i);
    return -1;
  }
  int rc = 0;
  if (!installTransport(e, "tcp", NULL)) {
    fprintf(stderr, "cycle %d: installTransport(tcp) returned NULL\n", i);
    rc = -1;
  }
  if (rc == 0 && i % 10 == 0 && discoverTopology(e) != 0) {
    fprintf(stderr, "cycle %d: discoverTopology failed\n", i);
    rc = -1;
  }
  destroyTransferEngine(e);
  return rc;
}

int main(void) {
  long first = rss_kb();
  REQUIRE(first > 0);
  long base = -1;
  double t0 = te_now();
  for (int i = 0; i < CYCLES; i++) {
    REQUIRE(cycle(i) == 0);
    if (i + 1 == WARMUP) base = rss_kb();
  }
  long end = rss_kb();
  printf("create_destroy_rss: RSS %ld kB at start, %ld kB after %d cycles, "
         "%ld kB after %d cycles (%+ld kB; limit %+d kB), %.1f s\n",
         first, base, WARMUP, end, CYCLES, end - base, MAX_GROWTH_KB, te_now() - t0);
  CHECK(base > 0 && end > 0);
  CHECK(end - base <= MAX_GROWTH_KB);
  return te_check_exit("create_destroy_rss");
}
