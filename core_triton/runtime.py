"""What runs the kernels: compiled Triton on a GPU, or Triton's interpreter."""

import os

NO_BACKEND_MESSAGE = (
    "twinkernels runs its Triton kernels on a CUDA GPU, or on the CPU through "
    "Triton's interpreter. These inputs are on the CPU and the kernels were "
    "compiled for a GPU: set the environment variable TRITON_INTERPRET=1 "
    "before importing twinkernels (and triton) to run them on the CPU, or "
    "move the inputs to a CUDA device."
)


def interpreter_requested() -> bool:
    """True when TRITON_INTERPRET asks Triton to interpret kernels."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def is_interpreted(kernel) -> bool:
    """True when ``kernel`` (a jit function, or an autotuner or heuristics
    wrapping one) was decorated under ``TRITON_INTERPRET=1``."""
    while hasattr(kernel, "fn") and type(kernel).__name__ in ("Autotuner", "Heuristics"):
        kernel = kernel.fn
    return type(kernel).__name__ == "InterpretedFunction"


def autotune(configs, key, **kwargs):
    """``triton.autotune`` for our kernels: every config on a GPU, only the
    first under the interpreter (which would otherwise run them all, slowly).
    No ``pre_hook``: jax-triton refuses configs that have one."""
    import triton

    if interpreter_requested():
        configs = list(configs)[:1]
    return triton.autotune(configs=configs, key=key, **kwargs)
