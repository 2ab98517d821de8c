"""transfer-engine for Python: the API of Mooncake's ``mooncake.engine``.

Migrating from Mooncake is one line::

    # from mooncake.engine import TransferEngine
    from transfer_engine import TransferEngine

``TransferEngine`` has the methods, arguments, defaults and integer return
codes of Mooncake's class, and speaks Mooncake's wire protocols, so a
process using it exchanges data with processes still running Mooncake.
Beyond Mooncake, transfers accept any buffer-protocol object (``bytearray``,
``memoryview``, numpy arrays) or CPU tensor where Mooncake wants an integer
address, every blocking call releases the GIL, and ``write`` / ``read`` /
``batch_write`` / ``batch_read`` / ``register`` / ``unregister`` raise
:class:`TransferError` with the engine's explanation instead of returning
a bare code.
"""

import enum as _enum

from ._errors import TransferError
from ._native import (
    SUPPORT_CUDA,
    SUPPORT_EFA,
    SUPPORT_HIP,
    SUPPORT_INTRA_NVLINK,
    SUPPORT_MNNVL,
    SUPPORT_MUSA,
    TransferEngine,
    TransferNotify,
    __version__,
)


class TransferOpcode(_enum.IntEnum):
    """Direction of a transfer, as Mooncake's ``TransferOpcode``."""

    Read = 0
    """Copy from the peer's segment into local memory."""
    Write = 1
    """Copy from local memory into the peer's segment."""

    __str__ = _enum.Enum.__str__


Read = TransferOpcode.Read
Write = TransferOpcode.Write

TransferEngine.TransferOpcode = TransferOpcode

__all__ = [
    "Read",
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "SUPPORT_MUSA",
    "TransferEngine",
    "TransferError",
    "TransferNotify",
    "TransferOpcode",
    "Write",
    "__version__",
]
