"""Framework-free description of one kernel launch.

A binding asks an op module for a :class:`LaunchPlan`, maps the plan's named
inputs to its own arrays, allocates the outputs the plan describes, and
launches.  The parameter order follows jax-triton's convention, so the same
kernel signature serves both bindings: inputs and scalars in the order of
``params``, then one pointer per output, then the constexpr metaparameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core_triton.common.runtime import jit_function


@dataclass(frozen=True)
class TensorInfo:
    """What a plan needs to know of an array: shape, dtype name, element
    strides (row-major when the framework has no other layout) and device
    (``None`` where the framework places arrays itself)."""

    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]
    device: str | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class In:
    """A pointer parameter fed by the binding's input called ``name``."""

    name: str


@dataclass(frozen=True)
class OutputSpec:
    """An output buffer: its shape, dtype name and initial fill.

    ``fill=None`` means the kernel writes every element (tests poison such
    buffers with NaN); ``fill=0.0`` means the kernel accumulates into it.
    """

    shape: tuple[int, ...]
    dtype: str
    fill: float | None = None


@dataclass(frozen=True)
class LaunchPlan:
    """One launch.  ``grid`` is a tuple, or a callable of the metaparameters
    for autotuned kernels (whose configs then set ``num_warps`` and
    ``num_stages``: leave both None).  ``maxnreg``: a cap on registers per
    thread (PTX ``.maxnreg``; None: the compiler's choice), for a kernel
    whose greedy allocation leaves one program fewer per multiprocessor
    than a cap that costs no spill; the JAX binding launches such plans
    through jax_api._compiled (jax-triton cannot set it)."""

    kernel: Any
    grid: tuple[int, ...] | Callable[[dict[str, Any]], tuple[int, ...]]
    params: tuple[Any, ...]
    outputs: tuple[OutputSpec, ...]
    constexprs: Mapping[str, Any] = field(default_factory=dict)
    num_warps: int | None = 4
    num_stages: int | None = 2
    maxnreg: int | None = None
    # Names under which the outputs join the inputs of later launches of a
    # multi-launch op (see run_steps).
    output_names: tuple[str, ...] = ("out",)
    # (output index, input name): that output is written into the input's
    # own buffer (the kernel may read and write it; it must be the shape and
    # dtype of the output).  PyTorch passes the input tensor as the output
    # (an in-place update); JAX aliases the two (a new array, or the same
    # buffer where the caller donates it).
    aliases: tuple[tuple[int, str], ...] = ()

    def is_empty(self) -> bool:
        """True when a fixed grid has no program (zero-size tensors)."""
        return not callable(self.grid) and 0 in self.grid

    def input_names(self) -> tuple[str, ...]:
        """Names of the array inputs, in parameter order."""
        # Kept on the instance (plans are cached and launched many times);
        # not a field, so equality and hashing ignore it.
        names = self.__dict__.get("_input_names")
        if names is None:
            names = tuple(p.name for p in self.params if isinstance(p, In))
            object.__setattr__(self, "_input_names", names)
        return names

    def arguments(self, inputs: Mapping[str, Any]) -> list[Any]:
        """Positional kernel arguments (outputs excluded)."""
        try:
            return [inputs[p.name] if isinstance(p, In) else p for p in self.params]
        except KeyError:
            missing = [n for n in self.input_names() if n not in inputs]
            raise KeyError(f"launch plan needs inputs {missing}") from None

    def launch_options(self) -> dict[str, Any]:
        opts = kernel_constexprs(self.kernel, self.constexprs)
        if self.num_warps is not None:
            opts["num_warps"] = self.num_warps
        if self.num_stages is not None:
            opts["num_stages"] = self.num_stages
        if self.maxnreg is not None:
            opts["maxnreg"] = self.maxnreg
        return opts


def kernel_constexprs(kernel: Any, constexprs: Mapping[str, Any]) -> dict[str, Any]:
    """``constexprs`` (each constant by name) as ``kernel`` takes them: the
    names of each of its constexpr groups (runtime.jit's ``groups``; an
    autotuned kernel's function's) packed into one tuple argument, in the
    group's order."""
    groups = getattr(jit_function(kernel), "constexpr_groups", None)
    if not groups:
        return dict(constexprs)
    grouped = {n for names in groups.values() for n in names}
    out = {k: v for k, v in constexprs.items() if k not in grouped}
    for group, names in groups.items():
        out[group] = tuple(constexprs[n] for n in names)
    return out


def launch_direct(
    plan: LaunchPlan,
    inputs: Mapping[str, Any],
    outputs: Sequence[Any],
    stream: Callable[[], int] | None = None,
) -> None:
    """Launch ``plan`` on tensors Triton takes directly (torch tensors, on a
    GPU or, under the interpreter, on the CPU); ``outputs`` are allocated by
    the caller as ``plan.outputs`` describes.  ``stream()``, where given,
    returns the raw handle of the stream to launch on (the binding's
    current stream); it lets a replay skip Triton's own lookup."""
    if plan.is_empty():
        return
    args = [*plan.arguments(inputs), *outputs]
    entry = _replays.get(id(plan))
    if entry is not None and entry[0] is plan and entry[1] is not None:
        if entry[1].run(args, stream):
            return
    grid = plan.grid if callable(plan.grid) else tuple(plan.grid)
    compiled = plan.kernel[grid](*args, **plan.launch_options())
    if entry is None or entry[0] is not plan:
        if len(_replays) >= _REPLAY_LIMIT:
            _replays.clear()
        _replays[id(plan)] = (plan, _make_replay(plan, args, compiled))


# ---- replaying a compiled launch --------------------------------------------
#
# Triton's launch path binds and specialises every argument on every call
# (about 70 us for one of our kernels on the H100 host, against 20 us for a
# kernel with a dozen arguments), and an op of several launches is then
# bound by the host at small sizes.  A plan fixes every integer, float and
# constexpr argument, so after its first launch the compiled kernel can be
# called again directly as long as the input tensors keep the dtypes,
# device and 16-byte alignment that the specialisation saw (the outputs are
# the binding's fresh allocations of the plan's dtypes).  Anything
# unexpected (another Triton layout, the interpreter, a missing argument)
# keeps the plain path.
#
# Where the Triton version's launcher is one we know (3.6), the replay calls
# its compiled C entry itself with the tensors' addresses as integers: that
# skips Triton's per-launch Python (device and stream lookup, the scratch
# allocators' closures) and the driver query that checks each pointer, which
# the first launch of the plan already made.  A kernel that needs global
# scratch (device-side tensor descriptors: the Gluon kernels) gets it here as
# Triton would give it: grid x CTAs x the compiled per-program size, from
# the allocator set with ``triton.set_allocator``, fresh for each launch.
# A kernel that needs profiling scratch, or a launch hook set by a profiler,
# takes Triton's own runner instead.

_REPLAY_LIMIT = 1024
_replays: dict[int, tuple[LaunchPlan, Any]] = {}
# Triton versions whose CudaLauncher.launch takes (gridX, gridY, gridZ,
# stream, function, cooperative, pdl, global_scratch, profile_scratch,
# packed_metadata, launch_metadata, enter_hook, exit_hook, *args).
_DIRECT_TRITON = ("3.6.",)
# triton.knobs.runtime, looked up once (its hooks are checked on every direct launch).
_RUNTIME_KNOBS: list[Any] = [None]


class _Replay:
    """One plan's compiled launch, called again without Triton's binder."""

    __slots__ = (
        *("runner", "tail", "tensors", "outputs", "signature", "direct", "grid", "head"),
        *("scratch", "post"),
    )

    def __init__(self, runner, tail, tensors, outputs, signature, grid, entry):
        self.runner = runner
        self.tail = tail
        self.tensors = tensors  # positions of the plan's input tensors in the arguments
        self.outputs = outputs  # positions of the outputs
        self.signature = signature
        self.direct = entry.launch  # the C launch entry, or None
        self.grid = grid
        # The C entry's arguments between the stream and the global scratch,
        # then those between the scratch and the kernel's own (see DirectEntry).
        self.head, self.post = entry.head, entry.post
        # Bytes of global scratch for the whole grid, and their alignment; (0, 0): none.
        n = grid[0] * grid[1] * grid[2] * entry.scratch_size
        self.scratch = (n, entry.scratch_align)

    def global_scratch(self, stream: int) -> Any:
        """A fresh global-scratch buffer for one launch on ``stream`` (what
        Triton's launcher allocates), or None where the kernel needs none."""
        return global_scratch(*self.scratch, stream)

    def run(self, args: list[Any], stream: Callable[[], int] | None) -> bool:
        """Launch on ``args`` (inputs, then outputs) if they match the
        specialisation; False (nothing launched) otherwise."""
        sig, ptrs = _inspect(args, self.tensors)
        if sig != self.signature:
            return False
        if self.direct is None or stream is None or _hooks_set():
            self.runner(*args, *self.tail)
            return True
        for i in self.outputs:
            ptrs[i] = args[i].data_ptr()
        handle = stream()
        # The scratch buffer lives until the launch is queued; a
        # stream-ordered allocator then reuses it only after the kernel.  Its
        # address goes as an int (an object would be queried for its
        # pointer's attributes on every launch).
        scratch = self.global_scratch(handle)
        address = None if scratch is None else scratch.data_ptr()
        self.direct(*self.grid, handle, *self.head, address, *self.post, *ptrs, *self.tail)
        return True


def global_scratch(size: int, align: int, stream: int) -> Any:
    """``size`` bytes of global scratch aligned to ``align`` for one launch
    on ``stream``, from the allocator set with ``triton.set_allocator`` for
    this thread (as Triton's launcher takes it); None when ``size`` is 0."""
    if not size:
        return None
    from triton.runtime import _allocation

    return _allocation._allocator.get()(size, align, stream)


def _hooks_set() -> bool:
    """Whether a profiler hooked Triton's launches (the direct route would
    skip its hooks)."""
    runtime = _RUNTIME_KNOBS[0]  # set by _direct_entry before any direct route exists
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        # Triton 3.6 keeps a HookChain, empty unless something was added.
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _inspect(args: Sequence[Any], tensors: Sequence[int]) -> tuple[tuple[Any, ...], list[Any]]:
    """What Triton specialised on that a plan does not fix (each input
    tensor's dtype, device and whether its address is a multiple of 16), and
    ``args`` with those tensors' addresses in their places."""
    ptrs = list(args)
    sig = []
    for i in tensors:
        a = args[i]
        p = ptrs[i] = a.data_ptr()
        sig.append((a.dtype, a.device, p % 16 == 0))
    return tuple(sig), ptrs


def _make_replay(plan: LaunchPlan, args: Sequence[Any], compiled: Any) -> _Replay | None:
    kernel = plan.kernel
    meta = kernel_constexprs(kernel, plan.constexprs)
    if type(kernel).__name__ == "Autotuner":
        best = getattr(kernel, "best_config", None)
        if best is None:
            return None
        meta.update(best.kwargs)
        kernel = kernel.fn
    if type(kernel).__name__ not in _JIT_TYPES or not hasattr(compiled, "packed_metadata"):
        return None  # interpreted, or a Triton whose launch path we do not know
    names = list(getattr(kernel, "arg_names", ()))
    if len(names) < len(args):
        return None
    # A constexpr the plan leaves out takes the kernel's default (the
    # Gluon forward's PINGPONG), as Triton's binder would give it.
    defaults = {p.name: p.default for p in getattr(kernel, "params", ()) if getattr(p, "has_default", False)}
    for n in names[len(args) :]:
        if n not in meta:
            if n not in defaults:
                return None
            meta[n] = defaults[n]
    tail = tuple(meta[n] for n in names[len(args) :])
    grid = plan.grid
    if callable(grid):
        grid = grid(dict(zip(names, [*args, *tail], strict=True)))
    grid = tuple(grid) + (1,) * (3 - len(grid))
    n_in = len(args) - len(plan.outputs)
    tensors = tuple(i for i in range(n_in) if hasattr(args[i], "data_ptr"))
    outputs = tuple(range(n_in, len(args)))
    entry = _direct_entry(compiled)
    signature = _inspect(args, tensors)[0]
    return _Replay(compiled[grid], tail, tensors, outputs, signature, grid, entry)


@dataclass(frozen=True)
class DirectEntry:
    """A compiled launcher's C entry, split around its global-scratch slot:
    ``launch(gridX, gridY, gridZ, stream, *head, global_scratch, *post,
    *kernel_args)``.  ``scratch_size`` is the kernel's global scratch a
    program (bytes; 0: none), ``scratch_align`` its alignment.  ``launch``
    is None where the layout is unknown (then the replay takes Triton's
    runner)."""

    launch: Any = None
    head: tuple[Any, ...] = ()
    post: tuple[Any, ...] = ()
    scratch_size: int = 0
    scratch_align: int = 0


# The kernel classes whose launches are replayed (Gluon's subclasses
# JITFunction and binds, compiles and launches the same way).
_JIT_TYPES = ("JITFunction", "GluonJITFunction")


def _direct_entry(compiled: Any) -> DirectEntry:
    """The compiled launcher's C entry and the arguments it takes before the
    kernel's own, where this Triton's layout is known."""
    import triton

    if not triton.__version__.startswith(_DIRECT_TRITON):
        return DirectEntry()
    _RUNTIME_KNOBS[0] = triton.knobs.runtime
    launcher = compiled.run
    try:
        if launcher.profile_scratch_size or launcher.num_ctas != 1:
            return DirectEntry()
        head = (compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl)
        post = (
            None,  # profiling scratch
            compiled.packed_metadata,
            None,  # launch metadata (only enter hooks read it)
            None,  # enter hook (run checks that none is set)
            None,  # exit hook
        )
        size = int(launcher.global_scratch_size or 0)
        align = int(launcher.global_scratch_align or 1) if size else 0
        return DirectEntry(launcher.launch, head, post, size, align)
    except AttributeError:
        return DirectEntry()


def run_steps(steps: Sequence[LaunchPlan], inputs: Mapping[str, Any], launch_one) -> list[Any]:
    """Run launch plans in order, each seeing the op's inputs and the named
    outputs of the steps before it; returns the last step's outputs.
    ``launch_one(plan, named_arrays)`` is the binding's launcher."""
    env = dict(inputs)
    outputs: list[Any] = []
    for step in steps:
        outputs = list(launch_one(step, env))
        env.update(zip(step.output_names, outputs, strict=True))
    return outputs


def run_named(steps: Sequence[LaunchPlan], inputs: Mapping[str, Any], launch_one) -> dict[str, Any]:
    """Like :func:`run_steps`, for ops with several results: returns every
    named array (the inputs and each step's outputs) by name."""
    env = dict(inputs)
    for step in steps:
        env.update(zip(step.output_names, launch_one(step, env), strict=True))
    return env
