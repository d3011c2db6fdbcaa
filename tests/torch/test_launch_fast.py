"""The torch binding's eager fast path (torch_api._launch._Fast): after a
plan's first launch it calls the compiled launcher's C entry with the
plan's scalars and the call's addresses, and steps aside (launching
nothing) for anything the kernel was not specialised for.  The C entry is
replaced by a recorder, so the logic runs on the CPU; the GPU suite runs
the real entry (tests/torch/test_launch_replay.py and every op's tests)."""

import gc
import types
import weakref

import pytest
import torch

from core_triton import In, LaunchPlan, OutputSpec
from core_triton.common import launch as core_launch
from torch_api import _launch

STREAM = 7


@pytest.fixture(params=[False, True], ids=["fresh outputs", "first output aliased to y"])
def fast_plan(monkeypatch, request):
    """A plan (x, a scalar, y, an absent optional input, an index array)
    with a recorded replay, and the calls its C entry received; its first
    output is written into y's tensor where the param says so (the second
    launch of flash attention's gated pairs)."""
    calls = []
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: -1, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: STREAM, raising=False)
    monkeypatch.setattr(core_launch, "_hooks_set", lambda: False)
    monkeypatch.setattr(_launch, "POISON", False)
    plan = LaunchPlan(
        kernel=object(),
        grid=(3, 2, 1),
        params=(In("x"), 11, In("y"), In("none"), In("idx"), 2.5),
        outputs=(OutputSpec((2, 3), "float32"), OutputSpec((4,), "int32", fill=0.0)),
        aliases=((0, "y"),) if request.param else (),
    )
    x = torch.randn(4, 8)
    y = torch.randn(4, 8, dtype=torch.float64)
    idx = torch.arange(6, dtype=torch.int32)[::2]  # 1-D, strided: launched through a copy
    used = {"x": x, "y": y, "none": None, "idx": idx.contiguous()}
    outputs = [torch.empty(2, 3), torch.zeros(4, dtype=torch.int32)]
    replay = types.SimpleNamespace(
        direct=lambda *a: calls.append(a),
        tensors=(0, 2, 4),
        signature=tuple((t.dtype, t.device, t.data_ptr() % 16 == 0) for t in (x, y, used["idx"])),
        grid=(3, 2, 1),
        head=("function", False),
        post=("metadata",),
        scratch=(0, 0),
        tail=(64, 128),
    )
    monkeypatch.setitem(core_launch._replays, id(plan), (plan, replay))
    _launch._remember(plan, used, outputs, torch.device("cpu"))
    fast = _launch._fast.pop(id(plan))
    return fast, {"x": x, "y": y, "none": None, "idx": idx}, calls


def test_fast_launch_passes_the_plans_scalars_and_the_calls_addresses(fast_plan):
    fast, inputs, calls = fast_plan
    x, y = torch.randn(4, 8), torch.randn(4, 8, dtype=torch.float64)
    idx = torch.arange(10, 13, dtype=torch.int32)
    outputs = fast({**inputs, "x": x, "y": y, "idx": idx})
    if fast.plan.aliases:
        assert outputs[0] is y, "an aliased output is its input's own tensor"
    else:
        assert [o.shape for o in outputs] == [(2, 3), (4,)]
        assert [o.dtype for o in outputs] == [torch.float32, torch.int32]
    assert outputs[1].shape == (4,) and outputs[1].dtype == torch.int32
    assert torch.equal(outputs[1], torch.zeros(4, dtype=torch.int32)), "a filled output starts filled"
    (call,) = calls
    expected = (3, 2, 1, STREAM, "function", False, None, "metadata")
    expected += (x.data_ptr(), 11, y.data_ptr(), None, idx.data_ptr(), 2.5)
    expected += (outputs[0].data_ptr(), outputs[1].data_ptr(), 64, 128)
    assert call == expected


def test_fast_launch_reads_strided_index_arrays_through_a_copy(fast_plan):
    fast, inputs, calls = fast_plan
    fast(inputs)
    (call,) = calls
    # inputs["idx"] is strided: the launch got a contiguous copy's address.
    assert call[8 + 4] != inputs["idx"].data_ptr()


@pytest.mark.parametrize("change", ["dtype", "misaligned", "absent input given", "device"])
def test_fast_launch_steps_aside(fast_plan, change, monkeypatch):
    """Nothing the compiled kernel was not specialised for is launched."""
    fast, inputs, calls = fast_plan
    if change == "dtype":
        inputs = {**inputs, "y": inputs["y"].float()}
    elif change == "misaligned":
        base = torch.randn(33)
        inputs = {**inputs, "x": base[1:].view(4, 8)}
        assert inputs["x"].data_ptr() % 16 != 0
    elif change == "absent input given":
        inputs = {**inputs, "none": torch.randn(3)}
    else:
        monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 1, raising=False)
    assert fast(inputs) is None
    assert calls == []


def test_fast_launch_poisons_outputs_in_tests(fast_plan, monkeypatch):
    fast, inputs, _ = fast_plan
    monkeypatch.setattr(_launch, "POISON", True)
    out, filled = fast(inputs)
    if fast.plan.aliases:  # the first launch's values: never poisoned
        assert out is inputs["y"] and not torch.isnan(out).any()
    else:
        assert torch.isnan(out).all()
    assert torch.equal(filled, torch.zeros(4, dtype=torch.int32)), "a fill is kept"


def test_fast_launch_keeps_no_tensor_of_its_first_call(monkeypatch):
    """The template holds the plan's scalars only (no memory kept alive)."""
    monkeypatch.setattr(core_launch, "_hooks_set", lambda: False)
    x = torch.randn(1000)
    out = torch.empty(10)
    alive = [weakref.ref(x), weakref.ref(out)]
    outputs = (OutputSpec((10,), "float32"),)
    plan = LaunchPlan(kernel=object(), grid=(1, 1, 1), params=(In("x"), 3), outputs=outputs)
    signature = ((x.dtype, x.device, True),)
    replay = types.SimpleNamespace(
        direct=lambda *a: None, tensors=(0,), signature=signature, grid=(1, 1, 1), head=(), tail=(),
        post=(), scratch=(0, 0),
    )  # fmt: skip
    monkeypatch.setitem(core_launch._replays, id(plan), (plan, replay))
    _launch._remember(plan, {"x": x}, [out], torch.device("cpu"))
    fast = _launch._fast.pop(id(plan))
    del x, out
    gc.collect()
    assert all(ref() is None for ref in alive)
    assert fast.args == [0, 3, 0]


def test_fast_launch_fills_every_position_of_a_repeated_input(monkeypatch):
    """An input at several positions (flash passes one array for each absent
    optional input) is checked once and its address goes to every position;
    a change of it still steps aside."""
    calls = []
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: -1, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: STREAM, raising=False)
    monkeypatch.setattr(core_launch, "_hooks_set", lambda: False)
    monkeypatch.setattr(_launch, "POISON", False)
    x, off = torch.randn(4, 8), torch.zeros(2, dtype=torch.int32)
    params = (In("off"), In("x"), 5, In("off"), In("x"), In("off"))
    plan = LaunchPlan(kernel=object(), grid=(1, 1, 1), params=params, outputs=(OutputSpec((3,), "float32"),))
    tensors = (0, 1, 3, 4, 5)
    signature = tuple((t.dtype, t.device, t.data_ptr() % 16 == 0) for t in (off, x, off, x, off))
    replay = types.SimpleNamespace(
        direct=lambda *a: calls.append(a), tensors=tensors, signature=signature, grid=(1, 1, 1),
        head=(), post=(), scratch=(0, 0), tail=(),
    )  # fmt: skip
    monkeypatch.setitem(core_launch._replays, id(plan), (plan, replay))
    _launch._remember(plan, {"off": off, "x": x}, [torch.empty(3)], torch.device("cpu"))
    fast = _launch._fast.pop(id(plan))
    assert len(fast.slots) == 2
    x2, off2 = torch.randn(4, 8), torch.ones(2, dtype=torch.int32)
    (out,) = fast({"off": off2, "x": x2})
    (call,) = calls
    p, q = off2.data_ptr(), x2.data_ptr()
    assert call == (1, 1, 1, STREAM, None, p, q, 5, p, q, p, out.data_ptr())
    assert fast({"off": off2.long(), "x": x2}) is None and len(calls) == 1


def test_fast_launch_gives_global_scratch_from_tritons_allocator(fast_plan, monkeypatch):
    """A kernel with global scratch (the Gluon kernels' device-side
    descriptors) gets a fresh buffer each launch, of grid x the compiled
    per-program size, from the allocator Triton's own launcher would use
    (the user's, where set), in the scratch slot between head and post."""
    from triton.runtime import _allocation

    fast, inputs, calls = fast_plan
    asked = []

    def allocator(size, align, stream):
        asked.append((size, align, stream))
        address = 1000 + len(asked)
        return types.SimpleNamespace(data_ptr=lambda: address)

    fast.scratch = (6 * 256, 128)  # grid (3, 2, 1), 256 bytes a program
    token = _allocation._allocator.set(allocator)
    try:
        fast(inputs)
        fast(inputs)
    finally:
        _allocation._allocator.reset(token)
    assert asked == [(1536, 128, STREAM)] * 2
    # The buffer's address, as an int (Triton queries an object's pointer).
    assert [call[6:8] for call in calls] == [(1001, "metadata"), (1002, "metadata")]


def test_replay_sizes_global_scratch_from_the_compiled_launcher(monkeypatch):
    """core_triton's replay takes the scratch size, alignment and the C
    entry's arguments around the scratch slot from Triton 3.6's launcher
    (recorded here; the installed Triton is taken for 3.6)."""
    import triton

    monkeypatch.setattr(core_launch, "_DIRECT_TRITON", (triton.__version__,))
    launcher = types.SimpleNamespace(
        profile_scratch_size=0, num_ctas=1, global_scratch_size=384, global_scratch_align=128,
        launch_cooperative_grid=False, launch_pdl=True, launch="entry",
    )  # fmt: skip
    compiled = types.SimpleNamespace(run=launcher, function="fn", packed_metadata="meta")
    entry = core_launch._direct_entry(compiled)
    assert (entry.launch, entry.head, entry.post) == (
        "entry",
        ("fn", False, True),
        (None, "meta", None, None, None),
    )
    replay = core_launch._Replay(None, (), (), (), (), (5, 3, 2), entry)
    assert replay.direct == "entry"
    assert replay.scratch == (5 * 3 * 2 * 384, 128)
    launcher.global_scratch_size = 0
    replay = core_launch._Replay(None, (), (), (), (), (5, 3, 2), core_launch._direct_entry(compiled))
    assert replay.scratch == (0, 0) and replay.global_scratch(STREAM) is None
    launcher.profile_scratch_size = 64  # profiling scratch: Triton's own runner
    assert core_launch._direct_entry(compiled).launch is None


def test_outputs_are_poisoned_in_the_suite():
    """tests/conftest.py sets TWINKERNELS_POISON=1 before the binding is
    imported, which reads it once: every launch's outputs start as NaN."""
    assert _launch.POISON and _launch.poison_outputs()
