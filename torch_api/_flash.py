"""The plans and launch inputs of PyTorch's ``flash_attention``, for
torch_api.flash_attention's op: its eager planning, kept per call
signature because that is most of a call's host time at small sizes.

Index arrays and sinks are read with unit stride; packed input's segment
ids and positions are made from its boundaries, segment ids' ranges from
the ids (core_triton.attention.packed.prepare).  Each distinct call
signature's plans and constant index inputs are kept, and each
cotangent layout's backward plans; the arrays made from ids or boundaries
are reused by the next call with the same, unchanged tensor (a model's
next layer).
"""

from __future__ import annotations

import weakref

import torch

from core_triton.attention import flash as core
from core_triton.attention import flash_call
from core_triton.attention.flash_options import INDEX
from core_triton.common.launch import run_named
from torch_api._attention import PARAMS
from torch_api._launch import device_constant, info, launch
from torch_api._library import Param

# The op's own arguments: packed input's boundaries after the shared ones.
OP_PARAMS = (*PARAMS, Param("cu_seqlens", "Tensor?"), Param("cu_seqlens_k", "Tensor?"))


def call_plans(a, info_of):
    """``(plans, index, launches)``: the attention's plans, the infos of the
    index arrays it reads and the launches that make them (flash_call)."""
    call = core.AttentionCall.of(a, lambda t, _: info_of(t))
    plans, _, index, launches = flash_call.call_plans(call)
    return plans, index, launches


_NAMES = tuple(p.name for p in OP_PARAMS)
# Eager calls repeat the same shapes: each distinct call signature's plans
# and constant index inputs are kept (a call's host time is most of the
# work at small sizes; see torch_api._launch's fast path).
_MEMO_LIMIT = 256
_memo: dict = {}


def _signature(a):
    """What the plans depend on: each tensor's layout, every option, and
    core's plan generation (a test may switch the kernels core plans)."""
    return core.GENERATION, *(
        (v.shape, v.stride(), v.dtype, v.device) if isinstance(v, torch.Tensor) else v
        for v in map(a.get, _NAMES)
    )


def prepare(a):
    """Plans and launch inputs (index arrays and sinks read with unit stride;
    packed input's segment ids and positions made from its boundaries,
    segment ids' ranges from the ids)."""
    try:
        key = _signature(a)
        plans, constants, ids = _memo[key]
    except TypeError:  # an unhashable option (a list under the custom op): plan it
        plans, constants, ids = _plan_call(a)
    except KeyError:
        plans, constants, ids = _memo[key] = _plan_call(a)
        if len(_memo) > _MEMO_LIMIT:
            _memo.clear()
    inputs = {"q": a["query"], "k": a["key"], "v": a["value"], **constants}
    for name in INDEX:
        if a[name] is not None:
            inputs[name] = a[name].detach().contiguous()
    if ids:
        # Packed input's index arrays from its boundaries, or segment ids'
        # ranges from the ids (core_triton.attention.packed.prepare).
        originals = tuple(a[n] for n in (*INDEX, "cu_seqlens", "cu_seqlens_k") if a[n] is not None)
        made = _reused(ids, originals)
        if made is None:
            sources = dict(inputs)
            if a["cu_seqlens"] is not None:
                sources["cu_q"] = a["cu_seqlens"].detach()
                sources["cu_k"] = sources["cu_q"] if a["cu_seqlens_k"] is None else a["cu_seqlens_k"].detach()
            made = run_named(ids, sources, launch)
            made = {n: made[n] for plan in ids for n in plan.output_names}
            _keep(ids, originals, made)
        inputs.update(made)
    if a["softmax_aux"] is not None:
        inputs["softmax_aux"] = a["softmax_aux"].contiguous()
    if a["bias"] is not None:
        inputs["bias"] = a["bias"]
    return plans, inputs


# The index arrays made for the call before, and from what: a model passes
# one segment-ids (or boundaries) tensor to every layer of a forward (22 in
# a Llama 1B), and each layer would make the same ranges again.  Reused
# while the same tensor objects come back unchanged (their version
# counters) on the same stream (another stream could read them before they
# are written); never while a CUDA graph captures (a kept array would
# outlive what the graph reads, or hold values the capture never computed),
# nor for inference tensors (no version counter).
_made: tuple | None = None


def stream_of(t: torch.Tensor):
    """The current stream of ``t``'s device (None on the CPU)."""
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None


def _reusable(tensors) -> bool:
    if any(t.is_inference() for t in tensors):
        return False
    return not (tensors[0].is_cuda and torch.cuda.is_current_stream_capturing())


def _reused(ids, originals) -> dict | None:
    """The arrays :func:`_keep` kept, if ``ids`` and ``originals`` are what
    they were made from, unchanged, on this stream; else None."""
    kept = _made
    if kept is None or kept[0] is not ids or len(kept[1]) != len(originals) or not _reusable(originals):
        return None
    for (ref, version), t in zip(kept[1], originals, strict=True):
        if ref() is not t or t._version != version:
            return None
    return kept[3] if kept[2] == stream_of(originals[0]) else None


def _keep(ids, originals, made: dict) -> None:
    global _made
    if _reusable(originals):
        refs = tuple((weakref.ref(t), t._version) for t in originals)
        _made = (ids, refs, stream_of(originals[0]), made)


def _plan_call(a):
    """A call's plans, its constant index inputs (piece offsets, the
    positions a call leaves out) and the launches that make its index
    arrays (packed input, segment ids; else none)."""
    # Planned as launched: index arrays and sinks with unit stride.
    a = {n: (_contiguous(v) if n in (*INDEX, "softmax_aux") else v) for n, v in a.items()}
    plans, index, ids = call_plans(a, info)
    q = a["query"]
    has = (index["q_positions"] is not None, index["kv_positions"] is not None)
    return plans, constant_inputs(plans, *has, (q.shape[1], a["key"].shape[1]), q.device), ids


_grad_memo: dict = {}


def grad_plans(plans, out, dout):
    """The backward's plans (preprocess, dK/dV, dQ) for a cotangent's layout."""
    key = (id(plans), dout.shape, dout.stride(), dout.dtype, out.stride())
    found = _grad_memo.get(key)
    if found is None or found[0] is not plans:
        found = (plans, plans.preprocess(info(out), info(dout)), *plans.grads(info(dout)))
        if len(_grad_memo) >= _MEMO_LIMIT:
            _grad_memo.clear()
        _grad_memo[key] = found
    return found[1:]


def constant_inputs(plans, has_q_positions, has_kv_positions, lengths, device):
    """The index inputs that do not come from the call: the pieces' offsets
    and ``arange`` positions for the side that gives none when the other does."""
    device = torch.device(device)
    idx = {
        "qoff": device_constant(tuple(plans.qoff), torch.int32, device),
        "koff": device_constant(tuple(plans.koff), torch.int32, device),
    }
    given = (True if has_q_positions else None, True if has_kv_positions else None)
    for name, n in core.missing_positions(*lengths, *given).items():
        idx[name] = device_constant(tuple(range(n)), torch.int32, device)
    return idx


def _contiguous(t):
    return None if t is None else t.contiguous()
