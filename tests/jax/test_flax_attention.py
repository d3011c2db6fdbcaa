"""flash_attention where JAX model code calls an attention function
(jax_api.integrations.flax), tested against that code's own attention:
``jax.nn.dot_product_attention`` (XLA) with the same arguments, and flax's
``nnx.MultiHeadAttention`` and ``linen.MultiHeadDotProductAttention`` with
our ``attention_fn`` against their default,
forward and every gradient, float32 (JAX's default: no float64 here)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.integrations import assert_grads_close, check_optional_dependency
from tests.reference import assert_close

flax_nnx = pytest.importorskip("flax.nnx")
integration = pytest.importorskip("jax_api.integrations.flax")

B, T, S, N, K, H = 2, 10, 12, 4, 2, 8


@pytest.fixture(autouse=True)
def _float32_products():
    """XLA's float32 products on a GPU default to TF32 (about 1e-3
    relative error): the references and the models' projections run at
    full float32 precision, as the kernels' float32 products do."""
    with jax.default_matmul_precision("highest"):
        yield


def _inputs(seed, Tq=T, Tk=S):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, Tq, N, H)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((B, Tk, K, H)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((B, Tk, K, H)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((B, Tq, N, H)), jnp.float32)
    return (q, k, v), w


CASES = {
    "scale": dict(scale=0.3),
    "causal": dict(is_causal=True, square=True),
    "bias": dict(bias=True),
    "mask": dict(mask=True),
    "lengths": dict(query_seq_lengths=[7, 10], key_value_seq_lengths=[5, 12]),
    "window": dict(local_window_size=(3, 1), square=True),
    "window-causal": dict(local_window_size=2, is_causal=True, square=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_dot_product_attention_matches_jax_nn(name):
    opts = dict(CASES[name])
    square = opts.pop("square", False)
    (q, k, v), w = _inputs(1, Tq=S if square else T)
    Tq = q.shape[1]
    rng = np.random.default_rng(2)
    if opts.pop("bias", False):
        opts["bias"] = jnp.asarray(rng.standard_normal((1, N, Tq, S)), jnp.float32)
    if opts.pop("mask", False):
        m = rng.random((B, 1, Tq, S)) < 0.7
        m[..., 0] = True  # every query keeps a key (a row masked throughout differs: see the docs)
        opts["mask"] = jnp.asarray(m)
    for n in ("query_seq_lengths", "key_value_seq_lengths"):
        if n in opts:
            opts[n] = jnp.asarray(opts[n], jnp.int32)
    # Rows past query_seq_lengths are padding: compared nowhere.
    q_len = opts.get("query_seq_lengths", jnp.full((B,), Tq))
    rows = (jnp.arange(Tq)[None, :] < q_len[:, None])[:, :, None, None]
    grad_of = (0, 1, 2) + ((3,) if "bias" in opts else ())

    def loss(fn, q, k, v, bias=None):
        kw = dict(opts, bias=bias) if bias is not None else opts
        out = fn(q, k, v, **kw)
        return jnp.sum(jnp.where(rows, out * w, 0.0)), out

    args = (q, k, v) + ((opts.pop("bias"),) if "bias" in opts else ())
    ref = jax.value_and_grad(lambda *a: loss(jax.nn.dot_product_attention, *a), grad_of, has_aux=True)(*args)
    got = jax.value_and_grad(lambda *a: loss(integration.dot_product_attention, *a), grad_of, has_aux=True)(
        *args
    )
    keep = np.broadcast_to(np.asarray(rows), ref[0][1].shape)
    assert_close(np.asarray(got[0][1])[keep], np.asarray(ref[0][1])[keep], "float32", "output")
    for i, (a, b) in enumerate(zip(got[1], ref[1], strict=True)):
        assert_close(np.asarray(a), np.asarray(b), "float32", f"grad {i}")


def test_unbatched_and_refusals():
    (q, k, v), _ = _inputs(3)
    out = integration.dot_product_attention(q[0], k[0], v[0], is_causal=False)
    assert_close(
        np.asarray(out), np.asarray(jax.nn.dot_product_attention(q[0], k[0], v[0])), "float32", "3-D"
    )
    with pytest.raises(ValueError, match="implementation"):
        integration.dot_product_attention(q, k, v, implementation="cudnn")
    with pytest.raises(ValueError, match="return_residual"):
        integration.dot_product_attention(q, k, v, return_residual=True)
    with pytest.raises(ValueError, match="dropout"):
        integration.attention_fn(q, k, v, dropout_rate=0.1, deterministic=False)


def _layer_case(masking):
    """(x, mask, w) of the layer tests: inputs ``[B, T, 16]``, flax's own
    causal or padding mask, and a loss weight (zero on padded queries,
    whose output is used nowhere)."""
    x = jnp.asarray(np.random.default_rng(4).standard_normal((B, T, 16)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(5).standard_normal((B, T, 16)), jnp.float32)
    if masking == "causal":
        return x, flax_nnx.make_causal_mask(jnp.ones((B, T))), w
    real = jnp.arange(T)[None, :] < jnp.asarray([[T], [6]])
    return x, flax_nnx.make_attention_mask(real, real), w * real[:, :, None]


def _assert_layers_agree(outs):
    assert_close(np.asarray(outs["ours"][0]), np.asarray(outs["ref"][0]), "float32", "loss")
    assert len(outs["ref"][1]) == len(outs["ours"][1]) > 0
    # Float32 reference: a zero gradient (the key bias's) is 1e-7 noise there.
    names = range(len(outs["ref"][1]))
    assert_grads_close(outs["ours"][1], outs["ref"][1], "float32", names, zero_below=1e-4)


@pytest.mark.parametrize("masking", ["causal", "padding"])
def test_nnx_multi_head_attention(masking):
    # flax's own layer: projections, its mask construction, our attention
    # function in place of its default; output and every parameter's
    # gradient.
    def layer(fn):
        return flax_nnx.MultiHeadAttention(
            num_heads=N, in_features=16, qkv_features=32, decode=False, attention_fn=fn, rngs=flax_nnx.Rngs(0)
        )

    x, mask, w = _layer_case(masking)

    def loss(model):
        return jnp.sum(model(x, mask=mask) * w)

    outs = {}
    for name, fn in (("ref", flax_nnx.dot_product_attention), ("ours", integration.attention_fn)):
        value, grads = flax_nnx.value_and_grad(loss)(layer(fn))
        outs[name] = value, jax.tree_util.tree_leaves(flax_nnx.state(grads))
    _assert_layers_agree(outs)


@pytest.mark.parametrize("masking", ["causal", "padding"])
def test_linen_multi_head_dot_product_attention(masking):
    # The same through flax.linen's layer (which passes attention_fn only
    # the keyword arguments its signature names), one set of parameters.
    linen = pytest.importorskip("flax.linen")

    def layer(fn):
        return linen.MultiHeadDotProductAttention(
            num_heads=N, qkv_features=32, attention_fn=fn, deterministic=True
        )

    x, mask, w = _layer_case(masking)
    params = layer(linen.dot_product_attention).init(jax.random.PRNGKey(0), x, mask=mask)
    outs = {}
    for name, fn in (("ref", linen.dot_product_attention), ("ours", integration.attention_fn)):

        def loss(p, fn=fn):
            return jnp.sum(layer(fn).apply(p, x, mask=mask) * w)

        value, grads = jax.value_and_grad(loss)(params)
        outs[name] = value, jax.tree_util.tree_leaves(grads)
    _assert_layers_agree(outs)


def test_optional_dependency(monkeypatch):
    check_optional_dependency(monkeypatch, "jax_api.integrations.flax", "flax", "jax_api")
