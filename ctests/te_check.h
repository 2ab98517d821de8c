/*
 * te_check.h: the tiny assertion helpers shared by the C tests.
 *
 * CHECK(cond) and CHECK_EQ(got, want) print file:line, the expression and
 * the values on failure, count the failure and carry on, so one run reports
 * every broken case; te_check_exit() turns the count into the exit code.
 * REQUIRE(cond) stops the test at once (for preconditions such as a NULL
 * engine that would make the rest meaningless).
 */
#ifndef TE_CHECK_H
#define TE_CHECK_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

static int te_failures;
static long te_checks;

#define CHECK(cond)                                                              \
  do {                                                                           \
    te_checks++;                                                                 \
    if (!(cond)) {                                                               \
      te_failures++;                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
    }                                                                            \
  } while (0)

/* Compares two integers (any integer type, widened to intmax_t). */
#define CHECK_EQ(got, want)                                                      \
  do {                                                                           \
    intmax_t te_got_ = (intmax_t)(got), te_want_ = (intmax_t)(want);             \
    te_checks++;                                                                 \
    if (te_got_ != te_want_) {                                                   \
      te_failures++;                                                             \
      fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s: got %jd, want %jd\n",   \
              __FILE__, __LINE__, #got, #want, te_got_, te_want_);               \
    }                                                                            \
  } while (0)

/* Compares two unsigned 64-bit values (batch ids, sizes). */
#define CHECK_EQ_U64(got, want)                                                  \
  do {                                                                           \
    uint64_t te_got_ = (uint64_t)(got), te_want_ = (uint64_t)(want);             \
    te_checks++;                                                                 \
    if (te_got_ != te_want_) {                                                   \
      te_failures++;                                                             \
      fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s: got %#" PRIx64          \
              ", want %#" PRIx64 "\n", __FILE__, __LINE__, #got, #want,          \
              te_got_, te_want_);                                                \
    }                                                                            \
  } while (0)

#define REQUIRE(cond)                                                            \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: REQUIRE failed: %s (stopping)\n", __FILE__,        \
              __LINE__, #cond);                                                  \
      exit(2);                                                                   \
    }                                                                            \
  } while (0)

static inline int te_check_exit(const char *name) {
  if (te_failures) {
    fprintf(stderr, "%s: %d of %ld checks FAILED\n", name, te_failures, te_checks);
    return 1;
  }
  printf("%s: all %ld checks passed\n", name, te_checks);
  return 0;
}

#endif /* TE_CHECK_H */
