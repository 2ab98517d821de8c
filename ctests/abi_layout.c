/*
 * abi_layout: proves that include/transfer_engine_c.h is ABI-identical to
 * Mooncake's transfer_engine_c.h on LP64: every struct has Mooncake's size
 * and field offsets, every constant has Mooncake's value (and the TE_ERR_*
 * codes of transfer_engine_ext.h the values of Mooncake's error.h, whose
 * ERR_* names transfer_engine_c.h does not define, as Mooncake's does not),
 * segment_id_t / batch_id_t / segment_handle_t are macros as in Mooncake, and
 * both the struct tags and the *_t typedefs exist.
 *
 * Checked twice: at compile time (_Static_assert) and at run time, so the
 * test both breaks the build and reports the offending values.
 */
#include "transfer_engine_c.h"

/* Mooncake's transfer_engine_c.h defines no ERR_* (its error.h does). */
#if defined(ERR_INVALID_ARGUMENT) || defined(ERR_DNS) || defined(ERR_NOT_IMPLEMENTED)
#error "transfer_engine_c.h must not define Mooncake's error.h names"
#endif

#include "transfer_engine_ext.h"

#include <stddef.h>
#include <stdint.h>

#include "te_check.h"

/* Mooncake declares these as macros (not typedefs); code may #undef or
 * #ifdef them. */
#ifndef segment_id_t
#error "segment_id_t must be a macro, as in Mooncake"
#endif
#ifndef segment_handle_t
#error "segment_handle_t must be a macro, as in Mooncake"
#endif
#ifndef batch_id_t
#error "batch_id_t must be a macro, as in Mooncake"
#endif
#ifndef LOCAL_SEGMENT
#error "LOCAL_SEGMENT missing"
#endif
#ifndef INVALID_BATCH
#error "INVALID_BATCH missing"
#endif

/* The constants must be usable in #if, as Mooncake's are. */
#if OPCODE_READ != 0 || OPCODE_WRITE != 1 || LOCAL_SEGMENT != 0
#error "opcode or LOCAL_SEGMENT value differs from Mooncake"
#endif
#if STATUS_WAITING != 0 || STATUS_PENDING != 1 || STATUS_INVALID != 2 || \
    STATUS_CANCELED != 3 || STATUS_COMPLETED != 4 || STATUS_TIMEOUT != 5 || \
    STATUS_FAILED != 6
#error "STATUS_* values differ from Mooncake"
#endif

/* The macro types are exactly Mooncake's. */
_Static_assert(_Generic((segment_id_t)0, int32_t: 1, default: 0), "segment_id_t is int32_t");
_Static_assert(_Generic((segment_handle_t)0, int32_t: 1, default: 0), "segment_handle_t is int32_t");
_Static_assert(_Generic((batch_id_t)0, uint64_t: 1, default: 0), "batch_id_t is uint64_t");
_Static_assert(_Generic(INVALID_BATCH, uint64_t: 1, default: 0), "INVALID_BATCH is a uint64_t");
_Static_assert(sizeof(transfer_engine_t) == sizeof(void *), "transfer_engine_t is void *");
_Static_assert(sizeof(transport_t) == sizeof(void *), "transport_t is void *");

/* struct transfer_request { int opcode; void *source; segment_id_t target_id;
 *                           uint64_t target_offset; uint64_t length; } */
_Static_assert(sizeof(struct transfer_request) == 40, "transfer_request size");
_Static_assert(offsetof(struct transfer_request, opcode) == 0, "opcode offset");
_Static_assert(offsetof(struct transfer_request, source) == 8, "source offset");
_Static_assert(offsetof(struct transfer_request, target_id) == 16, "target_id offset");
_Static_assert(offsetof(struct transfer_request, target_offset) == 24, "target_offset offset");
_Static_assert(offsetof(struct transfer_request, length) == 32, "length offset");
_Static_assert(sizeof(transfer_request_t) == 40, "transfer_request_t size");

_Static_assert(sizeof(struct transfer_status) == 16, "transfer_status size");
_Static_assert(offsetof(struct transfer_status, status) == 0, "status offset");
_Static_assert(offsetof(struct transfer_status, transferred_bytes) == 8, "transferred_bytes offset");
_Static_assert(sizeof(transfer_status_t) == 16, "transfer_status_t size");

_Static_assert(sizeof(struct notify_msg) == 16, "notify_msg size");
_Static_assert(offsetof(struct notify_msg, name) == 0, "notify_msg.name offset");
_Static_assert(offsetof(struct notify_msg, msg) == 8, "notify_msg.msg offset");
_Static_assert(sizeof(notify_msg_t) == 16, "notify_msg_t size");

_Static_assert(sizeof(struct buffer_entry) == 16, "buffer_entry size");
_Static_assert(offsetof(struct buffer_entry, addr) == 0, "buffer_entry.addr offset");
_Static_assert(offsetof(struct buffer_entry, length) == 8, "buffer_entry.length offset");
_Static_assert(sizeof(buffer_entry_t) == 16, "buffer_entry_t size");

_Static_assert(sizeof(struct nic_load_stat) == 80, "nic_load_stat size");
_Static_assert(sizeof(((struct nic_load_stat *)0)->device_name) == 64, "device_name is char[64]");
_Static_assert(offsetof(struct nic_load_stat, device_name) == 0, "device_name offset");
_Static_assert(offsetof(struct nic_load_stat, inflight_bytes) == 64, "inflight_bytes offset");
_Static_assert(offsetof(struct nic_load_stat, ewma_bandwidth_bps) == 72, "ewma offset");
_Static_assert(sizeof(nic_load_stat_t) == 80, "nic_load_stat_t size");

_Static_assert(sizeof(struct segment_desc) == 48, "segment_desc size");
_Static_assert(offsetof(struct segment_desc, type) == 0, "segment_desc.type offset");
_Static_assert(offsetof(struct segment_desc, desc_) == 8, "segment_desc.desc_ offset");
_Static_assert(offsetof(struct segment_desc, desc_.rdma.addr) == 8, "desc_.rdma.addr offset");
_Static_assert(offsetof(struct segment_desc, desc_.rdma.size) == 16, "desc_.rdma.size offset");
_Static_assert(offsetof(struct segment_desc, desc_.rdma.location) == 24, "desc_.rdma.location offset");
_Static_assert(offsetof(struct segment_desc, desc_.nvmeof.port) == 40, "desc_.nvmeof.port offset");
_Static_assert(sizeof(segment_desc_t) == 48, "segment_desc_t size");

int main(void) {
  /* Run-time repeats of the layout, so a failure shows the numbers. */
  CHECK_EQ(sizeof(struct transfer_request), 40);
  CHECK_EQ(offsetof(struct transfer_request, opcode), 0);
  CHECK_EQ(offsetof(struct transfer_request, source), 8);
  CHECK_EQ(offsetof(struct transfer_request, target_id), 16);
  CHECK_EQ(offsetof(struct transfer_request, target_offset), 24);
  CHECK_EQ(offsetof(struct transfer_request, length), 32);
  CHECK_EQ(sizeof(struct transfer_status), 16);
  CHECK_EQ(offsetof(struct transfer_status, status), 0);
  CHECK_EQ(offsetof(struct transfer_status, transferred_bytes), 8);
  CHECK_EQ(sizeof(struct notify_msg), 16);
  CHECK_EQ(offsetof(struct notify_msg, msg), 8);
  CHECK_EQ(sizeof(struct buffer_entry), 16);
  CHECK_EQ(offsetof(struct buffer_entry, length), 8);
  CHECK_EQ(sizeof(struct nic_load_stat), 80);
  CHECK_EQ(offsetof(struct nic_load_stat, device_name), 0);
  CHECK_EQ(offsetof(struct nic_load_stat, inflight_bytes), 64);
  CHECK_EQ(offsetof(struct nic_load_stat, ewma_bandwidth_bps), 72);
  CHECK_EQ(sizeof(struct segment_desc), 48);
  CHECK_EQ(offsetof(struct segment_desc, desc_), 8);
  CHECK_EQ(sizeof(segment_id_t), 4);
  CHECK_EQ(sizeof(batch_id_t), 8);

  /* Field types: the widths C callers rely on. */
  struct transfer_request r = {0};
  CHECK_EQ(sizeof r.opcode, sizeof(int));
  CHECK_EQ(sizeof r.target_id, 4);
  CHECK_EQ(sizeof r.target_offset, 8);
  CHECK_EQ(sizeof r.length, 8);
  r.target_id = -1; /* signed, as in Mooncake */
  CHECK(r.target_id < 0);

  /* Constants: Mooncake's values. */
  CHECK_EQ(LOCAL_SEGMENT, 0);
  CHECK_EQ_U64(INVALID_BATCH, UINT64_MAX);
  CHECK_EQ(OPCODE_READ, 0);
  CHECK_EQ(OPCODE_WRITE, 1);
  CHECK_EQ(STATUS_WAITING, 0);
  CHECK_EQ(STATUS_PENDING, 1);
  CHECK_EQ(STATUS_INVALID, 2);
  CHECK_EQ(STATUS_CANCELED, 3);
  CHECK_EQ(STATUS_COMPLETED, 4);
  CHECK_EQ(STATUS_TIMEOUT, 5);
  CHECK_EQ(STATUS_FAILED, 6);
  /* Mooncake's error.h values, under our prefix (transfer_engine_ext.h). */
  CHECK_EQ(TE_ERR_INVALID_ARGUMENT, -1);
  CHECK_EQ(TE_ERR_TOO_MANY_REQUESTS, -2);
  CHECK_EQ(TE_ERR_ADDRESS_NOT_REGISTERED, -3);
  CHECK_EQ(TE_ERR_BATCH_BUSY, -4);
  CHECK_EQ(TE_ERR_DEVICE_NOT_FOUND, -6);
  CHECK_EQ(TE_ERR_ADDRESS_OVERLAPPED, -7);
  CHECK_EQ(TE_ERR_DNS, -101);
  CHECK_EQ(TE_ERR_SOCKET, -102);
  CHECK_EQ(TE_ERR_MALFORMED_JSON, -103);
  CHECK_EQ(TE_ERR_REJECT_HANDSHAKE, -104);
  CHECK_EQ(TE_ERR_METADATA, -200);
  CHECK_EQ(TE_ERR_ENDPOINT, -201);
  CHECK_EQ(TE_ERR_CONTEXT, -202);
  CHECK_EQ(TE_ERR_NUMA, -300);
  CHECK_EQ(TE_ERR_CLOCK, -301);
  CHECK_EQ(TE_ERR_MEMORY, -302);
  CHECK_EQ(TE_ERR_NOT_IMPLEMENTED, -303);

  /* Both spellings of every type name Mooncake users write. */
  struct transfer_request a = {.opcode = OPCODE_WRITE, .length = 1};
  transfer_request_t b = a;
  struct transfer_status s1 = {.status = STATUS_COMPLETED};
  transfer_status_t s2 = s1;
  struct notify_msg n1 = {.name = NULL, .msg = NULL};
  notify_msg_t n2 = n1;
  struct buffer_entry e1 = {.addr = NULL, .length = 0};
  buffer_entry_t e2 = e1;
  struct nic_load_stat l1 = {.inflight_bytes = 1};
  nic_load_stat_t l2 = l1;
  struct segment_desc d1 = {.type = 0};
  segment_desc_t d2 = d1;
  segment_handle_t h = LOCAL_SEGMENT;
  CHECK_EQ(b.opcode, OPCODE_WRITE);
  CHECK_EQ(s2.status, STATUS_COMPLETED);
  CHECK(n2.name == NULL);
  CHECK_EQ(e2.length, 0);
  CHECK_EQ(l2.inflight_bytes, 1);
  CHECK_EQ(d2.type, 0);
  CHECK_EQ(h, 0);

  return te_check_exit("abi_layout");
}
