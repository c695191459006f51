"""tierswap's Communicator over a torch.distributed process group (gloo on CPU).

tierswap.torch uses it when torch.distributed is initialized with more than one rank (or when
``communicator=TorchCommunicator(group)`` is given): each rank owns 1/world of the optimizer
state, hands over its *local* gradients (they are summed over ranks: scale the loss by 1/world
for a mean) and receives the whole model's updated 16-bit parameters after every step.

The collectives (tierswap's Communicator contract, include/tierswap/communicator.hpp), on CPU
tensors viewing tierswap's buffers without a copy where the backend allows:
  reduce_scatter  16-bit and fp32 sums computed in fp32 with all_reduce, rounded once to the
                  buffer's dtype (gloo has no reduce_scatter); this rank's piece kept
  all_gather_v    pieces padded to the largest, all_gather'ed as bytes, copied into place
  all_reduce_sum  fp64 all_reduce; all_reduce_or: int max; broadcast: bytes; barrier
"""

import torch
import torch.distributed as dist

from . import _tierswap

_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


class TorchCommunicator(_tierswap.Communicator):
    """A tierswap Communicator over `group` (default: the world)."""

    def __init__(self, group=None):
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("TorchCommunicator: torch.distributed is not initialized "
                               "(call torch.distributed.init_process_group first)")
        self.group = group
        self._rank = dist.get_rank(group)
        self._size = dist.get_world_size(group)

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    @staticmethod
    def _tensor(mv, dtype):
        return torch.frombuffer(mv, dtype=dtype) if len(mv) else torch.empty(0, dtype=dtype)

    def reduce_scatter(self, send, recv, counts, dtype, offset):
        full = self._tensor(send, _DTYPES[dtype]).float()  # a copy: send stays as it was
        dist.all_reduce(full, group=self.group)
        mine = self._tensor(recv, _DTYPES[dtype])
        mine.copy_(full[offset:offset + counts[self._rank]])

    def all_gather_v(self, buf, counts, displs, dtype):
        es = torch.empty(0, dtype=_DTYPES[dtype]).element_size()
        whole = self._tensor(buf, torch.uint8)
        width = max(counts) * es
        r = self._rank
        piece = torch.zeros(width, dtype=torch.uint8)
        piece[:counts[r] * es] = whole[displs[r] * es:(displs[r] + counts[r]) * es]
        out = [torch.empty(width, dtype=torch.uint8) for _ in range(self._size)]
        dist.all_gather(out, piece, group=self.group)
        for q, t in enumerate(out):
            if q != r and counts[q]:
                whole[displs[q] * es:(displs[q] + counts[q]) * es] = t[:counts[q] * es]

    def all_reduce_sum(self, data):
        t = self._tensor(data, torch.float64)
        dist.all_reduce(t, group=self.group)

    def all_reduce_or(self, flag):
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())

    def broadcast(self, data, root):
        t = self._tensor(data, torch.uint8)
        dist.broadcast(t, src=root, group=self.group)

    def barrier(self):
        dist.barrier(group=self.group)


_CHOICES = ("auto", "single", "torch", "mpi", "nccl")


def default_communicator(requested):
    """What tierswap.torch uses: a TorchCommunicator when `requested` is one or is "auto" with
    torch.distributed initialized at world size > 1; the native MPI communicator for "mpi", and
    for "auto" under an MPI launcher (made here, before the optimizer, so that the ranks agree on
    the Python side's checks over it before the native constructor's collectives); else None
    (the native "single" or "nccl")."""
    if isinstance(requested, _tierswap.Communicator):
        return requested
    if requested not in _CHOICES:
        raise ValueError(f"communicator {requested!r}: expected one of {', '.join(_CHOICES)} "
                         "(torch: torch.distributed's process group) or a "
                         "tierswap.distributed.TorchCommunicator")
    if requested == "torch":
        return TorchCommunicator()
    if requested == "auto" and dist.is_available() and dist.is_initialized() \
            and dist.get_world_size() > 1:
        return TorchCommunicator()
    if requested == "mpi" or (requested == "auto" and _tierswap.launched_by_mpi()
                              and _tierswap.mpi_available()):
        return _tierswap.make_communicator("mpi")
    return None
