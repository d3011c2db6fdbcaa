"""Argument checks of the public API (docs/api.md), written once for both bindings.

They see shapes, dtype names and plain Python values only.  Every failure is
a ``ValueError`` or ``TypeError`` naming the argument; none of them is an
``assert``, so ``python -O`` changes nothing.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from core_triton.common.launch import TensorInfo

FLOAT_DTYPES = ("float32", "bfloat16", "float16")
INDEX_DTYPES = ("int32", "int64")


def float_dtype_name(value, name: str) -> str:
    """Normalise a dtype given as a string or a framework dtype's name."""
    text = str(value).split(".")[-1].lower()
    if text not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be one of {', '.join(FLOAT_DTYPES)}, got {value!r}")
    return text


def check_float_tensor(info: TensorInfo, name: str) -> None:
    if info.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have dtype {', '.join(FLOAT_DTYPES)}, got {info.dtype}")


def check_rank(info: TensorInfo, name: str, ranks: tuple[int, ...], what: str) -> None:
    if info.ndim not in ranks:
        raise ValueError(f"{name} must be {what}, got shape {tuple(info.shape)}")


def check_bool(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def check_power_of_two(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if value <= 0 or value & (value - 1):
        raise ValueError(f"{name} must be a positive power of two, got {value}")
    return value


def check_scale(value, name: str = "softmax_scale") -> float | None:
    """``None`` or a finite real number, returned as a Python float."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number or None, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def check_same_device(infos: dict[str, TensorInfo | None]) -> None:
    devices = {n: i.device for n, i in infos.items() if i is not None and i.device is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all inputs must be on one device, got {listing}")


def check_cu_seqlens(cu: TensorInfo | None, batch: int, name: str = "cu_seqlens") -> int | None:
    """Shape and dtype of ``cu_seqlens``; returns the number of sequences."""
    if cu is None:
        return None
    if cu.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 (or int64), got {cu.dtype}")
    if cu.ndim != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D [N+1] with N >= 0, got shape {tuple(cu.shape)}")
    if batch != 1:
        raise ValueError(
            f"{name} needs packed input with batch size 1 (sequences concatenated "
            f"along seq_len), got batch size {batch}"
        )
    return cu.shape[0] - 1


def check_cu_seqlens_values(values, seq_len: int, name: str = "cu_seqlens") -> None:
    """Values of ``cu_seqlens`` when they are known on the host: starts at 0,
    never decreases, ends at ``seq_len``."""
    v = np.asarray(values).astype(np.int64).reshape(-1)
    if v.size == 0:
        raise ValueError(f"{name} must hold at least one value")
    if v[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {int(v[0])}")
    if np.any(np.diff(v) < 0):
        raise ValueError(f"{name} must be non-decreasing, got {v.tolist()}")
    if v[-1] != seq_len:
        raise ValueError(f"{name}[-1] must equal seq_len of the packed input ({seq_len}), got {int(v[-1])}")
