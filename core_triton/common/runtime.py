"""What runs the kernels: compiled Triton on a GPU, or Triton's interpreter."""

import functools
import os

NO_BACKEND_MESSAGE = (
    "twinkernels runs its Triton kernels on a CUDA GPU, or on the CPU through "
    "Triton's interpreter. These inputs are on the CPU and the kernels were "
    "compiled for a GPU: set the environment variable TRITON_INTERPRET=1 "
    "before importing jax_api or torch_api (and triton) to run them on the "
    "CPU, or move the inputs to a CUDA device."
)


def interpreter_requested() -> bool:
    """True when TRITON_INTERPRET asks Triton to interpret kernels."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def jit_function(kernel):
    """The jit function of ``kernel`` (itself, or the one an autotuner or
    heuristics wraps)."""
    while hasattr(kernel, "fn") and type(kernel).__name__ in ("Autotuner", "Heuristics"):
        kernel = kernel.fn
    return kernel


def is_interpreted(kernel) -> bool:
    """True when ``kernel`` (a jit function, or an autotuner or heuristics
    wrapping one) was decorated under ``TRITON_INTERPRET=1``."""
    return type(jit_function(kernel)).__name__ == "InterpretedFunction"


# The SM count plans assume where no GPU answers (the interpreter): the
# H100's, so that a plan made on the CPU is the one the H100 would run.
DEFAULT_MULTIPROCESSORS = 132


@functools.lru_cache(maxsize=1)
def multiprocessor_count() -> int:
    """Streaming multiprocessors of the current GPU (read once), or
    ``DEFAULT_MULTIPROCESSORS`` under the interpreter or without a GPU.
    Plans use it to decide how finely to split work at small batches."""
    if interpreter_requested():
        return DEFAULT_MULTIPROCESSORS
    try:
        import triton

        driver = triton.runtime.driver.active
        props = driver.utils.get_device_properties(driver.get_current_device())
        return int(props["multiprocessor_count"])
    except Exception:  # no GPU driver: a plan made for inspection only
        return DEFAULT_MULTIPROCESSORS


@functools.lru_cache(maxsize=1)
def cuda_capability() -> int | None:
    """The current CUDA GPU's compute capability as one number (90 for the
    H100 and H200), read once; None under the interpreter or without one.
    Triton's driver answers where torch is installed (its CUDA driver
    imports torch); otherwise the CUDA driver library itself (a JAX-only
    install), device 0."""
    if interpreter_requested():
        return None
    try:
        import triton

        target = triton.runtime.driver.active.get_current_target()
        return int(target.arch) if target.backend == "cuda" else None
    except Exception:  # no GPU driver Triton can use
        return _driver_capability()


def _driver_capability() -> int | None:
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        if cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(device), 0):
            return None
        # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
        if cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device):
            return None
        if cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device):
            return None
        return major.value * 10 + minor.value
    except (OSError, AttributeError):
        return None


def jit(*, sizes: tuple[str, ...] = (), groups: dict[str, tuple[str, ...]] | None = None):
    """``triton.jit`` for our kernels.  ``sizes`` names the int arguments
    that change from call to call with the data (sequence lengths, numbers
    of sequences, row counts): Triton's launcher then passes them without
    specialising on their value (no "equals 1" or "multiple of 16"
    variant), so a new length or a new number of packed sequences runs the
    kernel already compiled.  Only block sizes, head dims, head counts and
    options are compile-time constants.  The names are kept as
    ``kernel.runtime_sizes`` so the tests can check every plan against
    them (jax-triton still makes an int equal to 1 a constant).

    ``groups``: constexpr arguments that each take a tuple of named
    constants (``{"OPTIONS": ("CAUSAL", ...)}``), kept as
    ``kernel.constexpr_groups``: a plan still names each constant, and its
    launch packs them (LaunchPlan.launch_options), so that a kernel of many
    options takes few arguments.  The kernel reads them back one at a time
    (``CAUSAL: tl.constexpr = OPTIONS[0]``; unpacking a constexpr tuple
    would make run-time values of them)."""
    import triton

    def decorate(fn):
        kernel = triton.jit(do_not_specialize=list(sizes))(fn)
        kernel.runtime_sizes = tuple(sizes)
        kernel.constexpr_groups = dict(groups or {})
        return kernel

    return decorate


def autotune(configs, key, **kwargs):
    """``triton.autotune`` for our kernels: every config on a GPU, only the
    first under the interpreter (which would otherwise run them all, slowly).
    No ``pre_hook``: jax-triton refuses configs that have one."""
    import triton

    if interpreter_requested():
        configs = list(configs)[:1]
    return triton.autotune(configs=configs, key=key, **kwargs)


def mend_interpreter_index() -> None:
    """Triton 3.6's interpreter turns a scalar tensor into a Python int
    (``range(lo, hi)`` over loaded bounds) with ``int()`` of a one-element
    array, which NumPy 2.4 refuses; Triton 3.9 squeezes it first.  Give older
    interpreters the same conversion (a no-op where it is already right)."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_twinkernels_mended", False):
        return  # another Triton layout: leave it as it is

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor._twinkernels_mended = True
    interpreter._patch_lang_tensor = patch_lang_tensor
