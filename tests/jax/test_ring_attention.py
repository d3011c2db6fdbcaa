"""ring_attention under shard_map on forced CPU devices equals
flash_attention on the gathered sequence, forward and gradients, for ring
sizes 1, 2, 4 (conftest makes 4 host devices) and 8 (a subprocess with 8),
contiguous and zig-zag layouts."""

import importlib
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


def check(n, zigzag, options, extras=(), seed=0, t=8, monkeypatch=None):
    """Ring (global-array wrapper) vs single device: every rms ratio <= 1e-5
    (NaN fails).  ``t``: shard length.  ``extras``: sink, sink_inf (-inf
    sinks), bias ([1, HQ, T, T]), bias11 ([1, 1, T, T]), bias_const (a bias
    not differentiated: no bias-gradient launch; needs ``monkeypatch``),
    seg, seg_shards (one segment per shard, the last shard's keys in none:
    ring steps and whole query rows with no allowed key), cu (packed input:
    global ``cu_seqlens`` with an empty sequence, sequences across shards,
    3 uncovered tokens)."""
    if len(jax.devices()) < n:
        pytest.skip(f"needs {n} devices of the default backend, found {len(jax.devices())}")
    rng = np.random.default_rng(seed)
    B, HQ, H, D, T = 1, 2, 1, 16, t * n
    args = [
        jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((B, T, HQ, D), (B, T, H, D), (B, T, H, D))
    ]
    do = jnp.asarray(rng.standard_normal((B, T, HQ, D)), jnp.float32)
    sink = jnp.asarray(rng.standard_normal((HQ,)), jnp.float32) if "sink" in extras else None
    if "sink_inf" in extras:  # head 0: one -inf sink; head 1: only -inf
        sink = jnp.asarray([[-np.inf, 0.5], [-np.inf, -np.inf]], jnp.float32)
    bias = None
    if {"bias", "bias_const"} & set(extras):
        bias = jnp.asarray(rng.standard_normal((1, HQ, T, T)), jnp.float32)
    if "bias11" in extras:
        bias = jnp.asarray(rng.standard_normal((1, 1, T, T)), jnp.float32)
    seg = jnp.asarray(np.sort(rng.integers(0, 3, (B, T))), jnp.int32) if "seg" in extras else None
    kv_seg = None
    if "seg_shards" in extras:
        shard = np.arange(T)[None] // t
        seg, kv_seg = (
            jnp.asarray(shard, jnp.int32),
            jnp.asarray(np.where(shard == n - 1, 99, shard), jnp.int32),
        )
    mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))
    segs = {"q_segment_ids": seg, "kv_segment_ids": kv_seg}
    if "cu" in extras:
        segs = {"cu_seqlens": jnp.asarray([0, T // 3 + 1, T // 3 + 1, (3 * T) // 4, T - 3], jnp.int32)}

    # A bias_const bias is closed over (the default argument): JAX does not
    # differentiate it.
    def ring(q, k, v, s, b=bias):
        return jax_api.ring_attention_mesh(
            mesh, "sp", q, k, v, softmax_aux=s, bias=b, zigzag=zigzag, **segs, **options
        )

    def single(q, k, v, s, b=bias):
        return jax_api.flash_attention(q, k, v, softmax_aux=s, bias=b, **segs, **options)

    launched = []
    inputs = (*args, sink) if "bias_const" in extras else (*args, sink, bias)
    if "bias_const" in extras:
        ring_module = importlib.import_module("jax_api.ring_attention")
        real = ring_module.launch

        def spy(plan, inputs):
            launched.append(plan)
            return real(plan, inputs)

        monkeypatch.setattr(ring_module, "launch", spy)
    out_r, pull_r = jax.vjp(jax.jit(ring), *inputs)
    out_s, pull_s = jax.vjp(single, *inputs)
    errors = {"out": rms_ratio(out_r, out_s)}
    names = ("dq", "dk", "dv", "dsink", "dbias")[: len(inputs)]
    for name, a, b in zip(names, pull_r(do), pull_s(do), strict=True):
        if a is not None:
            errors[name] = rms_ratio(a, b)
    bad = {k: v for k, v in errors.items() if not v <= 1e-5}
    assert not bad, f"n={n} zigzag={zigzag}: {bad}"
    assert not any("dbias" in plan.output_names for plan in launched), "a bias-gradient launch"


CAUSAL = {"causal": True}
FEATURES = {"causal": True, "sliding_window": (9, 0), "logits_soft_cap": 2.0}


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("zigzag", [False, True])
def test_ring_equals_single_device(n, zigzag):
    check(n, zigzag, CAUSAL)


def test_ring_with_every_feature():
    check(2, True, FEATURES, ("sink", "bias", "seg"))


@pytest.mark.parametrize("n", [2, 4])
def test_ring_steps_with_no_allowed_key(n):
    # Shards of 40 tokens (two interpreter key blocks); contiguous layout,
    # no causal mask: every step but the home one has no allowed key, and
    # the last shard's queries have none at all (-inf and finite sinks).
    check(n, False, {}, ("seg_shards", "sink_inf", "bias11"), t=40)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("zigzag", [False, True])
def test_ring_packed(n, zigzag):
    # Global boundaries, one array for every device; the reference is
    # flash_attention's packed call on the gathered sequence.
    check(n, zigzag, {"causal": True, "sliding_window": (5, 0)}, ("cu", "sink"))


def test_ring_packed_full_and_jitted_boundaries():
    # No mask but the sequences', shards of two interpreter key blocks;
    # check() jits the ring, so the boundaries are traced.
    check(2, False, {}, ("cu", "sink_inf", "bias"), t=40)


def test_ring_packed_errors():
    q = jnp.zeros((1, 8, 2, 16))
    cu = jnp.asarray([0, 8], jnp.int32)
    mesh = Mesh(np.array(jax.devices()[:1]), ("sp",))
    with pytest.raises(ValueError, match="q_segment_ids cannot be combined with cu_seqlens"):
        jax_api.ring_attention_mesh(
            mesh, "sp", q, q, q, q_segment_ids=jnp.zeros((1, 8), jnp.int32), cu_seqlens=cu
        )
    with pytest.raises(ValueError, match="cu_seqlens needs packed input with batch size 1"):
        q2 = jnp.zeros((2, 8, 2, 16))
        jax_api.ring_attention_mesh(mesh, "sp", q2, q2, q2, cu_seqlens=cu)
    with pytest.raises(TypeError, match="cu_seqlens must be int32"):
        jax_api.ring_attention_mesh(mesh, "sp", q, q, q, cu_seqlens=cu.astype(jnp.float32))


@pytest.mark.parametrize("n", [2, 4])
def test_ring_window_walks_only_what_is_needed(n):
    # Contiguous shards of 8 under windows that end the walk early, steps
    # removed on some devices and not others (decided on the device).
    check(n, False, {"causal": True, "sliding_window": (8, 0)}, ("sink", "bias", "seg"))
    check(n, False, {"sliding_window": (3, 10)}, ("bias",), seed=1)


def test_ring_constant_bias_zigzag(monkeypatch):
    check(2, True, CAUSAL, ("seg_shards", "sink", "bias_const"), t=40, monkeypatch=monkeypatch)


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


def _ring_program(n, t, zigzag, options):
    """The jaxpr text of a jitted ring forward and backward on ``n`` devices."""
    mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))
    q = jnp.asarray(np.random.default_rng(0).standard_normal((1, n * t, 2, 16)), jnp.float32)

    def loss(q):
        out = jax_api.ring_attention_mesh(mesh, "sp", q, q, q, zigzag=zigzag, **options)
        return jnp.sum(out * out)

    return str(jax.make_jaxpr(jax.grad(loss))(q))


@pytest.mark.parametrize(
    "zigzag, options, conds, permutes",
    [
        # Contiguous causal, 4 devices: steps 1-3 may be removed (a device's
        # earlier shards): decided on the device, forward and backward; the
        # shards (k, v) travel 3 hops each way, the accumulators (dk, dv) 4.
        (False, {"causal": True}, 6, 2 * 3 + 2 * 3 + 2 * 4),
        # A window reaching one shard back: two steps walked, one hop each
        # way, the accumulators one hop along and one home.
        (False, {"causal": True, "sliding_window": (8, 0)}, 2, 2 + 2 + 2 * 2),
        # One reaching two shards back (its farthest pair: 9 apart).
        (False, {"sliding_window": (9, 0)}, 4, 2 * 2 + 2 * 2 + 2 * 3),
        # Zig-zag causal: every step has work.
        (True, {"causal": True}, 0, 2 * 3 + 2 * 3 + 2 * 4),
    ],
)
def test_removed_steps_and_the_walk(zigzag, options, conds, permutes):
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices")
    text = _ring_program(4, 8, zigzag, options)
    assert text.count("cond[") == conds
    assert text.count("ppermute[") == permutes
