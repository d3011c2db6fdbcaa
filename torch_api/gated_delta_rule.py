"""``gated_delta_rule`` for PyTorch (semantics: core_triton.delta_rule);
the op ``twinkernels::gated_delta_rule``."""

from __future__ import annotations

import torch

from core_triton.delta_rule import gated_delta_rule as core
from torch_api._library import Param
from torch_api._op import define

_FLOATS = ("query", "key", "value", "beta", "g", "gk", "initial_state")


def _make(a, info):
    plans = core.plans(
        *(info(a[n]) for n in ("query", "key", "value", "beta", "g", "gk")),
        a["softmax_scale"],
        info(a["initial_state"]),
        a["output_final_state"],
        info(a["cu_seqlens"]),
        a["use_qk_l2norm"],
        a["mode"],
    )
    return plans, {n: a[n] for n in _FLOATS}


_OP = define(
    "gated_delta_rule",
    (
        Param("query", "Tensor"),
        Param("key", "Tensor"),
        Param("value", "Tensor"),
        Param("beta", "Tensor"),
        Param("g", "Tensor?"),
        Param("gk", "Tensor?"),
        Param("softmax_scale", "float?"),
        Param("initial_state", "Tensor?"),
        Param("output_final_state", "bool"),
        Param("cu_seqlens", "Tensor?"),
        Param("use_qk_l2norm", "bool"),
        Param("mode", "str"),
    ),
    2,
    _make,
    {n: n for n in _FLOATS},
)


def gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
    mode: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gated delta rule (Gated DeltaNet with ``g``, Kimi Delta Attention
    with ``gk``, DeltaNet with neither): returns ``(output, final_state)``.

    Per sequence and value head, with the float32 state ``S [K, V]``, each
    token ``t`` runs ``S = decay * S``; ``u = beta (v - S^T k)``; ``S = S +
    k u^T``; ``o = scale * S^T q``, where ``decay`` is ``exp(g[t])`` or
    ``diag(exp(gk[t]))``.

    query, key ``[B, T, HK, K]``; value ``[B, T, HV, V]`` (one dtype of
    float32/bfloat16/float16; ``HV % HK == 0``, value head ``h`` reads key
    head ``h // (HV // HK)``; K, V <= 256); beta ``[B, T, HV]``; optional
    log decays g ``[B, T, HV]`` or gk ``[B, T, HV, K]`` (not both);
    initial_state ``[N, HV, K, V]``; cu_seqlens int32/int64 ``[N+1]`` for
    packed input (``B == 1``).  ``softmax_scale`` defaults to ``K ** -0.5``;
    ``use_qk_l2norm`` L2-normalises query and key over K inside the op;
    ``mode``: ``"chunk"`` (training), ``"recurrent"`` (short sequences,
    decoding) or ``"auto"`` (recurrent up to 64 tokens).  Returns output
    ``[B, T, HV, V]`` (query's dtype) and the final state ``[N, HV, K, V]``
    float32 if ``output_final_state`` (else None); differentiable in every
    float input.

    Reference: docs/api.md#gated_delta_rule"""
    out, final = _OP(
        query, key, value, beta, g, gk, softmax_scale, initial_state, output_final_state, cu_seqlens,
        use_qk_l2norm, mode,
    )  # fmt: skip
    return out, (final if output_final_state else None)
