"""twinkernels' framework-free core: Triton kernels and their launch plans.

Everything here imports triton (and numpy) but never jax or torch, so the
JAX and PyTorch bindings share one source for each kernel, its grid, block
sizes, output shapes and argument checks.
"""

from core_triton import chunk_global_cumsum, chunk_local_cumsum
from core_triton.checks import (
    check_cu_seqlens_values,
    float_dtype_name,
)
from core_triton.launch import In, LaunchPlan, OutputSpec, TensorInfo, launch_direct, run_steps
from core_triton.runtime import NO_BACKEND_MESSAGE, is_interpreted
from core_triton.utils import cdiv, next_power_of_2

__all__ = [
    "In",
    "LaunchPlan",
    "NO_BACKEND_MESSAGE",
    "OutputSpec",
    "TensorInfo",
    "cdiv",
    "check_cu_seqlens_values",
    "chunk_global_cumsum",
    "chunk_local_cumsum",
    "float_dtype_name",
    "is_interpreted",
    "launch_direct",
    "next_power_of_2",
    "run_steps",
]
