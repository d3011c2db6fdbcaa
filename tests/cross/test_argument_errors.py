"""Small argument errors that both bindings must raise alike, before any
kernel runs: the zig-zag helpers' ring size, ring_attention's zigzag flag,
and prepare_lens_from_mask's mask."""

from __future__ import annotations

import numpy as np
import pytest

from tests.frameworks import JaxFramework, TorchFramework

FRAMEWORKS = [TorchFramework(), JaxFramework()]


@pytest.mark.parametrize("fw", FRAMEWORKS, ids=lambda f: f.name)
def test_zigzag_ring_size(fw):
    x = fw.array(np.arange(8.0).reshape(1, 8))
    for bad, error in ((0, ValueError), (-2, ValueError), (True, TypeError), (2.0, TypeError)):
        for fn in (fw.api.zigzag_reorder, fw.api.zigzag_restore):
            with pytest.raises(error, match="ring_size"):
                fn(x, bad)
    np.testing.assert_array_equal(fw.numpy(fw.api.zigzag_reorder(x, 2))[0], [0, 1, 6, 7, 2, 3, 4, 5])


@pytest.mark.parametrize("fw", FRAMEWORKS, ids=lambda f: f.name)
def test_lens_from_mask(fw):
    mask = fw.array(np.array([[2, 0, 3, 0], [0, 0, 0, 0]]), "int32")
    assert fw.numpy(fw.api.prepare_lens_from_mask(mask)).tolist() == [2, 0]  # counts, not sums
    with pytest.raises(TypeError, match="mask"):
        fw.api.prepare_lens_from_mask([[1, 0]])
    with pytest.raises(ValueError, match="mask"):
        fw.api.prepare_lens_from_mask(fw.array(np.ones(3), "int32"))


def test_jax_ring_zigzag_must_be_a_bool():
    import jax
    from jax.sharding import Mesh, PartitionSpec

    import jax_api

    q = jax.numpy.zeros((1, 4, 2, 16))
    mesh = Mesh(np.array(jax.devices()[:1]), ("sp",))
    spec = PartitionSpec(None, "sp")
    fn = jax.shard_map(
        lambda q: jax_api.ring_attention(q, q, q, zigzag=1, axis_name="sp"),
        mesh=mesh,
        in_specs=spec,
        out_specs=spec,
    )
    with pytest.raises(TypeError, match="zigzag"):
        fn(q)


# Each public op with an array argument, and the argument given the other
# framework's array (the rest valid): (op, args, kwargs, that argument).
def _foreign_cases(x, x1, lens, beta, state):
    return [
        ("flash_attention", (x, x, x), {}, "query", 0),
        ("flash_attention", (x, x, x), {}, "key", 1),
        ("flash_attention", (x, x, x), {"cu_seqlens": lens}, "cu_seqlens", None),
        ("decode_attention", (x1, x, x, lens), {}, "kv_lens", 3),
        ("chunk_linear_attn", (x, x, x), {}, "value", 2),
        ("gated_delta_rule", (x, x, x, beta), {}, "beta", 3),
        ("gated_delta_rule_step", (x1, x1, x1, beta[:, :1], state), {}, "state", 4),
        ("chunk_local_cumsum", (beta, 16), {}, "g", 0),
    ]


@pytest.mark.parametrize("fw", FRAMEWORKS, ids=lambda f: f.name)
def test_foreign_arrays_are_named(fw):
    # A PyTorch tensor handed to jax_api (or a JAX array to torch_api):
    # TypeError naming the argument, before any kernel runs.
    other = FRAMEWORKS[1] if fw is FRAMEWORKS[0] else FRAMEWORKS[0]
    rng = np.random.default_rng(0)
    x, x1 = rng.standard_normal((1, 32, 2, 16)), rng.standard_normal((1, 1, 2, 16))
    beta, state = rng.uniform(size=(1, 32, 2)), rng.standard_normal((1, 2, 16, 16))
    lens = np.array([32], np.int32)
    ours = [fw.array(a, "int32" if a is lens else "float32") for a in (x, x1, lens, beta, state)]
    foreign = [other.array(a, "int32" if a is lens else "float32") for a in (x, x1, lens, beta, state)]
    for (name, args, kwargs, arg, pos), (_, bad_args, bad_kwargs, _, _) in zip(
        _foreign_cases(*ours), _foreign_cases(*foreign), strict=True
    ):
        if pos is None:
            kwargs = {arg: bad_kwargs[arg]}
        else:
            args = args[:pos] + (bad_args[pos],) + args[pos + 1 :]
        with pytest.raises(TypeError, match=f"^{arg} must be a"):
            getattr(fw.api, name)(*args, **kwargs)
