"""Flash attention's options: a call's arguments as one value
(:class:`AttentionCall`, what the bindings hand core), the argument checks
of docs/api.md#flash_attention, normalised into :class:`Options` (what the
plans of core_triton.attention.flash and the ring key on)."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from core_triton.attention.flash_common import POS_INF_INT
from core_triton.common import checks
from core_triton.common.launch import TensorInfo

MAX_HEAD_DIM = 256
# Windows wider than this are unbounded (positions stay below 2**29).
_MAX_WINDOW = POS_INF_INT // 2


@dataclass(frozen=True)
class Options:
    """Normalised options of one attention call."""

    causal: bool
    window: tuple[int, int] | None
    cap: float | None
    scale: float
    # "offsets" (positions = index + qoff/koff) or "explicit" (arrays).
    positions: str = "offsets"
    q_pieces: int = 1
    k_pieces: int = 1
    q_chunk: int = 0
    k_chunk: int = 0


# The index arrays of a call (segment ids and positions).
INDEX = ("q_segment_ids", "kv_segment_ids", "q_positions", "kv_positions")
# Its arrays (by the public argument names).
ARRAYS = ("query", "key", "value", "softmax_aux", "bias", *INDEX, "cu_seqlens", "cu_seqlens_k")
# What flash.plans and ring.plans take after query, key and value, beside
# the index arrays.
_PLANNED = (
    "softmax_aux",
    "bias",
    "sliding_window",
    "causal",
    "logits_soft_cap",
    "softmax_scale",
    "return_lse",
)


@dataclass(frozen=True)
class AttentionCall:
    """One ``flash_attention`` / ``ring_attention`` call as core plans it:
    the infos of its arrays (None where not given) and its options as the
    caller gave them (:func:`validate` checks them).  A binding makes it
    from its arguments by name with :meth:`of`."""

    query: TensorInfo
    key: TensorInfo
    value: TensorInfo
    q_segment_ids: TensorInfo | None = None
    kv_segment_ids: TensorInfo | None = None
    softmax_aux: TensorInfo | None = None
    bias: TensorInfo | None = None
    sliding_window: Any = None
    causal: Any = False
    logits_soft_cap: Any = None
    softmax_scale: Any = None
    q_positions: TensorInfo | None = None
    kv_positions: TensorInfo | None = None
    return_lse: Any = False
    cu_seqlens: TensorInfo | None = None
    cu_seqlens_k: TensorInfo | None = None

    @classmethod
    def of(cls, arguments: Mapping[str, Any], info_of: Callable[[Any, str], TensorInfo | None]):
        """From a binding's arguments by name (names that are not the
        call's, such as the ring's ``zigzag``, are left out; missing ones
        take their defaults); ``info_of(array, name)`` gives an array's
        info."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{n: info_of(v, n) if n in ARRAYS else v for n, v in arguments.items() if n in names})

    @property
    def index(self) -> dict[str, TensorInfo | None]:
        """The index arrays' infos by name."""
        return {n: getattr(self, n) for n in INDEX}

    def planned(self, index: dict[str, TensorInfo | None]) -> dict[str, Any]:
        """The keyword arguments of ``flash.plans`` / ``ring.plans`` after
        query, key and value, with the index arrays ``index`` (what packed
        input or segment ids' ranges made of the call's: packed.prepare)."""
        return {**{n: getattr(self, n) for n in _PLANNED}, **{n: index.get(n) for n in INDEX}}


def _window(value) -> tuple[int, int] | None:
    if value is None:
        return None

    def one(x, what):
        if x is None:
            return _MAX_WINDOW
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise TypeError(f"sliding_window{what} must be an int or None, got {type(x).__name__}")
        if x < 0:
            raise ValueError(f"sliding_window{what} must be >= 0, got {int(x)}")
        return min(int(x), _MAX_WINDOW)

    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"sliding_window must be an int or a (left, right) pair, got {value!r}")
        return one(value[0], "[0] (left)"), one(value[1], "[1] (right)")
    w = one(value, "")
    return w, w


def window_pair(value) -> list[int] | None:
    """``sliding_window`` as the bindings pass it to their ops: ``None`` or
    ``[left, right]`` (a side given as ``None`` is unbounded)."""
    w = _window(value)
    return None if w is None else list(w)


def _cap(value) -> float | None:
    cap = checks.check_scale(value, "logits_soft_cap")
    if cap is not None and cap <= 0:
        raise ValueError(f"logits_soft_cap must be positive, got {cap}")
    return cap


def check_sinks(softmax_aux: TensorInfo | None, HQ: int) -> None:
    """Sinks ``[HQ]`` or ``[HQ, S]`` (S >= 1) of a float dtype, or None
    (flash_attention, ring_attention, decode_attention)."""
    if softmax_aux is None:
        return
    checks.check_float_tensor(softmax_aux, "softmax_aux")
    if softmax_aux.ndim not in (1, 2) or softmax_aux.shape[0] != HQ or 0 in softmax_aux.shape:
        raise ValueError(
            f"softmax_aux must be [HQ={HQ}] or [HQ={HQ}, S], got shape {list(softmax_aux.shape)}"
        )


def _check_ids(info: TensorInfo | None, name: str, batch: int, length: int, allow_1d: bool) -> None:
    if info is None:
        return
    if info.dtype not in checks.INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 (or int64), got {info.dtype}")
    shapes = [(batch, length)] + ([(length,)] if allow_1d else [])
    if tuple(info.shape) not in shapes:
        want = " or ".join(str(list(s)) for s in shapes)
        raise ValueError(f"{name} must have shape {want}, got {list(info.shape)}")


def validate(
    query: TensorInfo,
    key: TensorInfo,
    value: TensorInfo,
    q_segment_ids=None,
    kv_segment_ids=None,
    softmax_aux=None,
    bias=None,
    sliding_window=None,
    causal=False,
    logits_soft_cap=None,
    softmax_scale=None,
    q_positions=None,
    kv_positions=None,
    return_lse=False,
    kv_len: int | None = None,
):
    """The argument checks of docs/api.md#flash_attention; returns ``(Options, return_lse)``.
    ``kv_len``: the length of the whole key sequence (the bias's last dim)
    when ``key`` is one shard of it (the ring)."""
    for info, name in ((query, "query"), (key, "key"), (value, "value")):
        checks.check_float_tensor(info, name)
        checks.check_rank(info, name, (4,), "[batch, seq_len, num_heads, head_dim]")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(
            f"query, key and value must share one dtype, got {query.dtype}, {key.dtype}, {value.dtype}"
        )
    B, Tq, HQ, D = query.shape
    Bk, Tk, H, Dk = key.shape
    if Bk != B or value.shape[0] != B:
        raise ValueError(f"key and value must have query's batch size {B}, got {Bk} and {value.shape[0]}")
    if value.shape[1] != Tk or value.shape[2] != H:
        raise ValueError(f"value must be [B, Tk={Tk}, H={H}, Dv], got shape {list(value.shape)}")
    if Dk != D:
        raise ValueError(f"key's head_dim must equal query's ({D}), got {Dk}")
    if H < 1 or HQ % H:
        raise ValueError(f"query's heads ({HQ}) must be a multiple of key's heads ({H})")
    if min(Tq, Tk) < 1:
        raise ValueError(f"query and key need seq_len >= 1, got {Tq} and {Tk}")
    for dim, name in ((D, "query/key head_dim"), (value.shape[3], "value head_dim")):
        if not 1 <= dim <= MAX_HEAD_DIM:
            raise ValueError(f"{name} must be in 1..{MAX_HEAD_DIM}, got {dim}")
    causal = checks.check_bool(causal, "causal")
    return_lse = checks.check_bool(return_lse, "return_lse")
    scale = checks.check_scale(softmax_scale)
    _check_ids(q_segment_ids, "q_segment_ids", B, Tq, False)
    _check_ids(kv_segment_ids, "kv_segment_ids", B, Tk, False)
    if q_segment_ids is not None and kv_segment_ids is None and Tq != Tk and kv_len is None:
        raise ValueError("q_segment_ids alone is used for the keys too, so it needs Tq == Tk")
    if kv_segment_ids is not None and q_segment_ids is None and Tq != Tk and kv_len is None:
        raise ValueError("kv_segment_ids alone is used for the queries too, so it needs Tq == Tk")
    _check_ids(q_positions, "q_positions", B, Tq, True)
    _check_ids(kv_positions, "kv_positions", B, Tk, True)
    check_sinks(softmax_aux, HQ)
    cols = Tk if kv_len is None else kv_len
    if bias is not None:
        checks.check_float_tensor(bias, "bias")
        s = tuple(bias.shape)
        if len(s) != 4 or s[0] not in (1, B) or s[1] not in (1, HQ) or s[2:] != (Tq, cols):
            raise ValueError(
                f"bias must be [B|1, HQ|1, Tq, Tk] = [{B}|1, {HQ}|1, {Tq}, {cols}], got {list(s)}"
            )
    checks.check_same_device(
        {
            "query": query,
            "key": key,
            "value": value,
            "q_segment_ids": q_segment_ids,
            "kv_segment_ids": kv_segment_ids,
            "softmax_aux": softmax_aux,
            "bias": bias,
            "q_positions": q_positions,
            "kv_positions": kv_positions,
        }
    )
    explicit = q_positions is not None or kv_positions is not None
    options = Options(
        causal=causal,
        window=_window(sliding_window),
        cap=_cap(logits_soft_cap),
        scale=D**-0.5 if scale is None else scale,
        positions="explicit" if explicit else "offsets",
        q_chunk=Tq,
        k_chunk=Tk,
    )
    return options, return_lse


def missing_positions(query_len: int, key_len: int, q_positions, kv_positions) -> dict[str, int]:
    """``{name: length}`` of the position arrays a binding must make as
    ``arange(length)`` (int32): the missing one when the other is given."""
    if q_positions is None and kv_positions is None:
        return {}
    out = {}
    if q_positions is None:
        out["q_positions"] = query_len
    if kv_positions is None:
        out["kv_positions"] = key_len
    return out
