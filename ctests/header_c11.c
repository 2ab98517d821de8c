/*
 * header_c11 (built as header_c99 and header_c11): include/transfer_engine_c.h
 * compiles as strict ISO C99 and C11 with -Wall -Wextra -Werror -pedantic, survives being included twice, declares
 * all 27 functions with Mooncake's exact signatures (header_signatures.inc),
 * and its constants behave as plain integer expressions.
 * The build fails if any of that breaks; the binary then runs as a test.
 */
#include "transfer_engine_c.h"
#include "transfer_engine_c.h" /* include guard */

#include <stdio.h>

#include "header_signatures.inc"

int main(void) {
  void (*all[])(void) = {
      (void (*)(void))p_createTransferEngine, (void (*)(void))p_discoverTopology,
      (void (*)(void))p_getLocalIpAndPort, (void (*)(void))p_installTransport,
      (void (*)(void))p_uninstallTransport, (void (*)(void))p_openSegment,
      (void (*)(void))p_openSegmentNoCache, (void (*)(void))p_closeSegment,
      (void (*)(void))p_warmupEfaSegment, (void (*)(void))p_removeLocalSegment,
      (void (*)(void))p_destroyTransferEngine, (void (*)(void))p_registerLocalMemory,
      (void (*)(void))p_unregisterLocalMemory, (void (*)(void))p_registerLocalMemoryBatch,
      (void (*)(void))p_unregisterLocalMemoryBatch, (void (*)(void))p_allocateBatchID,
      (void (*)(void))p_submitTransfer, (void (*)(void))p_submitTransferWithNotify,
      (void (*)(void))p_getNotifsFromEngine, (void (*)(void))p_freeNotifsMsgBuf,
      (void (*)(void))p_genNotifyInEngine, (void (*)(void))p_getTransferStatus,
      (void (*)(void))p_freeBatchID, (void (*)(void))p_syncSegmentCache,
      (void (*)(void))p_getNicLoadStats, (void (*)(void))p_enableGracefulShutdown,
      (void (*)(void))p_showLinks,
  };
  int missing = 0;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) missing += all[i] == NULL;
  if (sizeof all / sizeof all[0] != TE_SIGNATURE_COUNT || missing) {
    fprintf(stderr, "header_c11: %d of %d functions unresolved\n", missing, TE_SIGNATURE_COUNT);
    return 1;
  }
  /* Code like "x-OPCODE_WRITE" or "-LOCAL_SEGMENT" must mean what it says.
   * (The ERR_* codes are not here, as in Mooncake's header: they are
   * TE_ERR_* in transfer_engine_ext.h.) */
  int x = 1;
  if (x-OPCODE_WRITE != 0 || x*STATUS_FAILED != 6 || -LOCAL_SEGMENT != 0 ||
      x-STATUS_TIMEOUT != -4) {
    fprintf(stderr, "header_c11: constants misbehave in expressions\n");
    return 1;
  }
  printf("header_c11: header compiles as C (__STDC_VERSION__ %ld) -pedantic; %d signatures match\n",
         (long)__STDC_VERSION__, TE_SIGNATURE_COUNT);
  return 0;
}
