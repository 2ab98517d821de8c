/*
 * header_ext (built as header_ext_cxx11 and header_ext_cxx17):
 * include/transfer_engine_ext.h compiles as C++11 and C++17 with -Wall
 * -Wextra -Werror -pedantic, included twice, its functions have C linkage
 * (the program links against libtransfer_engine.so and calls them), and
 * the te_* functions and Mooncake's 27 have their exact signatures.
 */
#include "transfer_engine_ext.h"
#include "transfer_engine_ext.h" // include guard

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "header_signatures.inc"
#include "header_ext_signatures.inc"

static_assert(std::is_same<te_buffer_info_t, struct te_buffer_info>::value, "typedef");
static_assert(std::is_standard_layout<te_buffer_info_t>::value, "POD buffer info");
static_assert(sizeof(te_buffer_info_t) == 80, "size");
static_assert(offsetof(te_buffer_info_t, length) == 8, "length offset");
static_assert(offsetof(te_buffer_info_t, location) == 16, "location offset");

int main() {
  if (!p_createTransferEngine || !p_te_version || !p_te_last_error || !p_te_segment_buffers)
    return 1;
  // Calls through C linkage: a NULL engine is refused and explained.
  std::size_t count = 0;
  if (te_segment_buffers(nullptr, LOCAL_SEGMENT, nullptr, 0, &count) != TE_ERR_INVALID_ARGUMENT)
    return 1;
  char msg[256];
  if (te_last_error(msg, sizeof msg) == 0 || !std::strstr(msg, "te_segment_buffers")) return 1;
  std::printf("header_ext: header compiles as C++ (__cplusplus %ld) -pedantic; %d + %d "
              "signatures match; library %s\n",
              static_cast<long>(__cplusplus), TE_SIGNATURE_COUNT, TE_EXT_SIGNATURE_COUNT,
              te_version());
  return 0;
}
