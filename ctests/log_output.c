/*
 * log_output: what the library writes to stderr, captured from a real
 * process that installed no log subscriber of its own.
 *
 * 1. Bad MC_* values (MC_SLICE_SIZE=-5, MC_LOG_LEVEL=LOUD,
 *    MC_TCP_LANES_PER_PEER=99, MC_ENDPOINT_STORE_TYPE=LRU,
 *    MC_HANDSHAKE_PORT=abc), in a child process (the process's
 *    configuration is read once): every createTransferEngine fails, and
 *    its one ERROR line and te_last_error name every refused value with
 *    what it takes.
 * 2. A createTransferEngine that fails (its HTTP metadata store refuses
 *    connections) logs the failure once, as an error, and nothing about
 *    destroying an engine or removing entries from the store: the caller
 *    never had an engine.
 * 3. A storm of 100,000 failing calls of five kinds (an unknown batch, a
 *    task out of range, an overlapping registration, an unknown address to
 *    unregister, a forged engine) each returns its exact code and leaves its
 *    exact text in te_last_error, while the log holds a bounded number of
 *    lines: the first few of each function, and, after the interval, one
 *    line per function whose count accounts for every call suppressed.
 */
#include "transfer_engine_c.h"
#include "transfer_engine_ext.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "te_check.h"
#include "te_util.h"

#define MARK "=== log_output: the failing createTransferEngine follows\n"
#define STORM "=== log_output: the storm of failing calls follows\n"

/* Calls of each kind in the storm, and the kinds. */
#define STORM_CALLS 20000
#define KINDS 5
/* Log lines each function may write in one 5 s interval (src/ffi/boundary.rs),
 * plus the internal warning an unknown unregister also writes. */
#define LINES_PER_KIND 5

/* A 127.0.0.1 port nothing listens on: bound by us, then closed. */
static int dead_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(getsockname(s, (struct sockaddr *)&a, &len) == 0);
  close(s);
  return ntohs(a.sin_port);
}

static int count(const char *text, const char *what) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, what)) != NULL; p += strlen(what)) n++;
  return n;
}

/* Sum of the N in "(N similar line(s) suppressed" on the lines of `text` that
 * hold `what`; *lines gets how many such lines there are. */
static long suppressed_on(const char *text, const char *what, int *lines) {
  long sum = 0;
  *lines = 0;
  for (const char *line = text; *line;) {
    const char *end = strchr(line, '\n');
    if (!end) end = line + strlen(line);
    const char *hit = strstr(line, what);
    if (hit && hit < end) {
      (*lines)++;
      const char *n = strstr(line, " similar line(s) suppressed");
      if (n && n < end) {
        const char *open = n;
        while (open > line && open[-1] != '(') open--;
        sum += strtol(open, NULL, 10);
      }
    }
    line = *end ? end + 1 : end;
  }
  return sum;
}

/* The text te_last_error gives now equals `want` exactly. */
static int last_error_is(const char *want) {
  char buf[512];
  size_t n = te_last_error(buf, sizeof buf);
  return n == strlen(want) && strcmp(buf, want) == 0;
}

/* One call of each kind; returns how many gave a wrong code or text. */
static int fail_once_each(transfer_engine_t e, batch_id_t empty, void *mem, char (*want)[256]) {
  struct transfer_request req = {.opcode = OPCODE_WRITE, .source = mem, .target_id = LOCAL_SEGMENT,
                                 .target_offset = (uint64_t)(uintptr_t)mem, .length = 1};
  struct transfer_status st = {.status = 77};
  int bad = 0;
  bad += submitTransfer(e, 0xdeadbeef, &req, 1) != 1 || !last_error_is(want[0]);
  bad += getTransferStatus(e, empty, 7, &st) != 1 || st.status != 77 || !last_error_is(want[1]);
  bad += registerLocalMemory(e, mem, 64, "cpu:0", 1) != -7 || !last_error_is(want[2]);
  bad += unregisterLocalMemory(e, (char *)mem + 1) != -3 || !last_error_is(want[3]);
  bad += openSegment((transfer_engine_t)(uintptr_t)0x1234, "x") != -1 || !last_error_is(want[4]);
  return bad;
}

/* Part 3: the storm, with stderr already going to the log file; returns
 * how long the calls before the pause took, in seconds. */
static double storm(char (*want)[256]) {
  fputs(STORM, stderr);
  fflush(stderr);
  transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1:12347", NULL, 0, 0);
  REQUIRE(e != NULL);
  static char mem[4096];
  REQUIRE(registerLocalMemory(e, mem, sizeof mem, "cpu:0", 1) == 0);
  batch_id_t empty = allocateBatchID(e, 1);
  REQUIRE(empty != INVALID_BATCH);
  snprintf(want[0], 256, "submitTransfer: invalid argument: batch id 0xdeadbeef is unknown or freed");
  snprintf(want[1], 256, "getTransferStatus: invalid argument: task id 7 is out of range (batch has 0 tasks)");
  snprintf(want[2], 256,
           "registerLocalMemory: address overlapped: buffer %#" PRIx64 "+64 overlaps a registered "
           "buffer", (uint64_t)(uintptr_t)mem);
  snprintf(want[3], 256,
           "unregisterLocalMemory: address not registered: no buffer is registered at %#" PRIx64,
           (uint64_t)(uintptr_t)mem + 1);
  snprintf(want[4], 256, "openSegment: engine handle 0x1234 is NULL, unknown or destroyed");
  int bad = 0;
  double start = te_now();
  for (int i = 0; i < STORM_CALLS - 1; i++) bad += fail_once_each(e, empty, mem, want);
  double took = te_now() - start;
  /* After the interval, one more of each: its line carries the count. */
  sleep(6);
  bad += fail_once_each(e, empty, mem, want);
  CHECK_EQ(bad, 0);
  CHECK_EQ(freeBatchID(e, empty), 0);
  CHECK_EQ(unregisterLocalMemory(e, mem), 0);
  destroyTransferEngine(e);
  fflush(stderr);
  return took;
}

/* Part 1, run in a child: returns its exit code. */
static int bad_values(void) {
  static const char *bad[][2] = {
      {"MC_SLICE_SIZE", "-5"},
      {"MC_LOG_LEVEL", "LOUD"},
      {"MC_TCP_LANES_PER_PEER", "99"},
      {"MC_ENDPOINT_STORE_TYPE", "LRU"},
      {"MC_HANDSHAKE_PORT", "abc"},
  };
  static const char *want[] = {
      "MC_SLICE_SIZE=-5 is not a number in 1..=1099511627776",
      "MC_LOG_LEVEL=LOUD is not one of INFO, TRACE, WARNING, WARN or ERROR",
      "MC_TCP_LANES_PER_PEER=99 is not a number in 1..=16",
      "MC_ENDPOINT_STORE_TYPE=LRU is not one of SIEVE or FIFO",
      "MC_HANDSHAKE_PORT=abc is not a number in 1..=65535",
  };
  enum { WANT = sizeof want / sizeof want[0], CALLS = 2 };
  for (size_t i = 0; i < WANT; i++) setenv(bad[i][0], bad[i][1], 1);
  unsetenv("RUST_LOG");
  FILE *log = tmpfile();
  REQUIRE(log != NULL);
  fflush(stderr);
  int saved = dup(2);
  REQUIRE(saved >= 0 && dup2(fileno(log), 2) == 2);
  static char errors[CALLS][1024];
  int created = 0;
  for (int c = 0; c < CALLS; c++) {
    transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0);
    if (e) {
      created++;
      destroyTransferEngine(e);
    }
    te_last_error(errors[c], sizeof errors[c]);
  }
  fflush(stderr);
  REQUIRE(dup2(saved, 2) == 2);
  close(saved);
  long size = ftell(log);
  REQUIRE(size >= 0);
  char *text = calloc(1, (size_t)size + 1);
  REQUIRE(text != NULL);
  rewind(log);
  REQUIRE(fread(text, 1, (size_t)size, log) == (size_t)size);
  fclose(log);
  printf("----- captured stderr (bad values)\n%s----- end\n", text);
  CHECK_EQ(created, 0);
  int lines = 0;
  for (const char *p = text; *p; p++) lines += *p == '\n';
  CHECK_EQ(lines, CALLS);
  CHECK_EQ(count(text, " ERROR transfer_engine"), CALLS);
  for (size_t i = 0; i < WANT; i++) {
    CHECK_EQ(count(text, want[i]), CALLS);
    for (int c = 0; c < CALLS; c++) {
      CHECK(strstr(errors[c], want[i]) != NULL);
      if (!strstr(errors[c], want[i])) fprintf(stderr, "  te_last_error lacks \"%s\": %s\n", want[i], errors[c]);
    }
  }
  free(text);
  return te_check_exit("log_output (bad values)");
}

int main(void) {
  fflush(stdout);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(bad_values());
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  unsetenv("RUST_LOG");

  /* stderr goes to a temporary file while the library runs. */
  FILE *log = tmpfile();
  REQUIRE(log != NULL);
  fflush(stderr);
  int saved = dup(2);
  REQUIRE(saved >= 0 && dup2(fileno(log), 2) == 2);

  char conn[128];
  snprintf(conn, sizeof conn, "http://127.0.0.1:%d/metadata", dead_port());
  fputs(MARK, stderr);
  fflush(stderr);
  transfer_engine_t failed = createTransferEngine(conn, "log-output-node", NULL, 0, 0);
  fflush(stderr);
  char texts[KINDS][256];
  double storm_seconds = storm(texts);

  fflush(stderr);
  REQUIRE(dup2(saved, 2) == 2);
  close(saved);
  long size = ftell(log);
  REQUIRE(size >= 0);
  char *text = calloc(1, (size_t)size + 1);
  REQUIRE(text != NULL);
  rewind(log);
  REQUIRE(fread(text, 1, (size_t)size, log) == (size_t)size);
  fclose(log);
  printf("----- captured stderr\n%s----- end\n", text);

  CHECK(failed == NULL);
  char *storm_log = strstr(text, STORM);
  REQUIRE(storm_log != NULL);
  *storm_log = 0;
  storm_log += strlen(STORM);
  char *tail = strstr(text, MARK);
  REQUIRE(tail != NULL);
  *tail = 0;
  tail += strlen(MARK);
  /* 2: one line, naming the function and the store, and no teardown noise. */
  int lines = 0;
  for (const char *p = tail; *p; p++) lines += *p == '\n';
  CHECK_EQ(lines, 1);
  CHECK_EQ(count(tail, "ERROR"), 1);
  CHECK_EQ(count(tail, "createTransferEngine:"), 1);
  CHECK(strstr(tail, conn) != NULL || strstr(tail, "127.0.0.1") != NULL);
  CHECK_EQ(count(tail, "destroyed"), 0);
  CHECK_EQ(count(tail, "removing"), 0);
  /* 3: each kind's lines are the first few and the one after the interval,
   * and their counts add up to every call made; the whole storm's log is
   * bounded (a few lines more: the engine's own, and the warning an
   * unknown address to unregister writes inside the engine). */
  int storm_lines = 0;
  for (const char *p = storm_log; *p; p++) storm_lines += *p == '\n';
  printf("the storm of %d failing calls wrote %d log lines (%zu bytes)\n", KINDS * STORM_CALLS,
         storm_lines, strlen(storm_log));
  /* The calls before the sleep span `intervals` 5 s intervals at most
   * (one, unless this machine is very slow); each lets a function write
   * its first few lines, and the call after the sleep writes one more. */
  int intervals = (int)(storm_seconds / 5) + 1;
  int max_lines = LINES_PER_KIND * intervals + 1;
  printf("the storm took %.1f s before the pause: at most %d line(s) per function\n", storm_seconds,
         max_lines);
  /* + the unknown unregister's internal warning (one a interval, and one
   * after the pause), + the engine's create and destroy lines */
  CHECK(storm_lines <= KINDS * max_lines + (intervals + 1) + 2);
  for (int k = 0; k < KINDS; k++) {
    int lines;
    long suppressed = suppressed_on(storm_log, texts[k], &lines);
    CHECK(lines >= 2 && lines <= max_lines);
    CHECK(suppressed > 0);
    if (lines + suppressed != STORM_CALLS)
      fprintf(stderr, "  kind %d (%s): %d lines + %ld suppressed != %d calls\n", k, texts[k], lines,
              suppressed, STORM_CALLS);
    CHECK_EQ(lines + suppressed, STORM_CALLS);
  }
  free(text);
  return te_check_exit("log_output");
}
