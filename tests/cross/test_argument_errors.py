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
