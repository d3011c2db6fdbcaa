"""Launching a kernel that Triton's own compiler built (core_triton.common.
compiled) from JAX, through jaxlib's Triton call.

jax-triton 0.3.1 compiles kernels itself and launches them with null
global scratch, so a kernel that builds tensor descriptors on the device
(the Hopper flash kernels) faults there.  This path compiles with Triton's
compiler exactly as the PyTorch binding's launches do (same source,
options and on-disk cache, so the same PTX) and hands the PTX to jaxlib's
``triton_kernel_call``, the custom-call target jax-triton lowers to (jaxlib
assembles the PTX itself, so the machine code may differ from the cubin
Triton's launcher loads).  jaxlib passes null pointers for
Triton's two hidden scratch parameters after the kernel's own; one more
array parameter placed after the kernel's own lands in the first, global
scratch: an extra XLA output of ``programs * num_ctas * scratch_bytes``
bytes that the caller never sees.

The compile happens at trace time (the scratch size is part of the call's
output shapes); the target is the first GPU's compute capability, or
``TWINKERNELS_CUDA_ARCH`` (e.g. ``90``) for an ahead-of-time lowering on a
host without one.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import zlib
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import dispatch
from jax.extend.core import Primitive
from jax.interpreters import mlir

from core_triton import LaunchPlan
from core_triton.common.compiled import CompiledLaunch, compile_plan
from core_triton.common.runtime import cuda_capability
from jax_api._launch import alias_indices, zeroed_outputs

_call_p = Primitive("twinkernels_compiled_triton_call")
_call_p.multiple_results = True


# Eager calls compile the one-primitive computation once per parameters.
_call_p.def_impl(functools.partial(dispatch.apply_primitive, _call_p))


@_call_p.def_abstract_eval
def _abstract(*_, launch, out_avals, aliases):
    return out_avals


class _Key:
    """A plan's compiled launches as a primitive parameter (one; an
    autotuned plan's, one a config, with the configs' names): hashed and
    compared by identity (launches are cached per plan and dtypes, so
    equal ones are the same object)."""

    __slots__ = ("launches", "names")

    def __init__(self, launches: tuple[CompiledLaunch, ...], names: tuple[str, ...]):
        self.launches = launches
        self.names = names

    @property
    def launch(self) -> CompiledLaunch:
        """The first launch (the only one but for an autotuned plan)."""
        return self.launches[0]


def _capability() -> int:
    arch = os.environ.get("TWINKERNELS_CUDA_ARCH")
    if arch:
        return int(arch)
    # The same answer the plans got (core_triton.common.runtime).
    capability = cuda_capability()
    if capability is not None:
        return capability
    raise RuntimeError(
        "no CUDA device to compile for: set TWINKERNELS_CUDA_ARCH (e.g. 90) for an ahead-of-time lowering"
    )


# Compiled launches by (plan, input dtypes); the plan is kept with its
# launch so that its id cannot be reused by another plan while cached.
# Bounded like core_triton's plan caches.
_LAUNCHES: dict = {}
_LAUNCH_LIMIT = 1024


def _compiled(plan: LaunchPlan, dtypes: dict[str, str]) -> _Key:
    key = (id(plan), tuple(sorted(dtypes.items())))
    hit = _LAUNCHES.get(key)
    if hit is not None and hit[0] is plan:
        return hit[1]
    plans, names = _config_plans(plan)
    compiled = _Key(tuple(compile_plan(p, dtypes, _capability()) for p in plans), names)
    if len(_LAUNCHES) >= _LAUNCH_LIMIT:
        _LAUNCHES.clear()
    _LAUNCHES[key] = (plan, compiled)
    return compiled


def _config_plans(plan: LaunchPlan) -> tuple[list[LaunchPlan], tuple[str, ...]]:
    """The plans to compile for ``plan``: itself, or for an autotuned
    kernel one a config (its tile constexprs, warps, stages and register
    cap, and the grid its constexprs give), with the configs' names."""
    kernel = plan.kernel
    if type(kernel).__name__ != "Autotuner":
        if callable(plan.grid):
            plan = dataclasses.replace(plan, grid=plan.grid(dict(plan.constexprs)))
        return [plan], ("",)
    plans = []
    for config in kernel.configs:
        meta = {**plan.constexprs, **config.kwargs}
        plans.append(
            dataclasses.replace(
                plan,
                kernel=kernel.fn,
                grid=plan.grid(meta) if callable(plan.grid) else plan.grid,
                constexprs=meta,
                num_warps=config.num_warps,
                num_stages=config.num_stages,
                maxnreg=getattr(config, "maxnreg", None),
            )
        )
    return plans, tuple(str(c) for c in kernel.configs)


def _kernel(launch: CompiledLaunch):
    from jax._src.lib import gpu_triton as lib

    try:
        # jaxlib 0.10-0.11: (name, warps, ctas, shared, ptx, ttir, capability)
        return lib.TritonKernel(
            launch.name,
            launch.num_warps,
            launch.num_ctas,
            launch.shared,
            launch.ptx,
            launch.ttir,
            launch.capability,
        )
    except TypeError:
        # later jaxlib: (name, warps, shared, ptx, ttir, capability, cluster x, y, z)
        if launch.num_ctas != 1:
            raise NotImplementedError("kernels of several CTAs need jaxlib's older TritonKernel") from None
        return lib.TritonKernel(
            launch.name, launch.num_warps, launch.shared, launch.ptx, launch.ttir, launch.capability, 1, 1, 1
        )


def _kernel_call(c: CompiledLaunch, zeroed: dict[int, int], n_in: int, n_out: int):
    """jaxlib's call of one compiled launch (``zeroed``: output index ->
    bytes to zero before it runs)."""
    from jax._src.lib import gpu_triton as lib

    params, n_array = [], 0
    for p in c.params:
        if p.array:
            out = n_array - n_in
            params.append(lib.create_array_parameter(zeroed.get(out, 0), p.divisible))
            n_array += 1
        elif p.type in ("u1", "i1"):
            # Triton names a bool parameter u1; jaxlib knows it as i1.
            params.append(lib.create_scalar_parameter(bool(p.value), "i1"))
        else:
            params.append(lib.create_scalar_parameter(p.value, p.type))
    assert n_array == n_in + n_out - (1 if c.scratch_bytes else 0), (n_array, n_in, n_out)
    if c.scratch_bytes:
        # No divisibility asked of the scratch buffer: XLA's buffers were
        # aligned well past Triton's 128 bytes wherever this ran on the H100;
        # asking jaxlib to check c.scratch_align has not run there yet.
        params.append(lib.create_array_parameter(0, 0))
    return lib.TritonKernelCall(_kernel(c), *c.grid, params)


def _lowering(ctx, *arrays, launch, out_avals, aliases):
    from jax._src.lib import gpu_triton as lib

    zeroed = {i: np.dtype(a.dtype).itemsize * a.size for i, a in enumerate(out_avals) if i in aliases.zeroed}
    n_in = len(ctx.avals_in)
    calls = [_kernel_call(c, zeroed, n_in, len(out_avals)) for c in launch.launches]
    name = launch.launch.name
    if len(calls) == 1:
        call = calls[0]
    else:
        # jaxlib times each config at the first run and keeps the fastest;
        # the aliased inputs' bytes, so that it can restore them between runs.
        sizes = tuple(
            (i, o, np.dtype(ctx.avals_in[i].dtype).itemsize * ctx.avals_in[i].size) for i, o in aliases.pairs
        )
        call = lib.TritonAutotunedKernelCall(name, list(zip(calls, launch.names, strict=True)), sizes)
    rule = jax.ffi.ffi_lowering(
        "triton_kernel_call",
        api_version=2,
        backend_config=zlib.compress(call.to_proto(name, b"")),
        operand_output_aliases=dict(aliases.pairs),
    )
    return rule(ctx, *arrays)


mlir.register_lowering(_call_p, _lowering, platform="cuda")


@dataclass(frozen=True)
class _Aliases:
    """Hashable static parameters: zero-filled outputs (indices) and
    operand -> output aliases (pairs)."""

    zeroed: frozenset
    pairs: tuple


def compiled_call(plan: LaunchPlan, names: list[str], arrays: list[jax.Array]) -> list[jax.Array]:
    """Launch ``plan`` (a ``triton.jit`` kernel on a fixed grid, or an
    autotuned one) on ``arrays`` (the plan's unique inputs, named ``names``); its outputs."""
    zeroed = zeroed_outputs(plan)
    dtypes = {n: jnp.dtype(a.dtype).name for n, a in zip(names, arrays, strict=True)}
    key = _compiled(plan, dtypes)
    c = key.launch
    out_avals = [jax.core.ShapedArray(o.shape, jnp.dtype(o.dtype)) for o in plan.outputs]
    if len(key.launches) > 1 and any(x.scratch_bytes for x in key.launches):
        raise NotImplementedError("an autotuned kernel that needs global scratch cannot launch from JAX")
    if c.scratch_bytes:
        programs = c.grid[0] * c.grid[1] * c.grid[2] * c.num_ctas
        out_avals.append(jax.core.ShapedArray((programs * c.scratch_bytes,), jnp.uint8))
    aliases = _Aliases(frozenset(zeroed), tuple(alias_indices(plan).items()))
    by_name = dict(zip(names, arrays, strict=True))

    @jax.custom_batching.sequential_vmap
    def call(*operands):
        return tuple(_call_p.bind(*operands, launch=key, out_avals=tuple(out_avals), aliases=aliases))

    # Operands are the plan's array parameters in order, a repeated input
    # passed again (the kernel's dummy pointers).
    outs = call(*[by_name[n] for n in plan.input_names()])
    return list(outs[: len(plan.outputs)])
