"""Launching a core_triton plan on torch tensors."""

from __future__ import annotations

import functools
import os

import torch

from core_triton import NO_BACKEND_MESSAGE, LaunchPlan, TensorInfo, is_interpreted, launch_direct

_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int64": torch.int64,
}


def poison_outputs() -> bool:
    """Tests set TWINKERNELS_POISON=1 so outputs start as NaN (or -1 for
    integers): an element a kernel forgets to write then shows."""
    return os.environ.get("TWINKERNELS_POISON", "0") == "1"


def info(t: torch.Tensor | None, name: str = "argument") -> TensorInfo | None:
    """What core_triton's plans see of ``t``; ``name`` is the argument's
    name, for the error a non-tensor gets."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return TensorInfo(tuple(t.shape), str(t.dtype).split(".")[-1], tuple(t.stride()), str(t.device))


@functools.lru_cache(maxsize=256)
def device_constant(values: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small constant (piece offsets, lightning decays) on ``device``, made
    once.  A fresh ``torch.tensor(..., device=cuda)`` per call would copy from
    pageable memory and wait for the stream, ending the host's run-ahead."""
    return torch.tensor(values, dtype=dtype, device=device)


def dtype_arg(output_dtype):
    """A torch dtype as its name; anything else as given (core_triton checks it)."""
    return str(output_dtype).split(".")[-1] if isinstance(output_dtype, torch.dtype) else output_dtype


def _allocate(spec, device, poison: bool):
    dtype = _DTYPES[spec.dtype]
    if spec.fill is not None:
        return torch.full(spec.shape, spec.fill, dtype=dtype, device=device)
    if poison:
        fill = float("nan") if dtype.is_floating_point else -1
        return torch.full(spec.shape, fill, dtype=dtype, device=device)
    return torch.empty(spec.shape, dtype=dtype, device=device)


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    # The caching allocator's blocks are 512-byte aligned, past any alignment
    # Triton asks for (128 for tensor descriptors); the current stream's.
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_scratch_allocator() -> None:
    """Give Triton an allocator for kernels that build tensor descriptors on
    the device, unless the user set one.  Triton keeps it per thread
    (a ContextVar), so this runs before each such launch."""
    from triton.runtime import _allocation

    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        _allocation.set_allocator(_scratch)


def launch(plan: LaunchPlan, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Allocate the plan's outputs on the inputs' device and launch it."""
    names = plan.input_names()
    device = inputs[names[0]].device
    if device.type == "cpu" and not is_interpreted(plan.kernel):
        raise RuntimeError(NO_BACKEND_MESSAGE)
    if device.type == "cuda" and getattr(plan.kernel, "needs_global_scratch", False):
        _ensure_scratch_allocator()
    # 1-D index arrays are tiny; the kernels read them with unit stride.
    # Only the plan's own inputs are looked at: ``inputs`` holds every array
    # of a multi-launch op, and this runs on every launch.
    used = {}
    for n in names:
        t = inputs[n]
        used[n] = t.contiguous() if t.dim() == 1 else t
    poison = poison_outputs()
    outputs = [_allocate(spec, device, poison) for spec in plan.outputs]
    if device.type != "cuda":
        launch_direct(plan, used, outputs)
        return outputs
    stream = functools.partial(_raw_stream, device.index)
    if device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            launch_direct(plan, used, outputs, stream)
    else:
        launch_direct(plan, used, outputs, stream)
    return outputs


def _raw_stream(index: int) -> int:
    """The current stream's handle on device ``index`` (what Triton itself
    launches on)."""
    return torch._C._cuda_getCurrentRawStream(index)
