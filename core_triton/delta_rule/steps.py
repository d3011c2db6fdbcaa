"""Launches that both modes of ``gated_delta_rule`` run: the L2
normalisation of query and key (and its backward), and the fixed-order sums
of the partial query, key and beta gradients."""

from __future__ import annotations

from core_triton.common import reductions
from core_triton.common.launch import LaunchPlan
from core_triton.delta_rule import l2norm
from core_triton.delta_rule.args import DeltaRuleArgs


def normalize(a: DeltaRuleArgs) -> list[LaunchPlan]:
    """``qn``, ``kn``: query and key L2-normalised over K (none without
    ``use_qk_l2norm``)."""
    if not a.l2norm:
        return []
    shape = (a.B, a.T, a.HK, a.K)
    return [l2norm.forward_plan(n, shape, a.dtype, out) for n, out in (("query", "qn"), ("key", "kn"))]


def query_key_names(a: DeltaRuleArgs) -> tuple[str, str]:
    """The names under which the kernels read query and key."""
    return ("qn", "kn") if a.l2norm else ("query", "key")


# With use_qk_l2norm: the normalisation's backward sums the query/key
# gradients' partials itself (True), or reads their sum from a reduction
# launch (False; the same float32 sums in the same order).  H100, B4 T4k
# HV32 K=V=128 bf16 forward+backward: KDA 11.40 ms of kernels against
# 11.62, GDN 7.94 against 8.16.
SUMS_IN_L2NORM = True


def gradient_sums(a: DeltaRuleArgs, qk_parts: int, beta_parts: int, beta_dtype: str) -> list[LaunchPlan]:
    """``d_query``, ``d_key``, ``d_beta`` from ``dq_parts``, ``dk_parts``
    (``[qk_parts, B, T, HK, K]`` float32) and ``dbeta_parts`` (``[beta_parts,
    B, T, HV]``), through the normalisation's backward when there is one."""
    shape = (a.B, a.T, a.HK, a.K)
    beta_shape = (a.B, a.T, a.HV)
    steps = [reductions.reduce_partials_plan("dbeta_parts", beta_parts, beta_shape, beta_dtype, "d_beta")]
    for src, parts, summed in (("query", "dq_parts", "dqn"), ("key", "dk_parts", "dkn")):
        out = f"d_{src}"
        if not a.l2norm:
            steps.append(reductions.reduce_partials_plan(parts, qk_parts, shape, a.dtype, out))
        elif SUMS_IN_L2NORM:
            steps.append(l2norm.backward_plan(src, parts, shape, a.dtype, out, parts=qk_parts))
        else:
            steps += [
                reductions.reduce_partials_plan(parts, qk_parts, shape, "float32", summed),
                l2norm.backward_plan(src, summed, shape, a.dtype, out),
            ]
    return steps
