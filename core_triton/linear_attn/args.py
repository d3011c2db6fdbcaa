"""Argument checks shared by the linear-attention ops (recurrent, chunk,
lightning): shapes, dtypes and options as docs/api.md#linear-attention states
them, before any kernel runs."""

from __future__ import annotations

from dataclasses import dataclass

from core_triton.common import checks
from core_triton.common.launch import LaunchPlan, TensorInfo
from core_triton.common.op import OpPlans

MAX_HEAD_DIM = 256
# The float inputs of the linear-attention ops, in argument order.
OPERANDS = ("query", "key", "value", "g", "g_gamma", "gk", "gv", "initial_state")


@dataclass(frozen=True)
class LinearAttnArgs:
    """Sizes and options of one call.  ``N``: number of sequences (``B``, or
    packed sequences); ``G = HQ // H`` query heads per state head."""

    B: int
    T: int
    HQ: int
    H: int
    K: int
    V: int
    N: int
    dtype: str
    scale: float
    reverse: bool
    packed: bool

    @property
    def G(self) -> int:
        return self.HQ // self.H


def linear_attn_plans(
    args: LinearAttnArgs,
    forward: tuple[LaunchPlan, ...],
    backward: tuple[LaunchPlan, ...],
    inputs: tuple[str, ...],
    offsets: tuple[tuple[str, int], ...],
    residuals: tuple[str, ...],
    grads: tuple[tuple[str, str], ...],
    inference: tuple[LaunchPlan, ...] = (),
) -> OpPlans:
    """The launches of one linear-attention call, as both bindings run them
    (core_triton.common.op.OpPlans).

    ``forward`` reads the inputs named in ``inputs`` (those given) and the
    index inputs (``cu_seqlens`` and the chunk offsets of ``offsets``) and
    writes ``o`` and ``final``.  ``backward`` reads the same, the forward
    outputs named in ``residuals``, and the cotangents ``do`` (``o``'s
    dtype) and ``dht`` (float32); ``grads`` pairs each input with the
    backward output that holds its gradient; ``inference``: a forward for
    calls that no gradient follows (same inputs and outputs), if it
    differs.  Inputs and cotangents reach the kernels row-major."""
    return OpPlans(
        forward=tuple(forward),
        backward=tuple(backward),
        inputs=tuple(inputs),
        outputs=("o", "final"),
        cotangents=("do", "dht"),
        grads=tuple(grads),
        saved=tuple(inputs),
        residuals=tuple(residuals),
        offsets=tuple(offsets),
        seq_len=args.T,
        contiguous=True,
        args=args,
        inference=tuple(inference),
    )


def validate(
    query: TensorInfo,
    key: TensorInfo,
    value: TensorInfo,
    g: TensorInfo | None = None,
    g_gamma: TensorInfo | None = None,
    gk: TensorInfo | None = None,
    gv: TensorInfo | None = None,
    softmax_scale=None,
    initial_state: TensorInfo | None = None,
    reverse=False,
    cu_seqlens: TensorInfo | None = None,
) -> LinearAttnArgs:
    """Check every argument (docs/api.md#linear-attention); raise ValueError/TypeError
    naming the first one that is wrong."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t is None:
            raise TypeError(f"{name} is required")
        checks.check_float_tensor(t, name)
        checks.check_rank(t, name, (4,), "4-D [batch, seq_len, heads, head_dim]")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            f"query, key and value must share one dtype, got {query.dtype}, {key.dtype}, {value.dtype}"
        )
    B, T, HQ, K = query.shape
    if key.shape[:2] != (B, T) or value.shape[:2] != (B, T):
        raise ValueError(
            f"key and value must have query's [batch, seq_len] = {(B, T)}, "
            f"got key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    H = key.shape[2]
    if key.shape[3] != K:
        raise ValueError(f"key's head_dim must equal query's ({K}), got key {tuple(key.shape)}")
    if value.shape[2] != H:
        raise ValueError(f"value must have key's number of heads ({H}), got value {tuple(value.shape)}")
    V = value.shape[3]
    if H == 0 or HQ % H:
        raise ValueError(f"query heads ({HQ}) must be a multiple of key/value heads ({H})")
    for name, d in (("query/key head_dim", K), ("value head_dim", V)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name} must be between 1 and {MAX_HEAD_DIM}, got {d}")
    gates = {
        "g": (g, (B, T, H), "[batch, seq_len, heads]"),
        "g_gamma": (g_gamma, (H,), "[heads]"),
        "gk": (gk, (B, T, H, K), "[batch, seq_len, heads, key head_dim]"),
        "gv": (gv, (B, T, H, V), "[batch, seq_len, heads, value head_dim]"),
    }
    for name, (t, shape, what) in gates.items():
        if t is None:
            continue
        checks.check_float_tensor(t, name)
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {what} = {shape}, got {tuple(t.shape)}")
    scale = checks.check_scale(softmax_scale)
    reverse = checks.check_bool(reverse, "reverse")
    N = checks.check_cu_seqlens(cu_seqlens, B)
    packed = N is not None
    N = B if N is None else N
    if initial_state is not None:
        checks.check_float_tensor(initial_state, "initial_state")
        if tuple(initial_state.shape) != (N, H, K, V):
            raise ValueError(
                f"initial_state must be [num_sequences, heads, key head_dim, value head_dim] = "
                f"{(N, H, K, V)}, got {tuple(initial_state.shape)}"
            )
    checks.check_same_device(
        {
            "query": query,
            "key": key,
            "value": value,
            "g": g,
            "g_gamma": g_gamma,
            "gk": gk,
            "gv": gv,
            "initial_state": initial_state,
            "cu_seqlens": cu_seqlens,
        }
    )
    return LinearAttnArgs(
        B=B,
        T=T,
        HQ=HQ,
        H=H,
        K=K,
        V=V,
        N=N,
        dtype=query.dtype,
        scale=K**-0.5 if scale is None else scale,
        reverse=reverse,
        packed=packed,
    )
