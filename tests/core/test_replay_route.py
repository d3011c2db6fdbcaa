"""The replay's choice of route (core_triton.common.launch._Replay), on
stand-in tensors so that it runs without a GPU: the GPU test
(tests/torch/test_launch_replay.py) checks the bits; this checks what each
route is handed and when the replay steps aside."""

from types import SimpleNamespace

from core_triton.common import launch as core_launch


class FakeTensor:
    def __init__(self, ptr, dtype="bf16", device="cuda:0"):
        self.ptr, self.dtype, self.device = ptr, dtype, device

    def data_ptr(self):
        return self.ptr


def _replay(direct, scratch_size=0):
    calls = {"runner": [], "direct": []}
    q, k, out = FakeTensor(4096), FakeTensor(8192), FakeTensor(1024)
    args = [q, 7, k, 0.5, out]  # inputs and scalars, then the output
    tensors = (0, 2)
    launch = (lambda *a: calls["direct"].append(a)) if direct else None
    replay = core_launch._Replay(
        runner=lambda *a: calls["runner"].append(a),
        tail=("BM",),
        tensors=tensors,
        outputs=(4,),
        signature=core_launch._inspect(args, tensors)[0],
        grid=(3, 2, 1),
        entry=core_launch.DirectEntry(
            launch, ("fn", "head"), ("post",), scratch_size, 128 if scratch_size else 0
        ),
    )
    return replay, args, calls


def test_direct_route_gets_addresses(monkeypatch):
    monkeypatch.setattr(
        core_launch, "_RUNTIME_KNOBS", [SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)]
    )
    replay, args, calls = _replay(direct=True)
    assert replay.run(args, stream=lambda: 99)
    assert calls["direct"] == [(3, 2, 1, 99, "fn", "head", None, "post", 4096, 7, 8192, 0.5, 1024, "BM")]
    assert calls["runner"] == []


def test_direct_route_gives_global_scratch(monkeypatch):
    """A kernel with global scratch gets a fresh buffer each launch, of the
    grid's programs x the compiled size, from Triton's allocator (what its
    own launcher would pass), in the scratch slot."""
    from triton.runtime import _allocation

    monkeypatch.setattr(
        core_launch, "_RUNTIME_KNOBS", [SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)]
    )
    asked = []

    def allocator(size, align, stream):
        asked.append((size, align, stream))
        return FakeTensor(100 * len(asked))

    replay, args, calls = _replay(direct=True, scratch_size=256)
    token = _allocation._allocator.set(allocator)
    try:
        assert replay.run(args, stream=lambda: 99)
        assert replay.run(args, stream=lambda: 99)
    finally:
        _allocation._allocator.reset(token)
    assert asked == [(6 * 256, 128, 99)] * 2
    # Its address as an int: Triton queries an object's pointer every launch.
    assert [c[4:8] for c in calls["direct"]] == [("fn", "head", 100 * i, "post") for i in (1, 2)]


def test_runner_route_without_a_stream_or_with_hooks(monkeypatch):
    replay, args, calls = _replay(direct=True)
    hooked = SimpleNamespace(launch_enter_hook=SimpleNamespace(calls=[print]), launch_exit_hook=None)
    monkeypatch.setattr(core_launch, "_RUNTIME_KNOBS", [hooked])
    assert replay.run(args, stream=lambda: 99)
    assert replay.run(args, stream=None)
    assert calls["direct"] == []
    assert calls["runner"] == [(*args, "BM")] * 2


def test_steps_aside_for_another_specialisation():
    replay, args, calls = _replay(direct=False)
    for changed in (FakeTensor(4098), FakeTensor(4096, dtype="fp16"), FakeTensor(4096, device="cuda:1")):
        assert not replay.run([changed, *args[1:]], stream=None)
    assert calls == {"runner": [], "direct": []}
    # Only the inputs are checked: the outputs are the binding's own allocations.
    assert replay.run([*args[:4], FakeTensor(1026)], stream=None)


class GluonJITFunction:
    """Stands in for Triton's Gluon kernel class (matched by name, as Triton's
    own JITFunction is): its parameter names and defaults."""

    def __init__(self, names, defaults):
        self.arg_names = names
        self.params = [
            SimpleNamespace(name=n, has_default=n in defaults, default=defaults.get(n)) for n in names
        ]


class Compiled:
    """A compiled kernel as _make_replay reads it (no known launcher: the
    replay then takes the runner)."""

    packed_metadata = "meta"
    run = SimpleNamespace(profile_scratch_size=0, num_ctas=2)  # two CTAs: not the direct route

    def __getitem__(self, grid):
        return ("runner for", grid)


def test_replay_fills_constexprs_the_plan_leaves_to_the_kernel():
    """A constexpr the plan does not set takes the kernel's default, as
    Triton's binder gives it (the Gluon forward's PINGPONG); one without a
    default means no replay (Triton's own path then)."""
    x = FakeTensor(4096)
    kernel = GluonJITFunction(["x", "n", "out", "BM", "PINGPONG"], {"PINGPONG": False})
    plan = core_launch.LaunchPlan(
        kernel=kernel, grid=(2, 1, 1), params=(core_launch.In("x"), 5),
        outputs=(core_launch.OutputSpec((4,), "float32"),), constexprs={"BM": 64},
    )  # fmt: skip
    replay = core_launch._make_replay(plan, [x, 5, FakeTensor(1024)], Compiled())
    assert replay is not None and replay.tail == (64, False)
    assert replay.runner == ("runner for", (2, 1, 1)) and replay.direct is None
    kernel.params[-1].has_default = False
    assert core_launch._make_replay(plan, [x, 5, FakeTensor(1024)], Compiled()) is None
