"""``gated_delta_rule``: the delta rule with optional decay, planned for
both bindings (semantics: docs/api.md#gated_delta_rule, reference:
naive.py).

``mode="chunk"`` (chunk.py: the WY/UT form over chunks of tokens) is the
training path; ``mode="recurrent"`` (recurrent.py: token by token) serves
short sequences and decoding; ``"auto"`` takes the recurrent path when the
time axis holds at most ``AUTO_RECURRENT_MAX`` tokens.  Both compute the
same function and its gradient in every float input.
"""

from __future__ import annotations

import functools

from core_triton.common.launch import TensorInfo
from core_triton.common.op import OpPlans
from core_triton.delta_rule import chunk, recurrent
from core_triton.delta_rule.args import DeltaRuleArgs, validate

# At most this many tokens on the time axis: "auto" runs token by token (one
# launch forward; a chunk call makes five or more).
AUTO_RECURRENT_MAX = 64


def plans(
    query: TensorInfo,
    key: TensorInfo,
    value: TensorInfo,
    beta: TensorInfo,
    g: TensorInfo | None = None,
    gk: TensorInfo | None = None,
    softmax_scale=None,
    initial_state: TensorInfo | None = None,
    output_final_state=False,
    cu_seqlens: TensorInfo | None = None,
    use_qk_l2norm=False,
    mode="auto",
) -> OpPlans:
    """Check the arguments (ValueError/TypeError naming the culprit) and plan
    the launches.  ``cu_seqlens`` values are never read on the host."""
    a, mode = validate(
        query, key, value, beta, g, gk, softmax_scale, initial_state, output_final_state, cu_seqlens,
        use_qk_l2norm, mode,
    )  # fmt: skip
    if mode == "auto":
        mode = "recurrent" if a.T <= AUTO_RECURRENT_MAX else "chunk"
    given = {"beta": beta, "g": g, "gk": gk, "initial_state": initial_state}
    dtypes = tuple(sorted((n, t.dtype) for n, t in given.items() if t is not None))
    return _make_plans(a, mode, dtypes)


@functools.lru_cache(maxsize=512)
def _make_plans(a: DeltaRuleArgs, mode: str, dtypes: tuple[tuple[str, str], ...]) -> OpPlans:
    dtypes = dict(dtypes)
    maker = recurrent.make_plans if mode == "recurrent" else chunk.make_plans
    forward, backward, offsets, residuals, inference = maker(a, dtypes)
    inputs = ("query", "key", "value", "beta", *(n for n in ("g", "gk", "initial_state") if n in dtypes))
    return OpPlans(
        forward=forward,
        backward=backward,
        inputs=inputs,
        outputs=("o", "final"),
        cotangents=("do", "dht"),
        grads=tuple((n, f"d_{n}") for n in inputs),
        saved=inputs,
        residuals=residuals,
        offsets=offsets,
        seq_len=a.T,
        contiguous=True,
        args=a,
        inference=inference,
    )
