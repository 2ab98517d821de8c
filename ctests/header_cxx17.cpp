/*
 * header_cxx17 (built as header_cxx11 and header_cxx17):
 * include/transfer_engine_c.h compiles as C++11 and C++17 with -Wall
 * -Wextra -Werror -pedantic, included twice, its functions have C linkage
 * (the program links against libtransfer_engine.so), and all 27 have
 * Mooncake's exact signatures (header_signatures.inc).
 */
#include "transfer_engine_c.h"
#include "transfer_engine_c.h" // include guard

#include <cstdio>
#include <type_traits>

#include "header_signatures.inc"

static_assert(std::is_same<segment_id_t, int32_t>::value, "segment_id_t");
static_assert(std::is_same<batch_id_t, uint64_t>::value, "batch_id_t");
static_assert(std::is_same<transfer_request_t, struct transfer_request>::value, "typedef");
static_assert(std::is_standard_layout<transfer_request>::value, "POD request");
static_assert(sizeof(transfer_request) == 40 && sizeof(nic_load_stat_t) == 80, "sizes");

int main() {
  if (!p_createTransferEngine || !p_showLinks || !p_submitTransferWithNotify ||
      !p_getNotifsFromEngine)
    return 1;
  // A real call through C linkage: a NULL engine is refused, not a crash
  // (-1, Mooncake's ERR_INVALID_ARGUMENT, which its header and ours leave
  // to error.h; transfer_engine_ext.h names it TE_ERR_INVALID_ARGUMENT).
  if (getLocalIpAndPort(nullptr, nullptr, 0) != -1) return 1;
  transfer_request r{};
  r.opcode = OPCODE_WRITE;
  r.target_id = LOCAL_SEGMENT;
  int x = 1;
  if (x-OPCODE_WRITE != 0 || x-STATUS_FAILED != -5) return 1;
  std::printf("header_cxx17: header compiles as C++ (__cplusplus %ld) -pedantic; %d signatures match\n",
              static_cast<long>(__cplusplus), TE_SIGNATURE_COUNT);
  return r.opcode == 1 ? 0 : 1;
}
