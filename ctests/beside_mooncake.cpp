/*
 * beside_mooncake (built as beside_mooncake and beside_mooncake_ours_first):
 * our headers compile in one C++17 translation unit with -Wall -Wextra
 * -Werror -pedantic beside the names Mooncake's headers declare, declared
 * the way Mooncake declares them: the ERR_* macros of its error.h, in
 * parentheses, and the macros, handle typedefs and a few functions of its
 * transfer_engine_c.h. A C++ server that includes Mooncake's C++ headers
 * (which bring error.h) and ours is such a file.
 *
 * The declarations below are written for this test from the list of names
 * and values in Mooncake's headers, not copied from them. They come first,
 * then our transfer_engine_c.h and transfer_engine_ext.h; built with
 * TE_OURS_FIRST, our headers come first. Either way:
 *  - every macro both define must be the same tokens (an identical
 *    redefinition is legal; any other is diagnosed, an error here), so
 *    our numeric macros are parenthesised as Mooncake writes them;
 *  - our transfer_engine_c.h defines no ERR_* (Mooncake's does not either:
 *    ours are TE_ERR_* in transfer_engine_ext.h, with the same values);
 *  - the functions have C linkage and Mooncake's types: the program links
 *    against libtransfer_engine.so and calls them.
 */
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#ifdef TE_OURS_FIRST
#include "transfer_engine_c.h"
#include "transfer_engine_ext.h"
/* Before error.h's macros: transfer_engine_c.h defines none of its names. */
#if defined(ERR_INVALID_ARGUMENT) || defined(ERR_TOO_MANY_REQUESTS) ||                     \
    defined(ERR_ADDRESS_NOT_REGISTERED) || defined(ERR_BATCH_BUSY) ||                        \
    defined(ERR_DEVICE_NOT_FOUND) || defined(ERR_ADDRESS_OVERLAPPED) ||                      \
    defined(ERR_NOT_LOCAL_SEGMENT_OR_SHM) || defined(ERR_DNS) || defined(ERR_SOCKET) ||      \
    defined(ERR_MALFORMED_JSON) || defined(ERR_REJECT_HANDSHAKE) || defined(ERR_METADATA) || \
    defined(ERR_ENDPOINT) || defined(ERR_CONTEXT) || defined(ERR_NUMA) || defined(ERR_CLOCK) || \
    defined(ERR_MEMORY) || defined(ERR_NOT_IMPLEMENTED)
#error "transfer_engine_c.h defines ERR_* names, which Mooncake's transfer_engine_c.h does not"
#endif
#endif

/* ---- Mooncake's error.h, as Mooncake declares it. */
#ifndef ERROR_H
#define ERROR_H
#define ERR_INVALID_ARGUMENT (-1)
#define ERR_TOO_MANY_REQUESTS (-2)
#define ERR_ADDRESS_NOT_REGISTERED (-3)
#define ERR_BATCH_BUSY (-4)
#define ERR_DEVICE_NOT_FOUND (-6)
#define ERR_ADDRESS_OVERLAPPED (-7)
#define ERR_NOT_LOCAL_SEGMENT_OR_SHM (-8)
#define ERR_DNS (-101)
#define ERR_SOCKET (-102)
#define ERR_MALFORMED_JSON (-103)
#define ERR_REJECT_HANDSHAKE (-104)
#define ERR_METADATA (-200)
#define ERR_ENDPOINT (-201)
#define ERR_CONTEXT (-202)
#define ERR_NUMA (-300)
#define ERR_CLOCK (-301)
#define ERR_MEMORY (-302)
#define ERR_NOT_IMPLEMENTED (-303)
#endif

/* ---- The names of Mooncake's transfer_engine_c.h, as Mooncake declares
 * them. Not under its include guard TRANSFER_ENGINE_C, which is ours too:
 * with it, one of the two would be skipped and nothing compared. */
#define segment_handle_t int32_t
#define segment_id_t int32_t
#define batch_id_t uint64_t
#define LOCAL_SEGMENT (0)
#define INVALID_BATCH UINT64_MAX

#define OPCODE_READ (0)
#define OPCODE_WRITE (1)

#define STATUS_WAITING (0)
#define STATUS_PENDING (1)
#define STATUS_INVALID (2)
#define STATUS_CANCELED (3)
#define STATUS_COMPLETED (4)
#define STATUS_TIMEOUT (5)
#define STATUS_FAILED (6)

extern "C" {
typedef void *transfer_engine_t;
typedef void *transport_t;
int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len);
int closeSegment(transfer_engine_t engine, segment_id_t segment_handle);
batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size);
int freeBatchID(transfer_engine_t engine, batch_id_t batch_id);
}

#ifndef TE_OURS_FIRST
#include "transfer_engine_c.h"
#include "transfer_engine_ext.h"
#endif

/* Our codes are Mooncake's, one for one (Mooncake's -8,
 * ERR_NOT_LOCAL_SEGMENT_OR_SHM, is one this engine never returns). */
static_assert(TE_ERR_INVALID_ARGUMENT == ERR_INVALID_ARGUMENT, "INVALID_ARGUMENT");
static_assert(TE_ERR_TOO_MANY_REQUESTS == ERR_TOO_MANY_REQUESTS, "TOO_MANY_REQUESTS");
static_assert(TE_ERR_ADDRESS_NOT_REGISTERED == ERR_ADDRESS_NOT_REGISTERED, "ADDRESS_NOT_REGISTERED");
static_assert(TE_ERR_BATCH_BUSY == ERR_BATCH_BUSY, "BATCH_BUSY");
static_assert(TE_ERR_DEVICE_NOT_FOUND == ERR_DEVICE_NOT_FOUND, "DEVICE_NOT_FOUND");
static_assert(TE_ERR_ADDRESS_OVERLAPPED == ERR_ADDRESS_OVERLAPPED, "ADDRESS_OVERLAPPED");
static_assert(TE_ERR_DNS == ERR_DNS, "DNS");
static_assert(TE_ERR_SOCKET == ERR_SOCKET, "SOCKET");
static_assert(TE_ERR_MALFORMED_JSON == ERR_MALFORMED_JSON, "MALFORMED_JSON");
static_assert(TE_ERR_REJECT_HANDSHAKE == ERR_REJECT_HANDSHAKE, "REJECT_HANDSHAKE");
static_assert(TE_ERR_METADATA == ERR_METADATA, "METADATA");
static_assert(TE_ERR_ENDPOINT == ERR_ENDPOINT, "ENDPOINT");
static_assert(TE_ERR_CONTEXT == ERR_CONTEXT, "CONTEXT");
static_assert(TE_ERR_NUMA == ERR_NUMA, "NUMA");
static_assert(TE_ERR_CLOCK == ERR_CLOCK, "CLOCK");
static_assert(TE_ERR_MEMORY == ERR_MEMORY, "MEMORY");
static_assert(TE_ERR_NOT_IMPLEMENTED == ERR_NOT_IMPLEMENTED, "NOT_IMPLEMENTED");

static_assert(std::is_same<segment_id_t, int32_t>::value, "segment_id_t");
static_assert(std::is_same<batch_id_t, uint64_t>::value, "batch_id_t");
static_assert(sizeof(transfer_request_t) == 40, "transfer_request");

#define TE_STR(x) #x
#define TE_XSTR(x) TE_STR(x)

int main() {
  int failures = 0;
  // Calls through C linkage, each refusing a NULL engine with its code.
  char buf[64];
  if (getLocalIpAndPort(nullptr, buf, sizeof buf) != ERR_INVALID_ARGUMENT) failures++;
  if (getLocalIpAndPort(nullptr, buf, sizeof buf) != TE_ERR_INVALID_ARGUMENT) failures++;
  if (closeSegment(nullptr, LOCAL_SEGMENT) != TE_ERR_INVALID_ARGUMENT) failures++;
  if (allocateBatchID(nullptr, 1) != INVALID_BATCH) failures++;
  std::size_t count = 0;
  if (te_segment_buffers(nullptr, LOCAL_SEGMENT, nullptr, 0, &count) != TE_ERR_INVALID_ARGUMENT)
    failures++;
  const char *version = te_version();
  if (version == nullptr || std::strlen(version) == 0) failures++;
  // The spelling the preprocessor compared, for the log.
  std::printf("beside_mooncake (%s first): LOCAL_SEGMENT %s, OPCODE_WRITE %s, STATUS_FAILED %s, "
              "TE_ERR_DNS %s == ERR_DNS %s; library %s\n",
#ifdef TE_OURS_FIRST
              "ours",
#else
              "Mooncake's",
#endif
              TE_XSTR(LOCAL_SEGMENT), TE_XSTR(OPCODE_WRITE), TE_XSTR(STATUS_FAILED),
              TE_XSTR(TE_ERR_DNS), TE_XSTR(ERR_DNS), version ? version : "?");
  if (failures) std::fprintf(stderr, "beside_mooncake: %d calls returned the wrong code\n", failures);
  return failures ? 1 : 0;
}
