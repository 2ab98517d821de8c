/*
 * log_output: what the library writes to stderr, captured from a real
 * process that installed no log subscriber of its own.
 *
 * 1. Bad MC_* values (MC_SLICE_SIZE=-5, MC_LOG_LEVEL=LOUD,
 *    MC_TCP_LANES_PER_PEER=99, MC_ENDPOINT_STORE_TYPE=LRU,
 *    MC_HANDSHAKE_PORT=abc) each log their warning, naming the value
 *    kept, once, when the first engine is created.
 * 2. A createTransferEngine that fails (its HTTP metadata store refuses
 *    connections) logs the failure once, as an error, and nothing about
 *    destroying an engine or removing entries from the store: the caller
 *    never had an engine.
 */
#include "transfer_engine_c.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "te_check.h"

#define MARK "=== log_output: the failing createTransferEngine follows\n"

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

int main(void) {
  static const char *bad[][2] = {
      {"MC_SLICE_SIZE", "-5"},
      {"MC_LOG_LEVEL", "LOUD"},
      {"MC_TCP_LANES_PER_PEER", "99"},
      {"MC_ENDPOINT_STORE_TYPE", "LRU"},
      {"MC_HANDSHAKE_PORT", "abc"},
  };
  static const char *want[] = {
      "MC_SLICE_SIZE=-5 is not a number; using 65536",
      "MC_LOG_LEVEL=LOUD is not TRACE, INFO, WARNING or ERROR; using INFO",
      "MC_TCP_LANES_PER_PEER=99 is outside 1..=16; using 4",
      "MC_ENDPOINT_STORE_TYPE=LRU is not FIFO or SIEVE; using SIEVE",
      "MC_HANDSHAKE_PORT=abc is not a number; using 12001",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) setenv(bad[i][0], bad[i][1], 1);
  unsetenv("RUST_LOG");

  /* stderr goes to a temporary file while the library runs. */
  FILE *log = tmpfile();
  REQUIRE(log != NULL);
  fflush(stderr);
  int saved = dup(2);
  REQUIRE(saved >= 0 && dup2(fileno(log), 2) == 2);

  transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0);
  int created = e != NULL;
  if (e) destroyTransferEngine(e);

  char conn[128];
  snprintf(conn, sizeof conn, "http://127.0.0.1:%d/metadata", dead_port());
  fputs(MARK, stderr);
  fflush(stderr);
  transfer_engine_t failed = createTransferEngine(conn, "log-output-node", NULL, 0, 0);

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

  CHECK(created);
  CHECK(failed == NULL);
  char *tail = strstr(text, MARK);
  REQUIRE(tail != NULL);
  *tail = 0;
  tail += strlen(MARK);
  /* 1: each warning once, before the first engine's log lines. */
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    CHECK_EQ(count(text, want[i]), 1);
    if (count(text, want[i]) != 1) fprintf(stderr, "  warning \"%s\" missing or repeated\n", want[i]);
  }
  CHECK(count(text, "WARN") >= 5);
  /* 2: one line, naming the function and the store, and no teardown noise. */
  int lines = 0;
  for (const char *p = tail; *p; p++) lines += *p == '\n';
  CHECK_EQ(lines, 1);
  CHECK_EQ(count(tail, "ERROR"), 1);
  CHECK_EQ(count(tail, "createTransferEngine:"), 1);
  CHECK(strstr(tail, conn) != NULL || strstr(tail, "127.0.0.1") != NULL);
  CHECK_EQ(count(tail, "destroyed"), 0);
  CHECK_EQ(count(tail, "removing"), 0);
  free(text);
  return te_check_exit("log_output");
}
