"""``gated_delta_rule`` for JAX (semantics: core_triton.delta_rule)."""

from __future__ import annotations

import jax

from core_triton.delta_rule import gated_delta_rule as core
from jax_api._launch import info
from jax_api._op import apply


def gated_delta_rule(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    beta: jax.Array,
    g: jax.Array | None = None,
    gk: jax.Array | None = None,
    softmax_scale: float | None = None,
    initial_state: jax.Array | None = None,
    output_final_state: bool = False,
    cu_seqlens: jax.Array | None = None,
    use_qk_l2norm: bool = False,
    mode: str = "auto",
) -> tuple[jax.Array, jax.Array | None]:
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
    operands = dict(query=query, key=key, value=value, beta=beta, g=g, gk=gk, initial_state=initial_state)
    cu = info(cu_seqlens, "cu_seqlens")

    def plan(infos):
        return core.plans(
            *(infos.get(n) for n in ("query", "key", "value", "beta", "g", "gk")),
            softmax_scale,
            infos.get("initial_state"),
            output_final_state,
            cu,
            use_qk_l2norm,
            mode,
        )

    out, final = apply(plan, cu_seqlens, operands)
    return out, (final if output_final_state else None)
