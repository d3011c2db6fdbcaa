"""Jit helpers that kernels of every family share: the interpreted flag,
``dot`` and the divisibility hints for int arguments."""

import triton
import triton.language as tl

from core_triton.common.runtime import interpreter_requested

# Triton 3.9's interpreter multiplies bfloat16 tiles as raw 16-bit integers
# (tl.dot of two bfloat16 tiles returns garbage there); it gets float32
# operands instead, which gives the same products (a bf16 x bf16 product is
# exact in float32).  Compiled kernels keep their half-precision products.
# Compiled Triton reads module globals only when they are constexpr.
INTERPRETED = tl.constexpr(interpreter_requested())


@triton.jit
def dot(a, b, PRECISION: tl.constexpr):
    """``tl.dot`` with float32 accumulation.  ``PRECISION``: ``"ieee"`` for
    full float32 products (float32 inputs), ``"tf32"``, or None for Triton's
    default (the tensor cores' native products; tf32 for float32 unless
    ``TRITON_F32_DEFAULT`` says otherwise)."""
    if INTERPRETED:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        out = tl.dot(a, b, input_precision=PRECISION)
    return out


@triton.jit
def dot_acc(a, b, acc):
    """``acc + a @ b`` for half-precision ``a, b`` and a float32 ``acc``, as
    one accumulating product (the form Triton's Hopper warp-specialisation
    pass pipelines).  The interpreter multiplies in float32 (its half
    products are not exact)."""
    if INTERPRETED:
        out = acc + tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit
def hint16(value, DIVISIBLE: tl.constexpr):
    """``value``, known to be a multiple of 16 when the plan says so.
    jax-triton passes ints without Triton's divisibility specialisation, and
    K/V tile loads then lose their 16-byte vectorisation and ``cp.async``
    pipelining (seen on the H100: the JAX binding's flash forward at T=8192
    went from 247 to 468 TFLOP/s with the hint; tests/core/test_codegen.py
    checks the PTX).  ``tl.multiple_of`` on a scalar parameter is lost when
    it passes through a helper function; ``(value // 16) * 16`` (exact: the
    plan checked the divisibility) carries the fact through integer analysis
    instead.  Flash attention's strides take this one."""
    if DIVISIBLE:
        value = (value // 16) * 16
    return value


@triton.jit
def stride_hint(stride, DIVISIBLE: tl.constexpr, UNIT: tl.constexpr):
    """A stride with what the plan knows of it: 1 (a constant) when
    ``UNIT``, else a multiple of 16 when ``DIVISIBLE`` (``tl.multiple_of``).
    The cumsum kernel's strides take this one: it keeps their compiled code
    as it was measured (``hint16``'s integer form compiles differently).

    Strides follow the sequence length, so the launchers pass them without
    specialising on their values (a new length would compile a new kernel)
    and the plan states the facts that do not change with the length.
    jax-triton makes an int equal to 1 a constant and tells nothing else;
    stating both facts here gives both bindings the same compiled code, and
    keeps 16-byte loads (6x faster here than without the hint)."""
    if UNIT:
        return 1
    if DIVISIBLE:
        stride = tl.multiple_of(stride, 16)
    return stride
