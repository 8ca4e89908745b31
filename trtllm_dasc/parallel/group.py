"""TPGroup: one process's view of the TP ranks.

Control goes through MPI (mpi4py, ``broadcast`` of small picklable objects from rank 0), tensors through
torch.distributed (``all_reduce``): gloo between CPU ranks, NCCL between GPUs. The torch group is
rendezvoused through a TCP store listening on 127.0.0.1 at a port rank 0 binds and broadcasts over MPI, so
no environment (MASTER_ADDR, ...) has to be set by the caller.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass

from trtllm_dasc.errors import UserError
from trtllm_dasc.spec import DEFAULT_TP_TIMEOUT_S


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the torch rendezvous here; tritonserver's ports in serve/), below the
    kernel's ephemeral range: a port from that range is free when probed but any socket may take it before
    its owner binds it, and a TP8 server's gloo mesh opens dozens (tritonserver, binding its metrics port
    only after the model and its ranks were up, found it taken and crashed in one of 25 arms)."""
    import random
    low = _ephemeral_low()
    candidates = random.Random().sample(range(max(1024, low - 12000), low), 64) if low > 2048 else []
    for port in candidates:
        if port in _HANDED_OUT:                 # one server asks for three: never the same twice
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if len(_HANDED_OUT) > 4096:
            _HANDED_OUT.clear()
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as s:                  # nothing free below the range: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def check_device(device: str) -> None:
    """Refuse a CUDA device where CUDA sees none, in one line: ModelRunner's check, and at TP each rank's
    before it picks its GPU as rank % device_count() (which raised ZeroDivisionError on every rank: a traceback
    per rank and mpirun's report). Every rank of the host sees the same devices, so every rank refuses alike."""
    import torch
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {device} requested but CUDA is not available")


def mpi_world():
    """MPI's world communicator (imported here: mpi4py is only needed by TP runs)."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise UserError(f"tensor parallelism needs mpi4py ({e}); `make test` installs it with Open MPI") from None
    return MPI.COMM_WORLD


@dataclass(eq=False)
class TPGroup:
    rank: int
    size: int
    comm: object            # mpi4py communicator
    backend: str            # torch.distributed backend: gloo | nccl

    @classmethod
    def from_mpi(cls, device: str = "cpu", timeout_s: float = DEFAULT_TP_TIMEOUT_S) -> "TPGroup":
        """Join the ranks of the current ``mpirun``; every rank calls this once, collectively."""
        import datetime

        import torch
        import torch.distributed as dist
        check_device(device)        # before the rendezvous: no rank waits in it for one that refused
        comm = mpi_world()
        rank, size = comm.Get_rank(), comm.Get_size()
        timeout = datetime.timedelta(seconds=timeout_s)
        listener = None
        if rank == 0:
            # the rendezvous store listens on a socket we bound to loopback ourselves: given only a host and
            # port, torch's store server binds every interface; this also leaves no window for another
            # process to take a probed port
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)
        port = comm.bcast(listener.getsockname()[1] if rank == 0 else None, root=0)
        if rank == 0:
            store = dist.TCPStore("127.0.0.1", port, size, True, timeout=timeout, wait_for_workers=False,
                                  master_listen_fd=listener.detach())
        else:
            store = dist.TCPStore("127.0.0.1", port, size, False, timeout=timeout)
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)
        return cls(rank, size, comm, backend)

    def all_reduce(self, tensor):
        """Sum over the ranks, in place; returns the tensor (the model's row-parallel reduction)."""
        import torch.distributed as dist
        dist.all_reduce(tensor)
        return tensor

    def all_to_all(self, recv, send, recv_sizes: list[int], send_sizes: list[int]) -> None:
        """Variable-split all-to-all of flat tensors (the checkpoint storage exchange)."""
        import torch.distributed as dist
        dist.all_to_all_single(recv, send, output_split_sizes=recv_sizes, input_split_sizes=send_sizes)

    def broadcast(self, obj=None):
        """Rank 0's ``obj`` on every rank."""
        return self.comm.bcast(obj, root=0)

    def gather(self, obj):
        """Every rank's ``obj`` as a list on rank 0 (None elsewhere)."""
        return self.comm.gather(obj, root=0)

    def close(self) -> None:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
