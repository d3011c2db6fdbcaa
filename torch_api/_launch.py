"""Launching a core_triton plan on torch tensors."""

from __future__ import annotations

import functools
import os

import torch

from core_triton import NO_BACKEND_MESSAGE, In, LaunchPlan, TensorInfo, is_interpreted, launch_direct
from core_triton.common import launch as core_launch

_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int64": torch.int64,
}


# Tests set TWINKERNELS_POISON=1 (before this module is imported) so outputs
# start as NaN (or -1 for integers): an element a kernel forgets to write
# then shows.  Read once: an environment lookup on every launch was 8% of
# the fast path's host time (tests that switch it set POISON).
POISON = os.environ.get("TWINKERNELS_POISON", "0") == "1"


def poison_outputs() -> bool:
    """Whether outputs start as NaN (or -1): :data:`POISON`."""
    return POISON


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
    fast = _fast.get(id(plan))
    if fast is not None and fast.plan is plan:
        outputs = fast(inputs)
        if outputs is not None:
            return outputs
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
    if getattr(plan.kernel, "needs_global_scratch", False):
        # Tensor descriptors need 16-byte aligned bases (the interpreter
        # checks it too); a view that starts mid-allocation may not be
        # (JAX's buffers always are).
        used = {n: t if t.data_ptr() % 16 == 0 else t.clone() for n, t in used.items()}
    poison = poison_outputs()
    outputs = (
        [_allocate(spec, device, poison) for spec in plan.outputs]
        if not plan.aliases
        else _aliased(plan, used, device, poison)
    )
    if device.type != "cuda":
        launch_direct(plan, used, outputs)
        return outputs
    stream = functools.partial(_raw_stream, device.index)
    if device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            launch_direct(plan, used, outputs, stream)
    else:
        launch_direct(plan, used, outputs, stream)
        if fast is None:
            _remember(plan, used, outputs, device)
    return outputs


def _aliased(plan: LaunchPlan, used: dict, device, poison: bool) -> list[torch.Tensor]:
    """The outputs of a plan with aliases: each aliased output is its
    input's tensor (updated in place), the others fresh."""
    alias = dict(plan.aliases)
    return [
        used[alias[i]] if i in alias else _allocate(spec, device, poison)
        for i, spec in enumerate(plan.outputs)
    ]


# ---- the eager fast path ------------------------------------------------------
#
# At small sizes an eager call is bound by the host, and most of a launch's
# host time was this module's and core_triton's per-launch Python: the
# plan's input list, a dict of the inputs it uses, output allocation through
# the specs, each tensor's dtype, device and alignment checked against the
# replay's, the argument list rebuilt.  A plan fixes all of it except the
# tensors' addresses, so after a plan's first launch (which compiled the
# kernel and made core_triton's replay) :class:`_Fast` keeps the rest worked
# out: it checks what the compiled kernel was specialised on (each input's
# dtype, device and 16-byte alignment), allocates the outputs and calls the
# launcher's C entry.  Anything else (another device, a profiler's launch
# hooks, an unexpected argument) takes the plain path above.

_FAST_LIMIT = 1024
_fast: dict[int, _Fast] = {}


class _Fast:
    """One plan's launch with everything but the addresses worked out."""

    __slots__ = (
        *("plan", "slots", "nones", "args", "n_in", "outputs", "aliases"),
        *("index", "device", "call", "grid", "head", "post", "scratch", "tail"),
    )

    def __call__(self, inputs):
        """The outputs, launched; None (nothing launched) if anything
        differs from what the kernel was compiled for."""
        index = self.index
        if core_launch._hooks_set() or torch._C._cuda_getDevice() != index:
            return None
        args = self.args.copy()
        kept = []  # contiguous copies live until the launch is queued
        for name, dtype, aligned, one_d, positions in self.slots:
            t = inputs[name]
            if one_d:
                t = t.contiguous()
                kept.append(t)
            if t.dtype is not dtype or t.get_device() != index:
                return None
            p = t.data_ptr()
            if (p % 16 == 0) is not aligned:
                return None
            for pos in positions:
                args[pos] = p
        for name in self.nones:
            if inputs.get(name) is not None:
                return None
        outputs = []
        poison = poison_outputs()
        for i, (shape, dtype, fill) in enumerate(self.outputs):
            alias = self.aliases.get(i)
            if alias is not None:
                o = inputs[alias]  # written in place: the input's tensor (checked as a slot)
            else:
                if fill is None and poison:
                    fill = float("nan") if dtype.is_floating_point else -1
                if fill is None:
                    o = torch.empty(shape, dtype=dtype, device=self.device)
                else:
                    o = torch.full(shape, fill, dtype=dtype, device=self.device)
            outputs.append(o)
            args[self.n_in + i] = o.data_ptr()
        stream = torch._C._cuda_getCurrentRawStream(index)
        # Global scratch (the Gluon kernels' device-side descriptors), fresh
        # for each launch as Triton's launcher gives it; kept alive until
        # the launch is queued, then the caching allocator orders its reuse
        # after the kernel on this stream.
        scratch = None
        if self.scratch[0]:
            _ensure_scratch_allocator()  # Triton's allocator is per thread (autograd's too)
            scratch = core_launch.global_scratch(*self.scratch, stream)
        address = None if scratch is None else scratch.data_ptr()  # an int: no pointer query
        self.call(*self.grid, stream, *self.head, address, *self.post, *args, *self.tail)
        return outputs


def _remember(plan: LaunchPlan, used: dict, outputs: list, device: torch.device) -> None:
    """Keep a :class:`_Fast` for ``plan`` after its launch, where core_triton
    made a replay through the launcher's C entry."""
    entry = core_launch._replays.get(id(plan))
    if entry is None or entry[0] is not plan or entry[1] is None or entry[1].direct is None:
        return
    replay = entry[1]
    args = [*plan.arguments(used), *outputs]
    fast = _Fast()
    fast.plan = plan
    # One slot per distinct input, with every position it fills: a flash
    # launch passes one array (the piece offsets, q) for each absent
    # optional input, 15-17 tensor parameters from 5-8 arrays, and each
    # slot's checks are host time on every eager launch.
    slots, fast.nones = {}, []
    for pos, param in enumerate(plan.params):
        if not isinstance(param, In):
            continue
        t = used[param.name]
        if t is None:
            fast.nones.append(param.name)
        elif pos in replay.tensors:
            dtype, _, aligned = replay.signature[replay.tensors.index(pos)]
            # launch() reads 1-D index arrays through a contiguous copy.
            slot = slots.setdefault(param.name, (param.name, dtype, aligned, t.dim() == 1, []))
            if slot[1:4] != (dtype, aligned, t.dim() == 1):
                return  # specialised differently at two positions: keep the plain path
            slot[4].append(pos)
        else:
            return  # an input Triton took as a value: keep the plain path
    fast.slots = [(*slot[:4], tuple(slot[4])) for slot in slots.values()]
    fast.n_in = len(args) - len(outputs)
    # The template keeps the plan's scalars only: no tensor of this call.
    for *_, positions in fast.slots:
        for pos in positions:
            args[pos] = 0
    for pos in range(fast.n_in, len(args)):
        args[pos] = 0
    fast.args = args
    fast.outputs = [(tuple(s.shape), _DTYPES[s.dtype], s.fill) for s in plan.outputs]
    fast.aliases = dict(plan.aliases)
    if any(used[name].dim() == 1 for name in fast.aliases.values()):
        return  # the kernel would write launch()'s contiguous copy: the plain path
    # get_device()'s number (-1 for the CPU, which only tests use).
    fast.index, fast.device = (-1 if device.index is None else device.index), device
    fast.call = replay.direct
    fast.grid, fast.head, fast.post, fast.scratch = replay.grid, replay.head, replay.post, replay.scratch
    fast.tail = replay.tail
    if len(_fast) >= _FAST_LIMIT:
        _fast.clear()
    _fast[id(plan)] = fast


def _raw_stream(index: int) -> int:
    """The current stream's handle on device ``index`` (what Triton itself
    launches on)."""
    return torch._C._cuda_getCurrentRawStream(index)
