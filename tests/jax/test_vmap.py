"""``jax.vmap`` of every op folds the vmapped axis into the batch axis: the
same results as one call per element (forward, ``grad`` of ``vmap``,
``vmap`` of ``grad``), with as many launches as one element takes
(jax_api._fold); where folding does not apply (packed input, a vmapped
argument without a batch axis) the launches run once per element, and the
results are right too."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_api as api
import torch_api._launch
from core_triton.common.runtime import interpreter_requested
from tests.jax import hlo_launches

N = 2  # the vmapped axis
B, T, HQ, H, K, V = 2, 19, 4, 2, 8, 8
TQ = TK = 24  # attention lengths (the interpreter's blocks are 32)
QKV = ("query", "key", "value")


def _rand(*shape, seed, scale=1.0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, jnp.float32)


def _gate(*shape, seed):
    return -jax.nn.softplus(_rand(*shape, seed=seed))


def _ids(*shape, seed):
    return jnp.asarray(np.sort(np.random.default_rng(seed).integers(0, 3, shape), axis=-1), jnp.int32)


def _positions(*shape, seed):
    start = np.random.default_rng(seed).integers(0, 8, (*shape[:-1], 1))
    return jnp.asarray(np.arange(shape[-1]) + start, jnp.int32)


@dataclass(frozen=True)
class Case:
    """``fn(**inputs)``; ``vmapped`` inputs carry a leading axis of ``N``,
    ``fixed`` ones are the same for every element (batch-major ones are
    broadcast by the fold, shared ones passed as they are).  Integer
    inputs are not differentiated.  ``per_element``: launches of one
    gradient that still run once per element under vmap."""

    fn: object
    vmapped: dict
    fixed: dict = field(default_factory=dict)
    per_element: int = 0

    def element(self, i):
        return {**{n: x[i] for n, x in self.vmapped.items()}, **self.fixed}


def _lin(seed, names, lead=(N, B)):
    shapes = {
        "query": (T, HQ, K),
        "key": (T, H, K),
        "value": (T, H, V),
        "gk": (T, H, K),
        "gv": (T, H, V),
        "initial_state": (H, K, V),
    }
    out = {}
    for i, n in enumerate(names):
        if n == "g":
            out[n] = _gate(*lead, T, H, seed=seed + i)
        elif n in ("gk", "gv"):
            out[n] = _gate(*lead, *shapes[n], seed=seed + i) * 0.2
        else:
            out[n] = _rand(*lead, *shapes[n], seed=seed + i, scale=0.5)
    return out


def _cases():
    recurrent = api.recurrent
    chunk = functools.partial(api.chunk_linear_attn, chunk_size=16)
    flash = functools.partial(api.flash_attention, causal=True)
    att = {
        "query": _rand(N, B, TQ, HQ, 16, seed=40),
        "key": _rand(N, B, TK, H, 16, seed=41),
        "value": _rand(N, B, TK, H, 16, seed=42),
    }
    # (The recurrent op folds through the same code as the chunk op: its
    # cases of a fixed input and of g_gamma are the chunk op's (CI time).)
    return {
        "recurrent_gk_gv_h0": Case(
            recurrent, _lin(20, ("query", "key", "value", "gk", "gv", "initial_state"))
        ),
        "chunk_g_h0": Case(
            chunk, _lin(50, ("query", "key", "g", "initial_state")), _lin(60, ("value",), (B,))
        ),
        # g_gamma [H] has no batch axis: its gradient is summed per element.
        "chunk_g_gamma": Case(
            chunk, _lin(70, ("query", "key", "value", "g")), {"g_gamma": -jnp.asarray([0.2, 0.05])}
        ),
        "lightning": Case(
            functools.partial(api.lightning_attn, layer_idx=1, num_layers=3),
            _lin(80, ("query", "key", "value")),
        ),
        "local_cumsum": Case(
            lambda g: api.chunk_local_cumsum(g, 8, reverse=True), {"g": _rand(N, B, T, H, 3, seed=90)}
        ),
        "global_cumsum_head_first": Case(
            lambda s: api.chunk_global_cumsum(s, head_first=True), {"s": _rand(N, B, H, T, seed=91)}
        ),
        "flash_seg_bias": Case(
            flash,
            {
                "query": att["query"],
                "value": att["value"],
                "q_segment_ids": _ids(N, B, TQ, seed=43),
                "bias": _rand(N, B, HQ, TQ, TK, seed=44),
            },
            {"key": att["key"][0]},
        ),
        # Sinks [HQ] have no batch axis; lse's cotangent enters the backward.
        "flash_sinks_lse": Case(
            functools.partial(flash, return_lse=True), att, {"softmax_aux": _rand(HQ, seed=45)}
        ),
        # [B, T] positions fold; [T] ones are shared.
        "flash_positions": Case(
            functools.partial(api.flash_attention, sliding_window=(6, 2)),
            {**att, "q_positions": _positions(N, B, TQ, seed=47)},
            {"kv_positions": jnp.arange(TK, dtype=jnp.int32) + 3},
        ),
        # A bias of batch 1 that is not vmapped stays shared (no copy); its
        # gradient runs once per element.
        "flash_shared_bias": Case(flash, att, {"bias": _rand(1, HQ, TQ, TK, seed=46)}, per_element=1),
    }


CASES = _cases()


def _tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _split(inputs):
    """(float inputs, integer inputs): only the first are differentiated."""
    floats = {n: x for n, x in inputs.items() if jnp.issubdtype(x.dtype, jnp.floating)}
    return floats, {n: x for n, x in inputs.items() if n not in floats}


def _loss(case):
    """A scalar of one element's outputs, as a function of (floats, ints)."""

    def loss(floats, ints):
        outs = _tuple(case.fn(**floats, **ints))
        return sum(jnp.sum(jnp.sin(o) * (i + 1)) for i, o in enumerate(outs))

    return loss


def _vmapped(case, fn, axis=0):
    """``vmap`` of ``fn(vmapped, fixed)`` with the vmapped axis at ``axis``."""
    moved = {n: jnp.moveaxis(x, 0, axis) for n, x in case.vmapped.items()}
    return functools.partial(jax.vmap(fn, in_axes=(axis, None)), moved, case.fixed)


def _close(got, want, what):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6, err_msg=what)


@pytest.fixture
def launches(monkeypatch):
    """Run a function once, jitted: ``(its result, its kernel launches)``,
    the launches counted in its compiled HLO (tests/jax/hlo_launches.py: a
    launch in a sequential ``vmap``'s loop counts once per element).  On the
    interpreter the kernels it runs are also counted on the host side, and
    the two counts must agree."""
    host = [0]
    if interpreter_requested():
        real = torch_api._launch.launch

        def spy(plan, inputs):
            host[0] += 1
            return real(plan, inputs)

        monkeypatch.setattr(torch_api._launch, "launch", spy)

    def measure(fn, *args):
        host[0] = 0
        out, n = hlo_launches.run_and_count(fn, *args)
        if interpreter_requested():
            assert host[0] == n, f"the HLO has {n} launches, the interpreter ran {host[0]}"
        return out, n

    return measure


@pytest.mark.parametrize("name", sorted(CASES))
def test_vmap_folds(name, launches):
    """vmap of the op gives what one call per element gives, with the
    launches of one element (less those that run per element by design):
    the forward with the vmapped axis first (jitted) and second (eager),
    ``vmap`` of ``grad`` (per-example gradients, of the fixed inputs too)
    and ``grad`` of a loss of ``vmap`` (the fixed inputs' gradients are the
    sums of the elements').  One test per op, so that each computes its
    per-element reference once (CI time)."""
    case = CASES[name]
    loss = _loss(case)
    # One jitted call per element: the reference, and one element's launches.
    single = jax.jit(lambda floats, ints: case.fn(**floats, **ints))
    single_grad = jax.jit(jax.grad(loss))
    outs, grads = [], []
    for i in range(N):
        args = _split(case.element(i))
        (out, forward), (grad, forward_backward) = launches(single, *args), launches(single_grad, *args)
        outs.append(_tuple(out))
        grads.append(grad)
    backward = forward_backward - forward
    assert forward > 0 and backward > 0
    stack = lambda *xs: jnp.stack(xs)  # noqa: E731
    want_outs, want_grads = jax.tree.map(stack, *outs), jax.tree.map(stack, *grads)
    extra = (N - 1) * case.per_element

    def forward_at(axis):
        return _vmapped(case, lambda v, f: case.fn(**v, **f), axis)

    got, n = launches(jax.jit(forward_at(0)))
    assert n == forward
    eager = forward_at(1)()
    for outputs in (got, eager):
        for i, (g, w) in enumerate(zip(_tuple(outputs), want_outs, strict=True)):
            _close(g, w, f"output {i}")

    per_example = _vmapped(case, lambda v, f: jax.grad(loss)(*_split({**v, **f})))
    got, n = launches(jax.jit(per_example))
    assert n == forward + backward + extra
    for name_ in want_grads:
        _close(got[name_], want_grads[name_], f"per-example gradient of {name_}")

    def total(vmapped, fixed):
        return jnp.sum(jax.vmap(lambda v: loss(*_split({**v, **fixed})))(vmapped))

    grads_of_total = jax.jit(jax.grad(total, argnums=(0, 1), allow_int=True))
    (got_v, got_f), n = launches(grads_of_total, case.vmapped, case.fixed)
    assert n == forward + backward + extra
    for name_ in _split(case.vmapped)[0]:
        _close(got_v[name_], want_grads[name_], f"gradient of {name_}")
    for name_ in _split(case.fixed)[0]:
        _close(got_f[name_], jnp.sum(want_grads[name_], axis=0), f"gradient of {name_}")


def test_nested_vmap_folds_twice(launches):
    """vmap of vmap: one fold per level, still one launch each; the shared
    g_gamma's per-element gradient groups nest too."""
    case = CASES["chunk_g_gamma"]
    loss = _loss(case)
    inner = {n: x.reshape(1, N, *x.shape[1:]) for n, x in case.vmapped.items()}
    outer = {n: jnp.concatenate([x, x * 0.5], axis=0) for n, x in inner.items()}  # [2, N, B, ...]
    gamma = case.fixed["g_gamma"]

    def grads(v, g_gamma):
        return jax.grad(loss)({**v, "g_gamma": g_gamma}, {})

    per_example = jax.jit(jax.vmap(jax.vmap(grads, in_axes=(0, None)), in_axes=(0, None)))

    def call(outer):
        return per_example(outer, gamma)

    got, nested = launches(call, outer)
    _, single = launches(jax.jit(jax.grad(loss)), case.element(0), {})
    assert nested == single
    for j in range(2):
        for i in range(N):
            want = jax.grad(loss)({**{n: x[j, i] for n, x in outer.items()}, **case.fixed}, {})
            for n in want:
                _close(got[n][j, i], want[n], f"{n}[{j}, {i}]")


def test_packed_falls_back_to_one_launch_per_element(launches):
    """Packed input (cu_seqlens: a batch of 1) does not fold: each element
    launches on its own, and the results are still those of one call each."""
    q, k, v = (x[:, :1] for x in (_lin(100, ("query", "key", "value")).values()))
    cu = jnp.asarray([0, 7, 19], jnp.int32)
    initial = _rand(N, 2, H, K, V, seed=103, scale=0.5)

    def fn(q, k, v, h0):
        return api.recurrent(q, k, v, initial_state=h0, cu_seqlens=cu)

    def loss(*args):
        return sum(jnp.sum(jnp.sin(o)) for o in fn(*args))

    got, vmapped = launches(jax.jit(jax.vmap(fn)), q, k, v, initial)
    grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2, 3))))(q, k, v, initial)
    for i in range(N):
        want = fn(q[i], k[i], v[i], initial[i])
        for j in range(2):
            _close(got[j][i], want[j], f"output {j}")
        want = jax.grad(loss, argnums=(0, 1, 2, 3))(q[i], k[i], v[i], initial[i])
        for j in range(4):
            _close(grads[j][i], want[j], f"gradient {j}")
    _, single = launches(jax.jit(fn), q[0], k[0], v[0], initial[0])
    assert single == 1
    assert vmapped == N * single


@pytest.mark.parametrize("which", ["g_gamma", "sinks", "positions_1d"])
def test_vmapped_shared_input_falls_back(which, launches):
    """A vmapped argument without a batch axis (g_gamma [H], sinks [HQ],
    positions [T]) cannot fold: one launch per element, right results."""
    if which == "g_gamma":
        inputs = _lin(110, ("query", "key", "value"))
        inputs["g_gamma"] = -jnp.asarray([[0.1, 0.3], [0.2, 0.4]])

        def fn(x):
            return api.recurrent(**x)[0]
    else:
        att = CASES["flash_sinks_lse"].vmapped
        if which == "sinks":
            inputs = dict(att, softmax_aux=_rand(N, HQ, seed=111))
        else:
            inputs = dict(att, q_positions=jnp.stack([jnp.arange(TQ) + 2 * i for i in range(N)]))

        def fn(x):
            return api.flash_attention(**x, causal=True)

    def loss(floats, ints):
        return jnp.sum(jnp.sin(fn({**floats, **ints})))

    floats, ints = _split(inputs)
    got, vmapped = launches(jax.jit(jax.vmap(fn)), inputs)
    grads = jax.vmap(jax.grad(loss))(floats, ints)
    for i in range(N):
        element = jax.tree.map(lambda x: x[i], (floats, ints))  # noqa: B023
        _close(got[i], fn({**element[0], **element[1]}), "output")
        want = jax.grad(loss)(*element)
        for n in want:
            _close(grads[n][i], want[n], n)
    _, single = launches(jax.jit(fn), {n: x[0] for n, x in inputs.items()})
    assert vmapped == N * single
