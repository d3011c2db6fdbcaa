"""What a binding's ``flash_attention`` call does, written once: its
planning (packed input and segment ids: core_triton.attention.packed.prepare;
then the attention: core_triton.attention.flash.plans) and the order of
its backward's launches (each ring step's too).  A binding gives
``launch(plan, inputs) -> outputs`` and ``cast(x, dtype)``."""

from __future__ import annotations

from collections.abc import Callable

from core_triton.attention import flash, packed
from core_triton.attention.flash_options import AttentionCall
from core_triton.common.launch import LaunchPlan, TensorInfo, run_steps


def call_plans(
    call: AttentionCall,
) -> tuple[flash.AttentionPlans, bool, dict[str, TensorInfo | None], tuple[LaunchPlan, ...]]:
    """``(plans, return_lse, index, launches)``: the attention's plans, the
    infos of the index arrays they read (by name: segment ids, positions,
    ``q_key_range``, ``kv_query_range``) and the launches that make them
    (from the ids' names, or from ``cu_q`` and ``cu_k`` for packed input;
    none when the call gives what the plans read)."""
    index, launches = packed.prepare(call.query, call.key, call.cu_seqlens, call.cu_seqlens_k, call.index)
    plans, return_lse = flash.plans(
        call.query,
        call.key,
        call.value,
        **call.planned(index),
        q_key_range=index.get("q_key_range"),
        kv_query_range=index.get("kv_query_range"),
    )
    return plans, return_lse, index, launches


def gradients(launch: Callable, cast: Callable, steps: tuple, inputs: dict, out, lse, dout, dlse):
    """``(dq, dk, dv, dbias, delta)``: the attention's backward on the
    forward's ``inputs`` (by the plans' names).  ``steps``: the dK/dV, dQ
    and bias-gradient plans (``plans.grads(do, o, dlse is not None)``, then
    ``dbias``), the last None when the bias needs no gradient (nothing is
    launched or allocated for it then; else the bias's shape and dtype,
    reduced over broadcast dims inside the launch).  ``delta [B, HQ, Tq]``
    float32: ``rowsum(out * dout)`` less ``dlse``, the ``lse`` cotangent
    (None: an unused ``lse``, the usual case)."""
    return grads(launch, *steps, {**inputs, **backward_inputs(cast, out, lse, dout, dlse)})


def backward_inputs(cast: Callable, out, lse, dout, dlse) -> dict:
    """What every backward launch reads beside the forward's inputs: ``o``,
    ``do``, ``lse`` and, unless None, ``dlse`` (float32, contiguous through
    the binding's ``cast``: the dQ kernel reads it so)."""
    named = {"o": out, "do": dout, "lse": lse}
    if dlse is not None:
        named["dlse"] = cast(dlse, lse.dtype)
    return named


def grads(launch: Callable, dkdv_steps: tuple, dq_steps: tuple, dbias_plan: LaunchPlan | None, inputs: dict):
    """``(dq, dk, dv, dbias, delta)`` of one set of backward ``inputs`` (a
    ring step's too): the dQ launches, which make ``delta``, then the dK/dV
    launches and the bias gradient's where ``dbias_plan`` is not None (else
    None)."""
    dq, delta = run_steps(dq_steps, inputs, launch)
    inputs = {**inputs, "delta": delta}
    dk, dv = run_steps(dkdv_steps, inputs, launch)
    return dq, dk, dv, (None if dbias_plan is None else launch(dbias_plan, inputs)[0]), delta
