"""``ring_attention`` for PyTorch: flash attention over a sequence sharded
across the ranks of a ``torch.distributed`` group (algorithm:
core_triton.attention.ring).  Point-to-point ``isend``/``irecv`` move the
key/value shards (and in the backward their float32 dK/dV accumulators)
to the next rank while the current step's kernels run; partial results
merge in float32 by log-sum-exp.  NCCL on GPUs, gloo on the CPU.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from core_triton.attention import ring as core
from core_triton.attention import softmax_parts
from torch_api._launch import device_constant, info, launch
from torch_api.flash_attention import sink_grad


class _Ring:
    """Send a dict of tensors to the next rank, receive the previous rank's."""

    def __init__(self, group):
        self.group = group
        self.n = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        to_global = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
        self.next = to_global((self.rank + 1) % self.n)
        self.prev = to_global((self.rank - 1) % self.n)

    def start(self, tensors: dict):
        recv = {k: torch.empty_like(t) for k, t in tensors.items()}
        ops = []
        for k in sorted(tensors):
            ops.append(dist.P2POp(dist.isend, tensors[k].contiguous(), self.next, self.group))
            ops.append(dist.P2POp(dist.irecv, recv[k], self.prev, self.group))
        return recv, dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(reqs):
        for r in reqs:
            r.wait()


def _merge(out, lse, out_b, lse_b):
    """Log-sum-exp merge in float32 (core_triton.attention.softmax_parts)."""
    plan = softmax_parts.ring_merge_plan(*out.shape[:3], out.shape[3])
    return launch(plan, {"out": out, "lse": lse, "out_b": out_b, "lse_b": lse_b})


def _add_sinks(out, lse, sink):
    """The sinks join the normaliser once (core_triton.attention.softmax_parts)."""
    plan = softmax_parts.ring_sinks_plan(*out.shape[:3], out.shape[3], info(sink))
    return launch(plan, {"out": out, "lse": lse, "softmax_aux": sink})


def _offsets(offsets, device):
    return device_constant(tuple(offsets), torch.int32, torch.device(device))


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, bias, fixed, moving, plans, ring, schedule):
        t_local = q.shape[1]
        kv = {"k": k, "v": v, **moving}
        B, _, HQ, _ = q.shape
        out = torch.zeros(B, t_local, HQ, v.shape[3], dtype=torch.float32, device=q.device)
        lse = torch.full((B, HQ, t_local), float("-inf"), dtype=torch.float32, device=q.device)
        for step in schedule.steps(ring.rank):
            nxt, reqs = ring.start(kv) if not step.last else (None, [])
            inputs = {
                "q": q,
                **kv,
                **fixed,
                "qoff": _offsets(step.q_offsets, q.device),
                "koff": _offsets(step.k_offsets, q.device),
            }
            if bias is not None:
                inputs["bias"] = bias
            out_b, lse_b = launch(plans.forward, inputs)
            out, lse = _merge(out, lse, out_b, lse_b)
            ring.wait(reqs)
            kv = nxt
        if sink is not None:
            out, lse = _add_sinks(out, lse, sink)
        ctx.save_for_backward(q, k, v, sink, bias, out, lse)
        ctx.fixed, ctx.moving, ctx.plans, ctx.ring, ctx.schedule = fixed, moving, plans, ring, schedule
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, sink, bias, out, lse = ctx.saved_tensors
        ring, plans = ctx.ring, ctx.plans
        n = ring.n
        dout = (torch.zeros_like(q[..., :1].expand(*q.shape[:3], v.shape[3])) if dout is None else dout).to(
            q.dtype
        )
        (delta,) = launch(plans.preprocess(info(out), info(dout)), {"o": out, "do": dout})
        if dlse is not None:
            delta = delta - dlse.float()
        dkdv_plan, dq_plan = plans.grads(info(dout))
        kv = {"k": k, "v": v, **ctx.moving}
        acc = {"dk": torch.zeros(k.shape, dtype=torch.float32, device=k.device), "dv": None}
        acc["dv"] = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        # The bias gradient, only when asked for: one bias-sized array that
        # each step fills at its shard's columns (every column once).
        db = None
        if ctx.needs_input_grad[4]:
            db = torch.empty(bias.shape, dtype=bias.dtype, device=bias.device)
            dbias_plan = plans.dbias(info(dout))
        for step in ctx.schedule.steps(ring.rank):
            nxt, reqs = ring.start(kv) if not step.last else (None, [])
            inputs = {
                "q": q,
                **kv,
                **ctx.fixed,
                "qoff": _offsets(step.q_offsets, q.device),
                "koff": _offsets(step.k_offsets, q.device),
            }
            inputs.update({"do": dout, "lse": lse, "delta": delta})
            if bias is not None:
                inputs["bias"] = bias
            dk_s, dv_s = launch(dkdv_plan, inputs)
            (dq_s,) = launch(dq_plan, inputs)
            dq += dq_s
            # src's accumulators leave with its shard; after n hops they are home.
            acc = {"dk": acc["dk"] + dk_s, "dv": acc["dv"] + dv_s}
            if n > 1:
                acc, acc_reqs = ring.start(acc)
                ring.wait(acc_reqs)
            if db is not None:
                (db_s,) = launch(dbias_plan, inputs)
                for a, g, c in step.bias_pieces:
                    db[..., g : g + c] = db_s[..., a : a + c]
            ring.wait(reqs)
            kv = nxt
        dsink = sink_grad(sink, lse, delta) if ctx.needs_input_grad[3] else None
        return (
            dq.to(q.dtype),
            acc["dk"].to(k.dtype),
            acc["dv"].to(v.dtype),
            dsink,
            db,
            None,
            None,
            None,
            None,
            None,
        )


def ring_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    softmax_aux: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    causal: bool = False,
    logits_soft_cap: float | None = None,
    softmax_scale: float | None = None,
    q_positions: torch.Tensor | None = None,
    kv_positions: torch.Tensor | None = None,
    return_lse: bool = False,
    zigzag: bool = False,
    axis_name=None,
    group=None,
):
    """``flash_attention`` over the whole sequence, called on every rank of
    ``group`` (None: the default group) with the local shards: ``query [B,
    T_local, HQ, D]``, ``key/value [B, T_local, H, D(v)]``, ids and
    positions ``[B, T_local]``, ``bias [B|1, HQ|1, T_local, n*T_local]``
    (global key order).  ``zigzag``: the shards are in the zig-zag layout
    (``zigzag_reorder``).  ``axis_name`` is the JAX binding's and must be
    None here.  Explicit positions are global."""
    if axis_name is not None:
        raise ValueError("axis_name is for the JAX binding; PyTorch takes group (None: the default group)")
    if not dist.is_initialized():
        raise ValueError("ring_attention needs an initialised torch.distributed process group")
    ring = _Ring(group)
    contig = lambda t: None if t is None else t.detach().contiguous()  # noqa: E731
    q_segment_ids, kv_segment_ids = contig(q_segment_ids), contig(kv_segment_ids)
    q_positions, kv_positions = contig(q_positions), contig(kv_positions)
    softmax_aux = None if softmax_aux is None else softmax_aux.contiguous()
    plans, return_lse = core.plans(
        info(query),
        info(key),
        info(value),
        ring.n,
        bool(zigzag),
        info(q_segment_ids),
        info(kv_segment_ids),
        info(softmax_aux),
        info(bias),
        sliding_window,
        causal,
        logits_soft_cap,
        softmax_scale,
        info(q_positions),
        info(kv_positions),
        return_lse,
    )
    t_local, n = query.shape[1], ring.n
    fixed, moving = {}, {}
    qs = q_segment_ids if q_segment_ids is not None else kv_segment_ids
    ks = kv_segment_ids if kv_segment_ids is not None else q_segment_ids
    if qs is not None:
        fixed["q_segment_ids"], moving["kv_segment_ids"] = qs, ks
    if q_positions is not None or kv_positions is not None:
        order, _ = _layout(n, n * t_local, bool(zigzag), query.device)
        mine = order[ring.rank * t_local : (ring.rank + 1) * t_local]
        fixed["q_positions"] = q_positions if q_positions is not None else mine
        moving["kv_positions"] = kv_positions if kv_positions is not None else mine
    schedule = core.RingSchedule(
        n,
        t_local,
        bool(zigzag),
        bool(causal),
        q_positions is not None or kv_positions is not None,
        sliding_window is not None,
    )
    out, lse = _RingAttention.apply(
        query, key, value, softmax_aux, bias, fixed, moving, plans, ring, schedule
    )
    return (out, lse) if return_lse else out


@functools.lru_cache(maxsize=64)
def _layout(n: int, length: int, zigzag: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, inverse)`` int32 on ``device`` for a sequence of ``length``
    over ``n`` ranks (identity without ``zigzag``), made once: building the
    order in Python and copying it to the GPU on every step would cost O(T)
    host work and a stream synchronisation."""
    order = core.zigzag_order(n, length) if zigzag else range(length)
    order = torch.tensor(order, dtype=torch.int32, device=device)
    return order, torch.argsort(order).to(torch.int32)


def zigzag_reorder(x: torch.Tensor, ring_size: int, axis: int = 1) -> torch.Tensor:
    """Global sequence -> zig-zag layout along ``axis`` (shard ``r`` of an
    equal split holds chunks ``r`` and ``2n-1-r`` of ``2n``)."""
    return x.index_select(axis, _layout(int(ring_size), x.shape[axis], True, x.device)[0])


def zigzag_restore(x: torch.Tensor, ring_size: int, axis: int = 1) -> torch.Tensor:
    """Inverse of ``zigzag_reorder``."""
    return x.index_select(axis, _layout(int(ring_size), x.shape[axis], True, x.device)[1])
