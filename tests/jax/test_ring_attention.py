"""ring_attention under shard_map on forced CPU devices equals
flash_attention on the gathered sequence, forward and gradients, for ring
sizes 1, 2, 4 (conftest makes 4 host devices) and 8 (a subprocess with 8),
contiguous and zig-zag layouts."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_api
from tests.reference import rms_ratio

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check(n, zigzag, options, extras=(), seed=0):
    """Ring (global-array wrapper) vs single device: every rms ratio <= 1e-5."""
    if len(jax.devices()) < n:
        pytest.skip(f"needs {n} devices of the default backend, found {len(jax.devices())}")
    rng = np.random.default_rng(seed)
    B, HQ, H, D, T = 1, 2, 1, 16, 8 * n
    args = [
        jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((B, T, HQ, D), (B, T, H, D), (B, T, H, D))
    ]
    do = jnp.asarray(rng.standard_normal((B, T, HQ, D)), jnp.float32)
    sink = jnp.asarray(rng.standard_normal((HQ,)), jnp.float32) if "sink" in extras else None
    bias = jnp.asarray(rng.standard_normal((1, HQ, T, T)), jnp.float32) if "bias" in extras else None
    seg = jnp.asarray(np.sort(rng.integers(0, 3, (B, T))), jnp.int32) if "seg" in extras else None
    mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))

    def ring(q, k, v, s, b):
        return jax_api.ring_attention_mesh(
            mesh, "sp", q, k, v, q_segment_ids=seg, softmax_aux=s, bias=b, zigzag=zigzag, **options
        )

    def single(q, k, v, s, b):
        return jax_api.flash_attention(q, k, v, q_segment_ids=seg, softmax_aux=s, bias=b, **options)

    out_r, pull_r = jax.vjp(jax.jit(ring), *args, sink, bias)
    out_s, pull_s = jax.vjp(single, *args, sink, bias)
    errors = {"out": rms_ratio(out_r, out_s)}
    for name, a, b in zip(("dq", "dk", "dv", "dsink", "dbias"), pull_r(do), pull_s(do), strict=True):
        if a is not None:
            errors[name] = rms_ratio(a, b)
    bad = {k: v for k, v in errors.items() if not v <= 1e-5}
    assert not bad, f"n={n} zigzag={zigzag}: {bad}"


CAUSAL = {"causal": True}
FEATURES = {"causal": True, "sliding_window": (9, 0), "logits_soft_cap": 2.0}


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("zigzag", [False, True])
def test_ring_equals_single_device(n, zigzag):
    check(n, zigzag, CAUSAL)


def test_ring_with_every_feature():
    check(2, True, FEATURES, ("sink", "bias", "seg"))


def test_ring_of_eight_devices():
    if jax.default_backend() != "cpu":
        pytest.skip("forced host devices exist on the CPU backend only")
    # conftest gives this process 4 host devices; 8 need a fresh process.
    code = (
        "from tests.jax.test_ring_attention import check, CAUSAL\n"
        "check(8, False, CAUSAL)\ncheck(8, True, CAUSAL)\nprint('ok')"
    )
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PYTHONPATH": ROOT}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


def test_inside_user_shard_map_and_zigzag_helpers():
    n = 2
    if len(jax.devices()) < n:
        pytest.skip("needs 2 devices")
    mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.standard_normal((1, 16, 2, 16)), jnp.float32)
    zq = jax_api.zigzag_reorder(q, n)
    assert np.array_equal(np.asarray(jax_api.zigzag_restore(zq, n)), np.asarray(q))
    f = jax.shard_map(
        lambda a: jax_api.ring_attention(a, a, a, causal=True, zigzag=True, axis_name="sp"),
        mesh=mesh,
        in_specs=P(None, "sp"),
        out_specs=P(None, "sp"),
        check_vma=False,
    )
    out = jax_api.zigzag_restore(f(zq), n)
    ref = jax_api.flash_attention(q, q, q, causal=True)
    assert rms_ratio(out, ref) <= 1e-5
    with pytest.raises(ValueError, match="axis_name"):
        jax_api.ring_attention(q, q, q)
