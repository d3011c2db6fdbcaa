"""The JAX ops under ``jax.checkpoint`` (remat), under ``vmap`` of ``grad``
(per-example gradients) and, on a GPU, through ``jax.export``: each gives
what the plain call gives."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_api as api

ON_GPU = jax.default_backend() in ("gpu", "cuda")


def _rand(*shape, seed=0, scale=1.0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, jnp.float32)


def _cases():
    B, T, HQ, H, K = 2, 19, 4, 2, 8
    lin = {"query": _rand(B, T, HQ, K, seed=1, scale=0.5), "key": _rand(B, T, H, K, seed=2, scale=0.5)}
    lin["value"] = _rand(B, T, H, K, seed=3)
    gate = -jax.nn.softplus(_rand(B, T, H, seed=4))
    att = {"query": _rand(B, 24, HQ, 16, seed=5), "key": _rand(B, 24, H, 16, seed=6)}
    att["value"] = _rand(B, 24, H, 16, seed=7)
    return {
        "recurrent": (lambda **x: api.recurrent(**x)[0], {**lin, "g": gate}),
        "chunk": (lambda **x: api.chunk_linear_attn(**x, chunk_size=16)[0], {**lin, "g": gate}),
        "lightning": (lambda **x: api.lightning_attn(**x, layer_idx=1, num_layers=3)[0], lin),
        "flash": (lambda **x: api.flash_attention(**x, causal=True, softmax_aux=_rand(HQ, seed=8)), att),
        "cumsum": (lambda **x: api.chunk_global_cumsum(x["query"], reverse=True), lin),
    }


CASES = _cases()


def _loss(fn):
    return lambda x: jnp.sum(jnp.sin(fn(**x)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_checkpoint(case):
    fn, x = CASES[case]
    want = jax.grad(_loss(fn))(x)
    got = jax.jit(jax.grad(jax.checkpoint(_loss(fn))))(x)
    for n in x:
        np.testing.assert_allclose(np.asarray(got[n]), np.asarray(want[n]), rtol=1e-6, atol=1e-6, err_msg=n)


@pytest.mark.parametrize("case", ["chunk", "flash"])
def test_vmap_of_grad(case):
    """Per-example gradients: vmap over a leading axis of grad."""
    fn, x = CASES[case]
    # Two examples, each its own batch of 1.
    split = {n: v.reshape(2, 1, *v.shape[1:]) for n, v in x.items()}
    got = jax.vmap(jax.grad(_loss(fn)))(split)
    for i in range(2):
        want = jax.grad(_loss(fn))({n: v[i] for n, v in split.items()})
        for n in x:
            np.testing.assert_allclose(np.asarray(got[n][i]), np.asarray(want[n]), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(
    not ON_GPU, reason="jax.export of the compiled kernels needs a GPU (the interpreter is a host callback)"
)
@pytest.mark.parametrize("case", sorted(CASES))
def test_export(case):
    from jax import export

    fn, x = CASES[case]
    jitted = jax.jit(lambda x: fn(**x))
    # jax-triton lowers to its own custom call, which jax.export does not
    # vouch for across versions: allowed explicitly.
    exported = export.export(
        jitted, disabled_checks=[export.DisabledSafetyCheck.custom_call("triton_kernel_call")]
    )(x)
    restored = export.deserialize(exported.serialize())
    np.testing.assert_array_equal(np.asarray(restored.call(x)), np.asarray(jitted(x)))
