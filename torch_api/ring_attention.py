"""``ring_attention`` for PyTorch: flash attention over a sequence sharded
across the ranks of a ``torch.distributed`` group (algorithm:
core_triton.attention.ring); the op ``twinkernels::ring_attention`` (the
group travels by name).  Point-to-point ``isend``/``irecv`` move the
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
from core_triton.attention.flash import window_pair
from core_triton.common.checks import check_bool
from core_triton.common.launch import run_named, run_steps
from torch_api._launch import device_constant, info, launch
from torch_api._library import Impl, Param, TorchOp, fake_info
from torch_api.flash_attention import PARAMS as FLASH_PARAMS
from torch_api.flash_attention import sink_grad


class _Ring:
    """Send a dict of tensors ``shift`` ranks on, receive the same from
    ``shift`` ranks back."""

    def __init__(self, group):
        self.group = group
        self.n = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._global = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)

    def start(self, tensors: dict, shift: int = 1):
        """``(received, requests)``; a shift of 0 (mod n) sends nothing."""
        if shift % self.n == 0:
            return dict(tensors), []
        to, frm = self._global((self.rank + shift) % self.n), self._global((self.rank - shift) % self.n)
        recv = {k: torch.empty_like(t) for k, t in tensors.items()}
        ops = []
        for k in sorted(tensors):
            ops.append(dist.P2POp(dist.isend, tensors[k].contiguous(), to, self.group))
            ops.append(dist.P2POp(dist.irecv, recv[k], frm, self.group))
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


def _ring_forward(q, k, v, sink, bias, fixed, moving, plans, ring, schedule):
    """``(out [B, T_local, HQ, Dv] float32, lse [B, HQ, T_local])`` over the ring."""
    kv = {"k": k, "v": v, **moving}
    out = lse = None
    for step in schedule.steps(ring.rank):
        nxt, reqs = ring.start(kv) if not step.last else (None, [])
        if not step.masked_out:  # a step the mask removes launches nothing
            inputs = {
                "q": q,
                **kv,
                **fixed,
                "qoff": _offsets(step.q_offsets, q.device),
                "koff": _offsets(step.k_offsets, q.device),
            }
            if bias is not None:
                inputs["bias"] = bias
            out_b, lse_b = run_steps(plans.forward, inputs, launch)
            # The home step (first, never removed) starts the merge.
            out, lse = (out_b, lse_b) if out is None else _merge(out, lse, out_b, lse_b)
        ring.wait(reqs)
        kv = nxt
    if sink is not None:
        out, lse = _add_sinks(out, lse, sink)
    return out, lse


def _ring_backward(q, k, v, sink, bias, out, lse, dout, dlse, fixed, moving, plans, ring, schedule, need_db):
    """``(dq, dk, dv, db)`` in the inputs' dtypes (``db`` None unless ``need_db``).

    The float32 dK/dV accumulators of the visiting shard travel with it: a
    step adds its gradients to the ones that arrived and sends the sums on,
    and the next step's kernels run while they travel (they are waited for
    only when the next sum needs them).  After the walk they go home in one
    hop (``schedule.home_shift``)."""
    (delta,) = launch(plans.preprocess(info(out), info(dout)), {"o": out, "do": dout})
    if dlse is not None:
        delta = delta - dlse.float()
    dkdv_plan, dq_plan = plans.grads(info(dout))
    kv = {"k": k, "v": v, **moving}
    dq = None
    steps = schedule.steps(ring.rank)
    # The bias gradient, only when asked for: one bias-sized array that
    # each step fills at its shard's columns (every column at most once;
    # those of steps the mask removes, or the walk does not reach, are 0).
    db = None
    if need_db:
        gaps = len(steps) < ring.n or any(s.masked_out for s in steps)
        db = (torch.zeros if gaps else torch.empty)(bias.shape, dtype=bias.dtype, device=bias.device)
        dbias_plan = plans.dbias(info(dout))
    acc, acc_reqs = None, []
    for step in steps:
        nxt, reqs = ring.start(kv) if not step.last else (None, [])
        grads = None
        if not step.masked_out:
            inputs = {
                "q": q,
                **kv,
                **fixed,
                "qoff": _offsets(step.q_offsets, q.device),
                "koff": _offsets(step.k_offsets, q.device),
            }
            inputs.update({"do": dout, "lse": lse, "delta": delta})
            if bias is not None:
                inputs["bias"] = bias
            grads = run_steps(dkdv_plan, inputs, launch)
            (dq_s,) = run_steps(dq_plan, inputs, launch)
            dq = dq_s if dq is None else dq + dq_s
            if db is not None:
                (db_s,) = launch(dbias_plan, inputs)
                for a, g, c in step.bias_pieces:
                    db[..., g : g + c] = db_s[..., a : a + c]
        # The accumulators that arrived (sent by the previous step) belong to
        # this step's shard; wait for them only now, after its kernels.
        ring.wait(acc_reqs)
        if acc is None:  # the home step: never removed, nothing arrived
            acc = {"dk": grads[0], "dv": grads[1]}
        elif grads is not None:
            acc = {"dk": acc["dk"] + grads[0], "dv": acc["dv"] + grads[1]}
        acc, acc_reqs = ring.start(acc, schedule.home_shift() if step.last else 1)
        ring.wait(reqs)
        kv = nxt
    ring.wait(acc_reqs)
    return dq.to(q.dtype), acc["dk"].to(k.dtype), acc["dv"].to(v.dtype), db, delta


# flash_attention's arguments, then the ring's own.
_PARAMS = (
    *FLASH_PARAMS,
    Param("zigzag", "bool"),
    Param("group_name", "str?"),
    Param("cu_seqlens", "Tensor?"),
)
_TENSORS = tuple(p.name for p in _PARAMS if p.is_tensor)


_INDEX = ("q_segment_ids", "kv_segment_ids", "q_positions", "kv_positions")


def _plans(a, info_of, n):
    """``(plans, schedule, launches)``: one ring step's plans, the ring's
    schedule and, for packed input, the launches that make the global
    segment ids (core.packed)."""
    index, launches = core.packed(
        info_of(a["query"]), n, info_of(a["cu_seqlens"]), {x: info_of(a[x]) for x in _INDEX}
    )
    plans, _, schedule = core.plans(
        info_of(a["query"]),
        info_of(a["key"]),
        info_of(a["value"]),
        n,
        a["zigzag"],
        index["q_segment_ids"],
        index["kv_segment_ids"],
        info_of(a["softmax_aux"]),
        info_of(a["bias"]),
        a["sliding_window"],
        a["causal"],
        a["logits_soft_cap"],
        a["softmax_scale"],
        index["q_positions"],
        index["kv_positions"],
    )
    return plans, schedule, launches


def _group(name):
    return None if name is None else dist.distributed_c10d._resolve_process_group(name)


def _prepare(a):
    """Plans, ring, schedule and the fixed/moving index inputs of a call."""
    ring = _Ring(_group(a["group_name"]))
    contig = lambda t: None if t is None else t.detach().contiguous()  # noqa: E731
    a = dict(a)
    for name in ("q_segment_ids", "kv_segment_ids", "q_positions", "kv_positions"):
        a[name] = contig(a[name])
    if a["softmax_aux"] is not None:
        a["softmax_aux"] = a["softmax_aux"].contiguous()
    plans, schedule, launches = _plans(a, info, ring.n)
    query, zigzag = a["query"], a["zigzag"]
    t_local, n = query.shape[1], ring.n

    def mine():
        """This rank's global token indices (its layout's order)."""
        return _layout(n, n * t_local, zigzag, query.device)[0][
            ring.rank * t_local : (ring.rank + 1) * t_local
        ]

    if launches:
        # Packed input: the global segment ids, then this rank's tokens.
        cu = a["cu_seqlens"].detach()
        made = run_named(launches, {"cu_q": cu, "cu_k": cu}, launch)
        for name in ("q_segment_ids", "kv_segment_ids"):
            a[name] = made[name].index_select(1, mine())
    fixed, moving = {}, {}
    qs = a["q_segment_ids"] if a["q_segment_ids"] is not None else a["kv_segment_ids"]
    ks = a["kv_segment_ids"] if a["kv_segment_ids"] is not None else a["q_segment_ids"]
    if qs is not None:
        fixed["q_segment_ids"], moving["kv_segment_ids"] = qs, ks
    if a["q_positions"] is not None or a["kv_positions"] is not None:
        fixed["q_positions"] = a["q_positions"] if a["q_positions"] is not None else mine()
        moving["kv_positions"] = a["kv_positions"] if a["kv_positions"] is not None else mine()
    return a, plans, ring, schedule, fixed, moving


def _forward(a):
    prepared = _prepare(a)
    a, plans, ring, schedule, fixed, moving = prepared
    out, lse = _ring_forward(
        a["query"], a["key"], a["value"], a["softmax_aux"], a["bias"], fixed, moving, plans, ring, schedule
    )
    # The float32 output is a residual of the backward (its delta); a custom
    # op may not return one tensor twice, so only when the cast copies.
    final = out.to(a["query"].dtype)
    # The eager backward reuses the checks, plans and index arrays.
    return (final, lse), ([] if final is out else [out]), prepared


def _backward(a, outputs, extras, cotangents, needs, state):
    a, plans, ring, schedule, fixed, moving = _prepare(a) if state is None else state
    q, v = a["query"], a["value"]
    final, lse = outputs
    out = extras[0] if extras else final
    dout, dlse = cotangents
    shape = (*q.shape[:3], v.shape[3])
    dout = (torch.zeros(shape, dtype=q.dtype, device=q.device) if dout is None else dout).to(q.dtype)
    need = dict(zip(_TENSORS, needs, strict=True))
    dq, dk, dv, db, delta = _ring_backward(
        q, a["key"], v, a["softmax_aux"], a["bias"], out, lse, dout, dlse, fixed, moving, plans, ring,
        schedule, need["bias"],
    )  # fmt: skip
    sink = a["softmax_aux"]
    dsink = sink_grad(sink, lse, delta).to(sink.dtype) if need["softmax_aux"] else None
    grads = {"query": dq, "key": dk, "value": dv, "softmax_aux": dsink, "bias": db}
    return tuple(grads.get(n) for n in _TENSORS)


def _like(t):
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _fake_forward(a):
    n = dist.get_world_size(_group(a["group_name"]))
    _plans(a, fake_info, n)  # the checks
    q, v = a["query"], a["value"]
    B, T, HQ, _ = q.shape
    out = torch.empty(B, T, HQ, v.shape[3], dtype=q.dtype, device=q.device)
    lse = torch.empty(B, HQ, T, dtype=torch.float32, device=q.device)
    return (out, lse), ([] if q.dtype == torch.float32 else [torch.empty_like(out, dtype=torch.float32)])


def _fake_backward(a, outputs, extras, cotangents, needs):
    need = dict(zip(_TENSORS, needs, strict=True))
    grads = {n: _like(a[n]) for n in ("query", "key", "value")}
    for n in ("softmax_aux", "bias"):
        if need[n] and a[n] is not None:
            grads[n] = _like(a[n])
    return tuple(grads.get(n) for n in _TENSORS)


_OP = TorchOp("ring_attention", _PARAMS, 2, Impl(_forward, _backward, _fake_forward, _fake_backward))


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
    cu_seqlens: torch.Tensor | None = None,
):
    """``flash_attention`` over a sequence sharded across devices, called on
    every rank of ``group`` (None: the default ``torch.distributed`` group)
    with the local shards: ``query [B, T_local, HQ, D]``, ``key/value [B,
    T_local, H, D(v)]``, segment ids and positions ``[B, T_local]``, ``bias
    [B|1, HQ|1, T_local, n*T_local]`` (global key order).  Same options and
    defaults as ``flash_attention``; explicit positions are global. ``zigzag``
    (default False): the shards are in the zig-zag layout
    (``zigzag_reorder``). ``cu_seqlens`` (packed input, batch 1): int32/int64
    ``[N+1]`` boundaries of sequences in the global token order (before any
    zig-zag reordering), the same array on every device, shared by queries
    and keys; masks apply per sequence, tokens outside every sequence get
    output 0; not with segment ids or positions. ``axis_name`` is the JAX binding's and must be None
    here.  Returns the local output ``[B, T_local, HQ, Dv]`` (and ``lse [B,
    HQ, T_local]`` float32 with ``return_lse``).

    Reference: docs/api.md#ring_attention"""
    if axis_name is not None:
        raise ValueError("axis_name is for the JAX binding; PyTorch takes group (None: the default group)")
    if not dist.is_initialized():
        raise ValueError("ring_attention needs an initialised torch.distributed process group")
    return_lse = check_bool(return_lse, "return_lse")
    out, lse = _OP(
        query, key, value, q_segment_ids, kv_segment_ids, softmax_aux, bias, window_pair(sliding_window),
        causal, logits_soft_cap, softmax_scale, q_positions, kv_positions, check_bool(zigzag, "zigzag"),
        None if group is None else group.group_name, cu_seqlens,
    )  # fmt: skip
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
    """Global sequence -> zig-zag layout along ``axis`` (default 1): shard ``r``
    of an equal split in ``n = ring_size`` holds chunks ``r`` and ``2n-1-r``
    of ``2n``.  ``x.shape[axis]`` must be a multiple of ``2 * ring_size``
    (``ValueError``).

    Reference: docs/api.md#zigzag_reorder"""
    core.zigzag_order(ring_size, x.shape[axis])  # ValueError/TypeError naming ring_size
    return x.index_select(axis, _layout(int(ring_size), x.shape[axis], True, x.device)[0])


def zigzag_restore(x: torch.Tensor, ring_size: int, axis: int = 1) -> torch.Tensor:
    """Inverse of ``zigzag_reorder``: zig-zag layout along ``axis`` (default 1)
    back to the global order.

    Reference: docs/api.md#zigzag_restore"""
    core.zigzag_order(ring_size, x.shape[axis])  # ValueError/TypeError naming ring_size
    return x.index_select(axis, _layout(int(ring_size), x.shape[axis], True, x.device)[1])
