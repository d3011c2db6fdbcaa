"""Launching a core_triton plan on JAX arrays.

* Compiled kernels (a CUDA JAX): ``jax_triton.triton_call``, imported only
  here, with a sequential batching rule so the call works under ``vmap``.
  The ops fold ``vmap`` above this level (jax_api._fold): a launch is
  vmapped only where they cannot (one launch per element then).  Kernels
  that need Triton's global scratch (tensor descriptors built on the
  device) go through jax_api._compiled instead: compiled by Triton as the
  PyTorch binding compiles them, launched by jaxlib's Triton call with the
  scratch as an extra output; so do kernels with a tuple argument (the
  flash kernels' strides), autotuned or not, and plans with a register cap
  (``TWINKERNELS_JAX_LAUNCHER=compiled`` sends every plain kernel there).
* Interpreted kernels (``TRITON_INTERPRET=1``): the same kernel runs in
  Triton's interpreter inside ``jax.pure_callback``; buffers cross to torch
  CPU tensors over DLPack (the interpreter takes torch tensors only).
* Anything else: a RuntimeError that says what to do.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np

from core_triton import NO_BACKEND_MESSAGE, LaunchPlan, TensorInfo, is_interpreted
from core_triton.common.launch import kernel_constexprs
from core_triton.common.utils import contiguous_strides


def info(x, name: str = "argument") -> TensorInfo | None:
    """What core_triton's plans see of ``x``; ``name`` is the argument's
    name, for the error a non-array gets."""
    if x is None:
        return None
    if not isinstance(x, (jax.Array, np.ndarray)):
        raise TypeError(f"{name} must be a jax.Array (or a numpy array), got {type(x).__name__}")
    return TensorInfo(tuple(x.shape), jnp.dtype(x.dtype).name, contiguous_strides(x.shape))


def dtype_arg(dtype):
    """A user's dtype (jnp.float32, np.dtype, 'bfloat16') as a name, or as
    given when it is no dtype (core_triton's check then names it)."""
    if dtype is None:
        return None
    try:
        return jnp.dtype(dtype).name
    except TypeError:
        return dtype


def _unique_inputs(plan: LaunchPlan) -> list[str]:
    return list(dict.fromkeys(plan.input_names()))


def _empty_outputs(plan: LaunchPlan) -> list[jax.Array]:
    return [jnp.full(o.shape, 0 if o.fill is None else o.fill, jnp.dtype(o.dtype)) for o in plan.outputs]


def launch(plan: LaunchPlan, inputs: dict[str, jax.Array]) -> list[jax.Array]:
    """Run ``plan`` on ``inputs``; returns its outputs as JAX arrays."""
    if plan.is_empty():
        return _empty_outputs(plan)
    names = _unique_inputs(plan)
    arrays = [inputs[n] for n in names]
    if is_interpreted(plan.kernel):
        _require_torch()
        return list(_interpreted_call(plan, names, arrays))
    if jax.default_backend() not in ("gpu", "cuda", "rocm"):
        raise RuntimeError(NO_BACKEND_MESSAGE)
    return list(_triton_call(plan, names, arrays))


INTERPRET_EXTRA_MESSAGE = (
    "The JAX binding runs its kernels on the CPU through Triton's interpreter, "
    "which takes PyTorch CPU tensors, and torch is not installed. Install the "
    "'interpret' extra: pip install \".[jax,interpret]\" from a clone (a CPU-only "
    "torch first keeps the download small: pip install torch --index-url "
    "https://download.pytorch.org/whl/cpu)."
)


def _require_torch() -> None:
    """Say which extra to install when torch is missing, at trace time,
    rather than fail inside a host callback."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise ModuleNotFoundError(INTERPRET_EXTRA_MESSAGE) from e


@functools.cache
def _jax_triton():
    """(jax_triton, name of its output-shape argument), imported once, only
    when used (it needs a GPU JAX)."""
    before = os.environ.get("TRITON_CACHE_DIR")
    import jax_triton

    # jax-triton empties TRITON_CACHE_DIR at import, which leaves every other
    # Triton user in the process (our torch binding, fla) unable to compile:
    # "Could not create or locate cache dir".  Put it back.
    if before is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = before
    # jax-triton 0.4 renamed out_shape to out_type.
    params = inspect.signature(jax_triton.triton_call).parameters
    return jax_triton, ("out_type" if "out_type" in params else "out_shape")


def _triton_call(plan, names, arrays):
    if _takes_compiled_path(plan):
        from jax_api._compiled import compiled_call

        return compiled_call(plan, names, arrays)
    jt, out_kw = _jax_triton()
    out_shapes = [jax.ShapeDtypeStruct(o.shape, jnp.dtype(o.dtype)) for o in plan.outputs]
    zeroed = zeroed_outputs(plan)

    @jax.custom_batching.sequential_vmap
    def call(*arrays):
        # jax-triton passes a Python float as fp64; torch's launcher passes
        # fp32. Both bindings must run the same kernel.
        args = [
            np.float32(a) if isinstance(a, float) else a
            for a in plan.arguments(dict(zip(names, arrays, strict=True)))
        ]
        return tuple(
            jt.triton_call(
                *args,
                kernel=plan.kernel,
                grid=plan.grid if callable(plan.grid) else tuple(plan.grid),
                num_warps=plan.num_warps,
                num_stages=plan.num_stages,
                zeroed_outputs=zeroed,
                input_output_aliases=alias_indices(plan),
                **{out_kw: out_shapes},
                **kernel_constexprs(plan.kernel, plan.constexprs),
            )
        )

    return call(*arrays)


# "compiled": every plan that can (a plain kernel, a fixed grid) goes through
# jax_api._compiled rather than jax-triton; kernels that need global scratch
# always do (jax-triton cannot give them any).
JAX_LAUNCHER = os.environ.get("TWINKERNELS_JAX_LAUNCHER", "jax-triton")


def _takes_compiled_path(plan: LaunchPlan) -> bool:
    if getattr(plan.kernel, "needs_global_scratch", False):
        return True
    if any(isinstance(p, tuple) for p in plan.params):
        # jax-triton maps a call's flattened arguments onto the kernel's
        # names one to one: a tuple argument (the flash kernels' strides)
        # would shift every name after it.
        return True
    plain = type(plan.kernel).__name__ == "JITFunction" and not callable(plan.grid)
    # jax-triton compiles with num_warps and num_stages only: a register cap
    # (LaunchPlan.maxnreg) needs Triton's own compile.
    return plain and (JAX_LAUNCHER == "compiled" or plan.maxnreg is not None)


def zeroed_outputs(plan: LaunchPlan) -> tuple[int, ...]:
    """Indices of the outputs that start as zeros.  Both GPU launch paths
    (jax-triton's, jax_api._compiled) have jaxlib zero them before the
    kernel runs; no other fill can be asked of it."""
    if any(o.fill not in (None, 0) for o in plan.outputs):
        raise NotImplementedError("jaxlib's Triton call can only zero outputs")
    return tuple(i for i, o in enumerate(plan.outputs) if o.fill == 0)


def alias_indices(plan: LaunchPlan) -> dict[int, int]:
    """The launch's aliases for jaxlib: operand index -> output index.
    Operands are the plan's array parameters in order, repeats included (an
    absent input's dummy pointer is the same array passed again)."""
    arrays = plan.input_names()
    return {arrays.index(name): i for i, name in plan.aliases}


def _to_torch(a: np.ndarray):
    import torch

    a = np.ascontiguousarray(a)
    if a.dtype == jnp.bfloat16:
        # numpy's DLPack has no bfloat16: cross as int16 and reinterpret.
        return torch.from_dlpack(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_dlpack(a.copy() if not a.flags.writeable else a)


def _to_numpy(t) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(jnp.bfloat16)
    return t.numpy()


# Triton's interpreter patches triton.language globally while a kernel runs,
# so two kernels must not run in it at once; XLA calls host callbacks from
# several threads (one per device under shard_map).
_INTERPRETER_LOCK = threading.Lock()


def _interpreted_call(plan, names, arrays):
    out_shapes = tuple(jax.ShapeDtypeStruct(o.shape, jnp.dtype(o.dtype)) for o in plan.outputs)

    def host(*host_arrays):
        from torch_api._launch import launch as torch_launch

        tensors = {n: _to_torch(a) for n, a in zip(names, host_arrays, strict=True)}
        with _INTERPRETER_LOCK:
            outputs = torch_launch(plan, tensors)
        return tuple(_to_numpy(o) for o in outputs)

    return jax.pure_callback(host, out_shapes, *arrays, vmap_method="sequential")
