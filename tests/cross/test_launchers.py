"""The two launchers treat optional pointers, scalars, grids and autotuning
alike: a small autotuned kernel run through both gives the same bits."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from core_triton import In, LaunchPlan, OutputSpec, autotune, cdiv, is_interpreted
from jax_api._launch import launch as jax_launch
from torch_api._launch import launch as torch_launch


@autotune(
    configs=[triton.Config({"BLOCK": 32}, num_warps=1), triton.Config({"BLOCK": 128}, num_warps=4)],
    key=["n"],
)
@triton.jit
def _axpy_kernel(x, y, alpha, n, out, HAS_Y: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    v = alpha * tl.load(x + i, mask=m, other=0)
    if HAS_Y:
        v += tl.load(y + i, mask=m, other=0)
    tl.store(out + i, v, mask=m)


def _plan(n, has_y, alpha):
    return LaunchPlan(
        kernel=_axpy_kernel,
        grid=lambda meta: (cdiv(n, meta["BLOCK"]),),
        # An absent optional pointer is a dummy input plus a constexpr flag.
        params=(In("x"), In("y") if has_y else In("x"), alpha, n),
        outputs=(OutputSpec((n,), "float32"),),
        constexprs={"HAS_Y": has_y},
        num_warps=None,
        num_stages=None,
    )


@pytest.mark.parametrize("n", [1, 1000])  # 1: Triton makes the int a constant
@pytest.mark.parametrize("has_y", [False, True])
def test_autotuned_kernel_through_both_launchers(n, has_y):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    alpha = 0.3  # a Python float: fp32 in both launchers
    plan = _plan(n, has_y, alpha)
    device = "cpu" if is_interpreted(_axpy_kernel) else "cuda"
    inputs_t = {"x": torch.from_numpy(x).to(device), "y": torch.from_numpy(y).to(device)}
    (out_t,) = torch_launch(plan, inputs_t)
    (out_j,) = jax_launch(plan, {"x": jnp.asarray(x), "y": jnp.asarray(y)})
    expect = np.float32(alpha) * x + (y if has_y else 0)
    np.testing.assert_allclose(out_t.cpu().numpy(), expect, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(out_j), out_t.cpu().numpy())


def test_interpreter_tries_one_config():
    if not is_interpreted(_axpy_kernel):
        pytest.skip("compiled kernels autotune over every config")
    assert len(_axpy_kernel.configs) == 1


@pytest.mark.parametrize("maxnreg", [None, 32])
def test_register_cap_through_both_launchers(maxnreg):
    """A plan's register cap (LaunchPlan.maxnreg) reaches both launchers:
    Triton's own launch in PyTorch, and in JAX the compiled path
    (jax_api._compiled; jax-triton cannot set a cap), with the same bits."""
    from jax_api._launch import _takes_compiled_path

    n = 1000
    rng = np.random.default_rng(7)
    x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    plan = LaunchPlan(
        kernel=_axpy_kernel.fn,
        grid=(cdiv(n, 128),),
        params=(In("x"), In("y"), 0.3, n),
        outputs=(OutputSpec((n,), "float32"),),
        constexprs={"HAS_Y": True, "BLOCK": 128},
        maxnreg=maxnreg,
    )
    assert plan.launch_options().get("maxnreg") == maxnreg
    device = "cpu" if is_interpreted(_axpy_kernel) else "cuda"
    if device == "cuda":  # the interpreter runs every plan through its own call
        assert _takes_compiled_path(plan) == (maxnreg is not None)
    (out_t,) = torch_launch(plan, {"x": torch.from_numpy(x).to(device), "y": torch.from_numpy(y).to(device)})
    (out_j,) = jax_launch(plan, {"x": jnp.asarray(x), "y": jnp.asarray(y)})
    # float32 against float64, to the reference's scale (a GPU fuses the
    # multiply and add: near-zero outputs differ from numpy's by more than
    # their own 1e-6).
    expect = np.float32(0.3).astype(np.float64) * x + y
    np.testing.assert_allclose(out_t.cpu().numpy(), expect, rtol=0, atol=1e-6 * np.abs(expect).max())
    np.testing.assert_array_equal(np.asarray(out_j), out_t.cpu().numpy())


@autotune(
    configs=[triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 64}, num_warps=2)],
    key=["rows"],
)
@triton.jit
def _strided_rows_kernel(x, scale, rows, cols, strides, out, BLOCK: tl.constexpr):
    """``out[r, c] = scale * x[r, c]`` of ``x`` at ``strides`` (one tuple
    argument: its elements specialise one by one, as the flash kernels'
    strides do), ``out`` contiguous."""
    stride_r, stride_c = strides
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    r, c = i // cols, i % cols
    m = i < rows * cols
    tl.store(out + i, scale * tl.load(x + r * stride_r + c * stride_c, mask=m, other=0), mask=m)


@pytest.mark.parametrize("autotuned", [False, True])
@pytest.mark.parametrize("transposed", [False, True])  # strides (cols, 1): the 1 specialises to a constant
def test_tuple_argument_through_both_launchers(autotuned, transposed):
    """A kernel taking a tuple argument (the flash kernels' strides) runs the
    same in both bindings, autotuned or on one config: jax-triton cannot
    map it onto the kernel's names, so the JAX binding compiles it itself
    (jax_api._compiled; an autotuned one as jaxlib's autotuned call)."""
    from jax_api._launch import _takes_compiled_path

    rows, cols = 37, 29
    rng = np.random.default_rng(3)
    base = rng.standard_normal((cols, rows) if transposed else (rows, cols)).astype(np.float32)
    x = np.ascontiguousarray(base.T) if transposed else base  # the values of a [rows, cols] array
    strides = (1, rows) if transposed else (cols, 1)  # of x within the buffer passed (base)
    kernel = _strided_rows_kernel if autotuned else _strided_rows_kernel.fn
    plan = LaunchPlan(
        kernel=kernel,
        grid=(lambda meta: (cdiv(rows * cols, meta["BLOCK"]),)) if autotuned else (cdiv(rows * cols, 16),),
        params=(In("x"), 1.5, rows, cols, strides),
        outputs=(OutputSpec((rows * cols,), "float32"),),
        constexprs={} if autotuned else {"BLOCK": 16},
        # An autotuned kernel takes its warps and stages from its configs.
        **({"num_warps": None, "num_stages": None} if autotuned else {}),
    )
    device = "cpu" if is_interpreted(_axpy_kernel) else "cuda"
    if device == "cuda":
        assert _takes_compiled_path(plan)
    (out_t,) = torch_launch(plan, {"x": torch.from_numpy(base.reshape(-1)).to(device)})
    (out_j,) = jax_launch(plan, {"x": jnp.asarray(base.reshape(-1))})
    expect = (np.float32(1.5) * x).reshape(-1)
    np.testing.assert_array_equal(out_t.cpu().numpy(), expect)
    np.testing.assert_array_equal(np.asarray(out_j), expect)


def test_autotuned_plan_compiles_a_plan_a_config():
    """The JAX binding's compiled path (jax_api._compiled) turns an autotuned
    plan into one plan a config, each with the config's tile constexprs,
    warps, stages and register cap and the grid they give, the plan's own
    constexprs kept; jaxlib's autotuned call then times them (GPU only)."""
    from jax_api._compiled import _config_plans

    configs = [
        triton.Config({"BLOCK": 16}, num_warps=1, num_stages=2),
        triton.Config({"BLOCK": 64}, num_warps=2, num_stages=3, maxnreg=128),
    ]
    # Built here rather than with core_triton.autotune, which keeps one
    # config under the interpreter.
    tuned = triton.autotune(configs=configs, key=["rows"])(_strided_rows_kernel.fn)
    rows, cols = 37, 29
    plan = LaunchPlan(
        kernel=tuned,
        grid=lambda meta: (cdiv(rows * cols, meta["BLOCK"]), meta["EXTRA"]),
        params=(In("x"), 1.5, rows, cols, (cols, 1)),
        outputs=(OutputSpec((rows * cols,), "float32"),),
        constexprs={"EXTRA": 3},
        num_warps=None,
        num_stages=None,
    )
    plans, names = _config_plans(plan)
    got = [(p.kernel, p.grid, dict(p.constexprs), p.num_warps, p.num_stages, p.maxnreg) for p in plans]
    assert got == [
        (tuned.fn, (cdiv(rows * cols, 16), 3), {"EXTRA": 3, "BLOCK": 16}, 1, 2, None),
        (tuned.fn, (cdiv(rows * cols, 64), 3), {"EXTRA": 3, "BLOCK": 64}, 2, 3, 128),
    ]
    assert names == tuple(str(c) for c in configs) and len(set(names)) == 2
    # A plain kernel is its own one plan; a grid of its constexprs is fixed.
    (alone,), _ = _config_plans(plans[1])
    assert alone is plans[1]
