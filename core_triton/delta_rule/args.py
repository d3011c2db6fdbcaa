"""Argument checks of ``gated_delta_rule`` (docs/api.md#gated_delta_rule),
before any kernel runs: shapes, dtypes and options, each failure a
ValueError/TypeError naming the argument."""

from __future__ import annotations

from dataclasses import dataclass

from core_triton.common import checks
from core_triton.common.launch import TensorInfo

MAX_HEAD_DIM = 256
MODES = ("auto", "chunk", "recurrent")
# Gate kinds, the kernels' GATE constexpr: none, one log decay per token and
# value head (g), or one per key channel too (gk).
NO_GATE, SCALAR_GATE, VECTOR_GATE = 0, 1, 2


@dataclass(frozen=True)
class DeltaRuleArgs:
    """Sizes and options of one call.  ``HK``: query/key heads, ``HV``:
    value heads (a multiple of ``HK``: value head ``h`` reads key head
    ``h // (HV // HK)``); ``N``: sequences (``B``, or packed sequences);
    ``gate``: NO_GATE, SCALAR_GATE or VECTOR_GATE."""

    B: int
    T: int
    HK: int
    HV: int
    K: int
    V: int
    N: int
    dtype: str
    scale: float
    gate: int
    l2norm: bool
    packed: bool

    @property
    def G(self) -> int:
        return self.HV // self.HK


def validate(
    query: TensorInfo,
    key: TensorInfo,
    value: TensorInfo,
    beta: TensorInfo,
    g: TensorInfo | None,
    gk: TensorInfo | None,
    softmax_scale,
    initial_state: TensorInfo | None,
    output_final_state,
    cu_seqlens: TensorInfo | None,
    use_qk_l2norm,
    mode,
) -> tuple[DeltaRuleArgs, str]:
    """Check every argument; returns the call's sizes and the mode asked for."""
    for name, t in (("query", query), ("key", key), ("value", value), ("beta", beta)):
        if t is None:
            raise TypeError(f"{name} is required")
        checks.check_float_tensor(t, name)
    for name, t in (("query", query), ("key", key), ("value", value)):
        checks.check_rank(t, name, (4,), "4-D [batch, seq_len, heads, head_dim]")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            f"query, key and value must share one dtype, got {query.dtype}, {key.dtype}, {value.dtype}"
        )
    B, T, HK, K = query.shape
    if tuple(key.shape) != (B, T, HK, K):
        raise ValueError(f"key must have query's shape {(B, T, HK, K)}, got {tuple(key.shape)}")
    if tuple(value.shape[:2]) != (B, T):
        raise ValueError(f"value must have query's [batch, seq_len] = {(B, T)}, got {tuple(value.shape)}")
    HV, V = value.shape[2], value.shape[3]
    if HK == 0 or HV % HK:
        raise ValueError(f"value heads ({HV}) must be a multiple of query/key heads ({HK})")
    for name, d in (("query/key head_dim", K), ("value head_dim", V)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name} must be between 1 and {MAX_HEAD_DIM}, got {d}")
    if tuple(beta.shape) != (B, T, HV):
        raise ValueError(
            f"beta must be [batch, seq_len, value heads] = {(B, T, HV)}, got {tuple(beta.shape)}"
        )
    if g is not None and gk is not None:
        raise ValueError("g and gk are alternatives (one decay per token, or per key channel): give one")
    gate = NO_GATE
    for name, t, shape, what, kind in (
        ("g", g, (B, T, HV), "[batch, seq_len, value heads]", SCALAR_GATE),
        ("gk", gk, (B, T, HV, K), "[batch, seq_len, value heads, key head_dim]", VECTOR_GATE),
    ):
        if t is None:
            continue
        checks.check_float_tensor(t, name)
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {what} = {shape}, got {tuple(t.shape)}")
        gate = kind
    scale = checks.check_scale(softmax_scale)
    checks.check_bool(output_final_state, "output_final_state")
    l2 = checks.check_bool(use_qk_l2norm, "use_qk_l2norm")
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    N = checks.check_cu_seqlens(cu_seqlens, B)
    packed = N is not None
    N = B if N is None else N
    if packed and N == 0 and T != 0:
        raise ValueError(f"cu_seqlens holds no sequence but the inputs have seq_len {T}")
    if initial_state is not None:
        checks.check_float_tensor(initial_state, "initial_state")
        if tuple(initial_state.shape) != (N, HV, K, V):
            raise ValueError(
                "initial_state must be [num_sequences, value heads, key head_dim, value head_dim] = "
                f"{(N, HV, K, V)}, got {tuple(initial_state.shape)}"
            )
    checks.check_same_device(
        {
            "query": query,
            "key": key,
            "value": value,
            "beta": beta,
            "g": g,
            "gk": gk,
            "initial_state": initial_state,
            "cu_seqlens": cu_seqlens,
        }
    )
    args = DeltaRuleArgs(
        B=B,
        T=T,
        HK=HK,
        HV=HV,
        K=K,
        V=V,
        N=N,
        dtype=query.dtype,
        scale=K**-0.5 if scale is None else scale,
        gate=gate,
        l2norm=l2,
        packed=packed,
    )
    return args, mode
