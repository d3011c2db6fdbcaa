"""``gated_delta_rule_step`` for JAX (semantics: core_triton.delta_rule.step),
forward only: the new state is an output aliased to the old one's buffer,
so ``jax.jit(..., donate_argnums=...)`` on the state updates it in place."""

from __future__ import annotations

import jax

from core_triton.common.launch import run_named
from core_triton.delta_rule import step as core
from jax_api._launch import info, launch


def gated_delta_rule_step(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    beta: jax.Array,
    state: jax.Array,
    g: jax.Array | None = None,
    gk: jax.Array | None = None,
    softmax_scale: float | None = None,
    use_qk_l2norm: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Decoding with the gated delta rule: a few new tokens per sequence (row)
    against a carried state; returns ``(output, state)``, forward only.

    query, key ``[B, T, HK, K]``, value ``[B, T, HV, V]``, beta ``[B, T,
    HV]``, g ``[B, T, HV]`` or gk ``[B, T, HV, K]`` as in
    ``gated_delta_rule`` (row ``b`` is one sequence, usually ``T == 1``);
    state ``[B, HV, K, V]`` float32, contiguous.  PyTorch updates ``state``
    in place and returns it; JAX returns the new state (under ``jax.jit``
    with the state's argument donated, in the same buffer).  The result is
    ``gated_delta_rule(..., initial_state=state, output_final_state=True,
    mode="recurrent")``.

    Reference: docs/api.md#gated_delta_rule_step"""
    arrays = {"query": query, "key": key, "value": value, "beta": beta, "state": state, "g": g, "gk": gk}
    steps = core.plans(*(info(arrays[n], n) for n in ("query", "key", "value", "beta", "state", "g", "gk")),
                       softmax_scale, use_qk_l2norm)  # fmt: skip
    env = run_named(steps, {n: a for n, a in arrays.items() if a is not None}, launch)
    return env["o"], env["state"]
