"""The two bindings run the same kernels: tensors handed over DLPack in
either direction give bit-identical outputs and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jax_api
import torch_api
from tests.reference import rms_ratio

CU = [0, 7, 7, 40, 77]


def _torch_device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_vjp(fn, x, dy):
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    y.backward(dy)
    return y.detach(), x.grad


def _jax_vjp(fn, x, dy):
    y, pull = jax.vjp(fn, x)
    return y, pull(dy)[0]


def _same(j, t):
    """A JAX array and a torch tensor hold the same values: the same bits
    where the same code ran (the interpreter); on a GPU within 1e-6 (rms
    ratio), since jax-triton compiles with its own specialisation and
    options, and a reduction's order may then differ by an ulp (seen once:
    the global sum, float32, strides that are multiples of 16)."""
    t = t.detach().contiguous()
    back = torch.from_dlpack(j)
    assert back.dtype == t.dtype and tuple(back.shape) == tuple(t.shape)
    if back.device.type == "cpu":
        assert torch.equal(back.cpu(), t.cpu())
    else:
        assert rms_ratio(back.double().cpu().numpy(), t.double().cpu().numpy()) <= 1e-6


OPS = {
    "local": lambda api, cu: (
        lambda x: api.chunk_local_cumsum(x, 16, reverse=True, cu_seqlens=cu, softmax_scale=0.7)
    ),
    "global": lambda api, cu: lambda x: api.chunk_global_cumsum(x, cu_seqlens=cu, output_dtype=None),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("direction", ["torch_to_jax", "jax_to_torch"])
# (3, 4): odd strides; (4, 32): strides that are multiples of 16, which
# Triton specialises for torch launches and jax-triton does not.
@pytest.mark.parametrize("heads", [(3, 4), (4, 32)], ids=["odd", "div16"])
def test_bindings_agree_bitwise(op, dtype, direction, heads):
    gen = torch.Generator().manual_seed(0)
    shape = (1, CU[-1], *heads)
    if direction == "torch_to_jax":
        x_t = torch.randn(shape, generator=gen).to(dtype).to(_torch_device())
        dy_t = torch.randn(shape, generator=gen).to(dtype).to(_torch_device())
        cu_t = torch.tensor(CU, dtype=torch.int32, device=_torch_device())
        x_j, dy_j, cu_j = jnp.from_dlpack(x_t), jnp.from_dlpack(dy_t), jnp.from_dlpack(cu_t)
    else:
        key = jax.random.split(jax.random.PRNGKey(0))
        jdt = jnp.dtype(str(dtype).split(".")[-1])
        x_j = jax.random.normal(key[0], shape).astype(jdt)
        dy_j = jax.random.normal(key[1], shape).astype(jdt)
        cu_j = jnp.asarray(CU, jnp.int32)
        x_t, dy_t, cu_t = torch.from_dlpack(x_j), torch.from_dlpack(dy_j), torch.from_dlpack(cu_j)
    y_t, dx_t = _torch_vjp(OPS[op](torch_api, cu_t), x_t, dy_t)
    y_j, dx_j = _jax_vjp(OPS[op](jax_api, cu_j), x_j, dy_j)
    _same(y_j, y_t)
    _same(dx_j, dx_t)


def test_non_contiguous_torch_view_crosses():
    x_t = torch.randn(2, 3, 50, 4, device=_torch_device()).transpose(1, 2)  # [B, T, H, S] view
    x_j = jnp.from_dlpack(x_t)
    y_t = torch_api.chunk_global_cumsum(x_t, reverse=True)
    y_j = jax_api.chunk_global_cumsum(x_j, reverse=True)
    _same(y_j, y_t)


def test_utilities_agree():
    cu = [0, 0, 5, 5, 12, 13]
    cu_t = torch.tensor(cu, dtype=torch.int32)
    cu_j = jnp.asarray(cu, jnp.int32)
    for name in ["prepare_lens", "prepare_position_ids", "prepare_sequence_ids", "prepare_token_indices"]:
        a = np.asarray(getattr(jax_api, name)(cu_j))
        b = getattr(torch_api, name)(cu_t).numpy()
        np.testing.assert_array_equal(a, b)
    for fn in ["prepare_chunk_indices", "prepare_chunk_offsets"]:
        np.testing.assert_array_equal(
            np.asarray(getattr(jax_api, fn)(cu_j, 4)), getattr(torch_api, fn)(cu_t, 4).numpy()
        )


def test_public_apis_match():
    import inspect

    assert sorted(jax_api.__all__) == sorted(torch_api.__all__)
    for name in jax_api.__all__:
        pj = inspect.signature(getattr(jax_api, name)).parameters
        pt = inspect.signature(getattr(torch_api, name)).parameters
        assert list(pj) == list(pt), name
        for k in pj:
            dj, dt = pj[k].default, pt[k].default
            if isinstance(dj, (bool, int, float, str, type(None))):
                assert dj == dt, (name, k)
