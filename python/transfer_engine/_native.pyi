"""Type stubs of the extension module ``transfer_engine._native``.

Integer-returning methods return Mooncake's codes (0 success; -1 failure;
-3 address not registered; -7 overlap; -101 name resolution, -102 socket,
-200 metadata); their reason is logged. ``write``, ``read``,
``batch_write``, ``batch_read``, ``register`` and ``unregister`` raise
:class:`transfer_engine.TransferError` with the engine's explanation.

A buffer object (not an integer address) handed to a transfer is kept
alive, with its buffer export, until the engine has ended every byte it
moves: an asynchronous batch holds it until the batch is seen finished or
the engine is closed, and a synchronous call that gives up (timeout) hands
it to the abandoned batch, which releases it once the engine has ended it.
"""

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, Union

class _Tensor(Protocol):
    """A CPU tensor (e.g. ``torch.Tensor``): ``data_ptr()`` and ``nbytes``
    (``register`` also uses ``untyped_storage()``)."""

    def data_ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...

# An integer address, any object exposing the buffer protocol (bytes,
# bytearray, memoryview, numpy arrays, mmap, ...), or a CPU tensor.
Buffer = Union[int, bytes, bytearray, memoryview, _Tensor, Any]

__version__: str
SUPPORT_CUDA: bool
SUPPORT_EFA: bool
SUPPORT_HIP: bool
SUPPORT_MNNVL: bool
SUPPORT_MUSA: bool
SUPPORT_INTRA_NVLINK: bool

class TransferNotify:
    """A notification: its name and message."""

    name: str
    msg: str
    def __init__(self, name: str = "", msg: str = "") -> None: ...

class TransferEngine:
    """A transfer engine with the API of Mooncake's ``mooncake.engine.TransferEngine``."""

    TransferOpcode: ClassVar[type]
    def __init__(self) -> None: ...

    # ---- Mooncake's API ----
    def initialize(
        self,
        local_hostname: str,
        metadata_server: str,
        protocol: str | None,
        device_name: str | None = None,
    ) -> int:
        """Creates the engine; 0, or -1."""
    def initialize_ext(
        self,
        local_hostname: str,
        metadata_server: str,
        protocol: str | None,
        device_name: str | None = None,
        metadata_type: str | None = None,
        auth_key_file: str | None = None,
    ) -> int:
        """``initialize`` with the metadata type separate, and the cluster key
        file(s) ``new[,old]`` (as ``MC_TE_AUTH_KEY_FILE``); 0, or -1."""
    def get_rpc_port(self) -> int:
        """Port of the handshake listener (P2P names are ``host:port``)."""
    def get_metrics_text(self) -> str:
        """The engine's metrics in the Prometheus text format (0.0.4), as
        ``GET /metrics`` on ``MC_TE_METRICS_ADDR`` serves them."""
    def allocate_managed_buffer(self, length: int) -> int:
        """Address of registered memory of at least ``length`` bytes, or 0."""
    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        """0, or -1 for an address not handed out (or freed twice)."""
    def transfer_sync_write(
        self,
        target_hostname: str,
        buffer: Buffer,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int:
        """Writes ``length`` bytes to the peer and waits; 0, or -1."""
    def transfer_sync_read(
        self,
        target_hostname: str,
        buffer: Buffer,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int:
        """Reads ``length`` bytes from the peer and waits; 0, or -1."""
    def transfer_sync(
        self,
        target_hostname: str,
        buffer: Buffer,
        peer_buffer_address: int,
        length: int,
        opcode: int,
        notify: TransferNotify | None = None,
        transport_hint: str = "",
    ) -> int:
        """One READ or WRITE, waited for, optionally notifying the peer; 0, or -1."""
    def batch_transfer_sync_write(
        self,
        target_hostname: str,
        buffers: Sequence[Buffer],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        """A batch of WRITEs, waited for; 0, or -1."""
    def batch_transfer_sync_read(
        self,
        target_hostname: str,
        buffers: Sequence[Buffer],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        """A batch of READs, waited for; 0, or -1."""
    def batch_transfer_sync(
        self,
        target_hostname: str,
        buffers: Sequence[Buffer],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: int,
        notify: TransferNotify | None = None,
        transport_hint: str = "",
    ) -> int:
        """A batch of READs or WRITEs, waited for; 0, or -1."""
    def batch_transfer_async_write(
        self,
        target_hostname: str,
        buffers: Sequence[Buffer],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        """Submits WRITEs; the batch id, or 0. The batch keeps the buffer objects."""
    def batch_transfer_async_read(
        self,
        target_hostname: str,
        buffers: Sequence[Buffer],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        """Submits READs; the batch id, or 0. The batch keeps the buffer objects."""
    def batch_transfer_async(
        self,
        target_hostname: str,
        buffers: Sequence[Buffer],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: int,
        transport_hint: str = "",
    ) -> int:
        """Submits READs or WRITEs; the batch id, or 0. The batch keeps the buffer objects."""
    def get_batch_transfer_status(self, batch_ids: Sequence[int]) -> int:
        """Waits for asynchronous batches and frees them; 0, or -1."""
    def transfer_submit_write(
        self,
        target_hostname: str,
        buffer: Buffer,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int:
        """Submits one WRITE; the batch id, or 0. The batch keeps the buffer object."""
    def transfer_check_status(self, batch_id: int) -> int:
        """1 completed, -1 failed, 0 running, -2 running past its deadline."""
    def cancel_batch(self, batch_id: int, timeout_ms: int = 1000) -> int:
        """Cancels an asynchronous batch: 0 done (freed), 1 still held, -1 unknown."""
    def write_bytes_to_buffer(self, dest_address: int, src: bytes | str | Buffer, length: int) -> int:
        """Copies ``length`` bytes of ``src`` to ``dest_address``; 0."""
    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        """The ``length`` bytes at ``source_address``."""
    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """Registers memory; 0, -1 (bad argument), -7 (overlap)."""
    def unregister_memory(self, buffer_addr: int) -> int:
        """0, or -3 when nothing is registered at ``buffer_addr``."""
    def batch_register_memory(
        self, buffer_addresses: Sequence[int], capacities: Sequence[int], location: str = "*"
    ) -> int:
        """Registers several buffers (all or none); 0, -1, -7."""
    def batch_unregister_memory(self, buffer_addresses: Sequence[int]) -> int:
        """0, or -3."""
    def get_local_topology(self, device_name: str | None = None) -> str:
        """The NIC priority matrix as Mooncake's JSON."""
    def get_first_buffer_address(self, segment_name: str) -> int:
        """Lowest buffer address the segment offers, or 0."""
    def get_segment_transport(self, segment_name: str) -> str:
        """``"local"``, ``"shm"``, ``"rdma"`` or ``"tcp"``: what carries data to the segment now."""
    def warmup_efa_segment(self, segment_name: str) -> int:
        """0 (no EFA transport in this build)."""
    def get_notifies(self) -> list[TransferNotify]:
        """Notifications received so far, oldest first."""
    def send_probe(self, peer_server_name: str) -> int:
        """0 when the peer's listener answers; -101, -102, -200 otherwise."""
    def get_engine(self) -> None:
        """None: there is no C++ engine object to hand out."""
    def get_engine_ptr(self) -> None:
        """None: there is no C++ engine object to hand out."""
    def transfer_write_on_cuda(self, *args: Any, **kwargs: Any) -> None:
        """Raises NotImplementedError (CUDA builds only)."""
    def transfer_read_on_cuda(self, *args: Any, **kwargs: Any) -> None:
        """Raises NotImplementedError (CUDA builds only)."""
    def batch_transfer_write_on_cuda(self, *args: Any, **kwargs: Any) -> None:
        """Raises NotImplementedError (CUDA builds only)."""
    def batch_transfer_read_on_cuda(self, *args: Any, **kwargs: Any) -> None:
        """Raises NotImplementedError (CUDA builds only)."""

    # ---- Beyond Mooncake ----
    @property
    def local_name(self) -> str:
        """The name peers open this engine by."""
    def write(self, target: str, buffer: Buffer, peer_address: int, length: int | None = None) -> None:
        """Writes ``buffer`` to the peer and waits; raises TransferError."""
    def read(self, target: str, buffer: Buffer, peer_address: int, length: int | None = None) -> None:
        """Reads from the peer into writable ``buffer`` and waits; raises TransferError."""
    def batch_write(
        self,
        target: str,
        buffers: Sequence[Buffer],
        peer_addresses: Sequence[int],
        lengths: Sequence[int] | None = None,
    ) -> None:
        """Writes several buffers as one batch; raises TransferError."""
    def batch_read(
        self,
        target: str,
        buffers: Sequence[Buffer],
        peer_addresses: Sequence[int],
        lengths: Sequence[int] | None = None,
    ) -> None:
        """Reads into several buffers as one batch; raises TransferError."""
    def register(self, buffer: Buffer, location: str = "*", remote_accessible: bool = True) -> int:
        """Registers a buffer object, keeps it (a tensor: its storage, which must
        not be resizable) until ``unregister``; its address."""
    def unregister(self, buffer: Buffer) -> None:
        """Unregisters a buffer (object or address); raises TransferError."""
    def close(self) -> None:
        """Stops the engine, then releases its memory and the objects its
        batches held; idempotent."""
    def __enter__(self) -> TransferEngine: ...
    def __exit__(self, *exc: object) -> bool: ...
