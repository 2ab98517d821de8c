/* Two engines in one process: one WRITEs 1 MiB into the other's buffer
 * over TCP on loopback, waits for it, and checks every byte. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "transfer_engine_c.h"

#define LEN (1 << 20)
static char src[LEN], dst[LEN];

int main(void) {
  /* "P2PHANDSHAKE": no metadata server. A loopback name keeps both engines
   * off the network. */
  transfer_engine_t target = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0);
  transfer_engine_t me = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0);
  if (!target || !me || !installTransport(target, "tcp", NULL) || !installTransport(me, "tcp", NULL))
    return 1;
  memset(src, 'x', LEN);
  if (registerLocalMemory(target, dst, LEN, "cpu:0", 1) || registerLocalMemory(me, src, LEN, "cpu:0", 1))
    return 1;

  char name[64]; /* the target's name as peers open it: "127.0.0.1:<port>" */
  getLocalIpAndPort(target, name, sizeof name);
  segment_id_t seg = openSegment(me, name);
  batch_id_t batch = allocateBatchID(me, 1);
  /* target_offset is the absolute address in the target process */
  struct transfer_request req = {OPCODE_WRITE, src, seg, (uint64_t)(uintptr_t)dst, LEN};
  transfer_status_t st = {STATUS_WAITING, 0};
  int rc = seg < 0 ? -1 : submitTransfer(me, batch, &req, 1);
  while (rc == 0 && st.status != STATUS_COMPLETED && st.status != STATUS_FAILED)
    rc = getTransferStatus(me, batch, 0, &st);
  int ok = rc == 0 && st.status == STATUS_COMPLETED && memcmp(src, dst, LEN) == 0;
  printf("%s: %d bytes written to %s\n", ok ? "ok" : "FAILED", LEN, name);

  freeBatchID(me, batch);
  closeSegment(me, seg);
  unregisterLocalMemory(me, src);
  unregisterLocalMemory(target, dst);
  destroyTransferEngine(me);
  destroyTransferEngine(target);
  return ok ? 0 : 1;
}
