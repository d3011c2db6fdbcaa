"""A plan's kernel compiled by Triton's own compiler, for a launcher that is
not Triton's (the JAX binding's jaxlib path, jax_api._compiled).

Triton's launch path (what the PyTorch binding uses) binds the arguments,
specialises them (pointers and integers divisible by 16, integers equal to
1, except the kernel's ``do_not_specialize`` sizes), builds an
``ASTSource`` and compiles it, keeping the result in its on-disk cache.
:func:`compile_plan` takes the same steps with the same binder on
stand-ins for the arrays (dtype only, addresses 16-byte aligned), so the
source, options and cache key are the ones the PyTorch binding compiles:
both bindings run the same PTX.  Nothing here needs a GPU: the target is
named by its compute capability (ahead-of-time compiles work on any host
with Triton).

What a launcher gets (:class:`CompiledLaunch`): the PTX and its metadata
(name, warps after Triton's warp-specialisation pass, shared memory), the
global scratch each program needs (tensor descriptors made on the device
live there), and one entry per kernel parameter that survived
specialisation, in order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from core_triton.common.launch import In, LaunchPlan

# Our dtype names (TensorInfo.dtype, OutputSpec.dtype) as Triton's.
TRITON_DTYPES = {
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float64": "fp64",
    "int32": "i32",
    "int64": "i64",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "uint32": "u32",
    "bool": "i1",
}


class _Buffer:
    """What Triton's binder sees of an array it will not touch: a dtype, and
    an address divisible by 16 (a launcher must check that the real one is,
    as jaxlib does for every array parameter marked divisible)."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: str):
        self.dtype = dtype

    @staticmethod
    def data_ptr() -> int:
        return 0


@dataclass(frozen=True)
class Param:
    """One parameter of the compiled kernel: an array (``value`` None,
    ``divisible`` its address's promised divisibility) or a scalar of
    Triton type ``type``."""

    array: bool
    type: str
    value: Any = None
    divisible: int = 0


@dataclass(frozen=True)
class CompiledLaunch:
    """A compiled kernel and how to call it.  ``params`` follow the kernel's
    arguments (inputs and scalars in the plan's order, then the outputs; a
    tuple argument's elements in its place), constexprs and
    specialised-away arguments left out.  ``scratch_bytes``
    is the global scratch of one program (0: none); the launcher passes
    ``grid size * num_ctas * scratch_bytes`` bytes aligned to
    ``scratch_align`` in Triton's global-scratch slot."""

    name: str
    ptx: str
    ttir: str
    num_warps: int
    num_ctas: int
    shared: int
    scratch_bytes: int
    scratch_align: int
    params: tuple[Param, ...]
    grid: tuple[int, int, int]
    capability: int


@functools.cache
def _target(capability: int):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    target = GPUTarget("cuda", capability, 32)
    return target, make_backend(target)


@functools.cache
def _binder(kernel, capability: int):
    from triton.runtime.jit import create_function_from_signature

    _, backend = _target(capability)
    return create_function_from_signature(kernel.signature, kernel.params, backend)


def _jit_function(kernel):
    if type(kernel).__name__ not in ("JITFunction", "GluonJITFunction"):
        raise NotImplementedError(
            "compile_plan takes a plain triton.jit (or gluon.jit) kernel with its config in the plan, "
            f"got {type(kernel).__name__}"
        )
    return kernel


def _source(kernel, signature, constexprs, attrs):
    """What triton.compile takes for ``kernel``: Gluon kernels build their
    IR through their own source class."""
    if kernel.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource(kernel, signature, constexprs, attrs)
    from triton.compiler import ASTSource

    return ASTSource(kernel, signature, constexprs, attrs)


def _flat_params(path: tuple[int, ...], ty: Any, value: Any, attrs: dict) -> list[Param]:
    """The compiled kernel's parameters for the argument at ``path`` (its
    position, and within a tuple argument its element's): a tuple (a
    tensor's strides as one argument) is its elements in order, as
    Triton's launcher passes them; a constexpr (the kernel's, or an
    element specialised to one) is no parameter."""
    if isinstance(ty, tuple):
        return [p for j, t in enumerate(ty) for p in _flat_params((*path, j), t, value[j], attrs)]
    if ty == "constexpr":
        return []
    if ty.startswith("*"):
        divisible = 16 if ["tt.divisibility", 16] in attrs.get(path, []) else 0
        return [Param(True, ty, divisible=divisible)]
    return [Param(False, ty, value=value)]


def plan_grid(plan: LaunchPlan) -> tuple[int, int, int]:
    """The plan's fixed grid as three dimensions."""
    if callable(plan.grid):
        raise NotImplementedError("compile_plan needs a fixed grid (autotuned plans pick theirs at launch)")
    grid = tuple(int(g) for g in plan.grid)
    return grid + (1,) * (3 - len(grid))


def compile_plan(plan: LaunchPlan, input_dtypes: dict[str, str], capability: int) -> CompiledLaunch:
    """Compile ``plan.kernel`` as Triton's launcher would for inputs of
    ``input_dtypes`` (name -> our dtype name) and the plan's outputs, for
    compute capability ``capability`` (90 for the H100)."""
    import triton
    from triton import knobs

    kernel = _jit_function(plan.kernel)
    target, backend = _target(capability)
    args = [_Buffer(TRITON_DTYPES[input_dtypes[p.name]]) if isinstance(p, In) else p for p in plan.params]
    args += [_Buffer(TRITON_DTYPES[o.dtype]) for o in plan.outputs]
    kwargs = plan.launch_options()
    # As JITFunction.run: these two options join every compile's key.
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound, specialization, options = _binder(kernel, capability)(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    compiled = triton.compile(
        _source(kernel, signature, constexprs, attrs), target=target, options=options.__dict__
    )
    meta = compiled.metadata
    if getattr(meta, "profile_scratch_size", 0):
        raise NotImplementedError("kernels compiled with profiling scratch (proton) cannot launch here")
    params = []
    for i, (name, ty) in enumerate(signature.items()):
        params += _flat_params((i,), ty, bound[name], attrs)
    return CompiledLaunch(
        name=meta.name,
        ptx=compiled.asm["ptx"],
        ttir=compiled.asm.get("ttir", ""),
        num_warps=meta.num_warps,
        num_ctas=getattr(meta, "num_ctas", 1),
        shared=meta.shared,
        scratch_bytes=meta.global_scratch_size or 0,
        scratch_align=meta.global_scratch_align or 1,
        params=tuple(params),
        grid=plan_grid(plan),
        capability=capability,
    )
