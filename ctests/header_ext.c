/*
 * header_ext (built as header_ext_c99 and header_ext_c11):
 * include/transfer_engine_ext.h compiles as strict ISO C99 and C11 with
 * -Wall -Wextra -Werror -pedantic, survives being included twice (and
 * after transfer_engine_c.h), brings Mooncake's 27 declarations with it,
 * declares the te_* functions with their documented signatures, and
 * te_buffer_info has its documented layout. The binary then calls them.
 */
#include "transfer_engine_ext.h"
#include "transfer_engine_c.h"
#include "transfer_engine_ext.h" /* include guard */

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "header_signatures.inc"
#include "header_ext_signatures.inc"

/* The layout of te_buffer_info_t (checked at compile time). */
typedef char check_size[sizeof(te_buffer_info_t) == 80 ? 1 : -1];
typedef char check_addr[offsetof(struct te_buffer_info, addr) == 0 ? 1 : -1];
typedef char check_length[offsetof(struct te_buffer_info, length) == 8 ? 1 : -1];
typedef char check_location[offsetof(struct te_buffer_info, location) == 16 ? 1 : -1];
typedef char check_location_size[sizeof(((te_buffer_info_t *)0)->location) == 64 ? 1 : -1];

int main(void) {
  if (!p_createTransferEngine || !p_showLinks || !p_te_version || !p_te_last_error ||
      !p_te_segment_buffers)
    return 1;
  const char *v = te_version();
  if (v == NULL || strlen(v) == 0) {
    fprintf(stderr, "header_ext: te_version() returned nothing\n");
    return 1;
  }
  /* A failing call through the header, explained by te_last_error. */
  size_t count = 1;
  if (te_segment_buffers(NULL, LOCAL_SEGMENT, NULL, 0, &count) != TE_ERR_INVALID_ARGUMENT)
    return 1;
  char msg[256];
  if (te_last_error(msg, sizeof msg) == 0 || strstr(msg, "te_segment_buffers") == NULL) {
    fprintf(stderr, "header_ext: no last error after a failing call\n");
    return 1;
  }
  printf("header_ext: header compiles as C (__STDC_VERSION__ %ld) -pedantic; %d + %d "
         "signatures match; library %s\n",
         (long)__STDC_VERSION__, TE_SIGNATURE_COUNT, TE_EXT_SIGNATURE_COUNT, v);
  return 0;
}
