"""The ring of ``ring_attention`` in PyTorch: the transport (point-to-point
``isend``/``irecv`` in a ``torch.distributed`` group; NCCL on GPUs, gloo on
the CPU) and the array operations of core_triton.attention.ring_walk's
:class:`RingBackend`.  The rank is an int here: the schedule decides every
step on the host."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from core_triton.attention import ring as core
from torch_api._attention import contiguous_cast
from torch_api._launch import device_constant, info
from torch_api._launch import launch as launch_plan


class Ring:
    """This rank's place in ``group`` (None: the default group); ``launch``
    runs a plan (the op module's, which tests may watch)."""

    def __init__(self, group, device, launch=launch_plan):
        self.group, self.device, self._launch = group, torch.device(device), launch
        self.n = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._global = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)

    def start(self, tensors: dict, shift: int = 1):
        """``(received, requests)``: send ``tensors`` ``shift`` ranks on,
        receive the same from ``shift`` ranks back; a shift of 0 (mod n)
        sends nothing."""
        if shift % self.n == 0:
            return dict(tensors), []
        to, frm = self._global((self.rank + shift) % self.n), self._global((self.rank - shift) % self.n)
        recv = {k: torch.empty_like(t) for k, t in tensors.items()}
        ops = []
        for k in sorted(tensors):
            ops.append(dist.P2POp(dist.isend, tensors[k].contiguous(), to, self.group))
            ops.append(dist.P2POp(dist.irecv, recv[k], frm, self.group))
        return recv, dist.batch_isend_irecv(ops)

    def wait(self, handle):
        """What ``start``'s transfer received, once it has."""
        if handle is None:
            return None
        for r in handle[1]:
            r.wait()
        return handle[0]

    def launch(self, plan, inputs):
        return self._launch(plan, inputs)

    info = staticmethod(info)

    def offsets(self, offsets):
        return device_constant(tuple(offsets), torch.int32, self.device)

    cast = staticmethod(contiguous_cast)

    @staticmethod
    def bias_grad(bias, zero):
        return (torch.zeros if zero else torch.empty)(bias.shape, dtype=bias.dtype, device=bias.device)

    @staticmethod
    def put_columns(db, db_step, pieces):
        for a, g, c in pieces:
            db[..., g : g + c] = db_step[..., a : a + c]
        return db

    def mine(self, t_local: int, zigzag: bool):
        """This rank's global token indices (its layout's order)."""
        order = layout(self.n, self.n * t_local, zigzag, self.device)[0]
        return order[self.rank * t_local : (self.rank + 1) * t_local]


def group(name):
    """The process group of ``name`` (None: the default group)."""
    return None if name is None else dist.distributed_c10d._resolve_process_group(name)


@functools.lru_cache(maxsize=64)
def layout(n: int, length: int, zigzag: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, inverse)`` int32 on ``device`` for a sequence of ``length``
    over ``n`` ranks (identity without ``zigzag``), made once: building the
    order in Python and copying it to the GPU on every step would cost O(T)
    host work and a stream synchronisation."""
    order = core.zigzag_order(n, length) if zigzag else range(length)
    order = torch.tensor(order, dtype=torch.int32, device=device)
    return order, torch.argsort(order).to(torch.int32)
