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

import torch

from core_triton.attention import flash as core
from core_triton.attention import flash_call
from core_triton.attention.flash_options import INDEX
from core_triton.common.launch import run_named
from torch_api._attention import PARAMS
from torch_api._launch import device_constant, info, launch
from torch_api._library import Param
from torch_api._reuse import LastMade

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
        # Kept for the next call with the same, unchanged tensors (torch_api._reuse).
        originals = tuple(a[n] for n in (*INDEX, "cu_seqlens", "cu_seqlens_k") if a[n] is not None)

        def make():
            sources = dict(inputs)
            if a["cu_seqlens"] is not None:
                sources["cu_q"] = a["cu_seqlens"].detach()
                sources["cu_k"] = sources["cu_q"] if a["cu_seqlens_k"] is None else a["cu_seqlens_k"].detach()
            made = run_named(ids, sources, launch)
            return {n: made[n] for plan in ids for n in plan.output_names}

        inputs.update(_MADE.get(originals, ids, make))
    if a["softmax_aux"] is not None:
        inputs["softmax_aux"] = a["softmax_aux"].contiguous()
    if a["bias"] is not None:
        inputs["bias"] = a["bias"]
    return plans, inputs


# The index arrays made for the last call, and from what.
_MADE = LastMade()


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


def grad_plans(plans, out, dout, dlse: bool):
    """The backward's plans (dK/dV, dQ) for a cotangent's and the output's
    layouts; ``dlse``: whether an ``lse`` cotangent comes too."""
    key = (id(plans), dout.shape, dout.stride(), dout.dtype, out.stride(), dlse)
    found = _grad_memo.get(key)
    if found is None or found[0] is not plans:
        found = (plans, *plans.grads(info(dout), info(out), dlse))
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
