"""twinkernels' framework-free core: Triton kernels and their launch plans.

Everything here imports triton (and numpy) but never jax or torch, so the
JAX and PyTorch bindings share one source for each kernel, its grid, block
sizes, output shapes and argument checks.
"""

from core_triton.common.launch import (
    In,
    LaunchPlan,
    OutputSpec,
    TensorInfo,
    launch_direct,
    run_named,
    run_steps,
)
from core_triton.common.runtime import (
    NO_BACKEND_MESSAGE,
    autotune,
    interpreter_requested,
    is_interpreted,
    mend_interpreter_index,
)
from core_triton.common.utils import cdiv, next_power_of_2
from core_triton.cumsum import chunk_global as chunk_global_cumsum
from core_triton.cumsum import chunk_local as chunk_local_cumsum
from core_triton.linear_attn import chunk as chunk_linear_attn

if interpreter_requested():
    mend_interpreter_index()

__all__ = [
    "In",
    "LaunchPlan",
    "NO_BACKEND_MESSAGE",
    "OutputSpec",
    "TensorInfo",
    "autotune",
    "cdiv",
    "chunk_global_cumsum",
    "chunk_linear_attn",
    "chunk_local_cumsum",
    "is_interpreted",
    "launch_direct",
    "next_power_of_2",
    "run_named",
    "run_steps",
]
