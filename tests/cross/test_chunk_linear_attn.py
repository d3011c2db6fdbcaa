"""chunk_linear_attn through both bindings on the same inputs (handed over
DLPack): the same outputs and gradients, bit for bit on the interpreter,
within 1e-6 (rms ratio) on a GPU (jax-triton compiles with its own options)."""

import jax
import jax.numpy as jnp
import pytest
import torch

import jax_api
import torch_api
from tests.reference import rms_ratio

CU = [0, 17, 17, 50, 61]


def _same(j, t):
    t = t.detach().contiguous()
    back = torch.from_dlpack(j)
    assert back.dtype == t.dtype and tuple(back.shape) == tuple(t.shape)
    if back.device.type == "cpu":
        assert torch.equal(back, t)
    else:
        assert rms_ratio(back.double().cpu().numpy(), t.double().cpu().numpy()) <= 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reverse", [False, True])
def test_bindings_agree(dtype, reverse):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    T, HQ, H, K, V = CU[-1], 4, 2, 20, 12

    def rand(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen).to(dt).to(device)

    inputs = {
        "query": rand(1, T, HQ, K),
        "key": rand(1, T, H, K),
        "value": rand(1, T, H, V),
        "g": torch.nn.functional.logsigmoid(rand(1, T, H, dt=torch.float32) + 2),
        "g_gamma": -torch.rand(H, generator=gen).to(device),
        "initial_state": rand(len(CU) - 1, H, K, V, dt=torch.float32),
    }
    do, dht = rand(1, T, HQ, V), rand(len(CU) - 1, H, K, V, dt=torch.float32)
    cu_t = torch.tensor(CU, dtype=torch.int32, device=device)
    kw = dict(reverse=reverse, chunk_size=16)

    leaves = {n: x.clone().requires_grad_(True) for n, x in inputs.items()}
    o_t, h_t = torch_api.chunk_linear_attn(**leaves, cu_seqlens=cu_t, **kw)
    torch.autograd.backward([o_t, h_t], [do, dht])

    arrays = {n: jnp.from_dlpack(x) for n, x in inputs.items()}
    (o_j, h_j), pull = jax.vjp(
        lambda a: jax_api.chunk_linear_attn(**a, cu_seqlens=jnp.from_dlpack(cu_t), **kw), arrays
    )
    (grads,) = pull((jnp.from_dlpack(do), jnp.from_dlpack(dht)))

    _same(o_j, o_t)
    _same(h_j, h_t)
    for n in inputs:
        _same(grads[n], leaves[n].grad)
