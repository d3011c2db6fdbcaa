import numpy as np
import pytest
import torch

from tests.frameworks import TorchFramework
from tests.suites.packed_bounds import PackedBoundsSuite


class TestPackedBounds(PackedBoundsSuite):
    fw = TorchFramework()


@pytest.mark.parametrize(
    "T,cu",
    [
        (70, [50, 60, 10, 20]),  # decreasing: a gap between covered rows
        (130, [3, 64, 64, 127]),  # first and last rows uncovered, an empty sequence
        (20, [5]),  # no sequence: every row
        (200, "wild"),  # 40 sequences (more than one block of bounds), out of order
        (200, [10] * 36 + [100, 150, 120, 199]),  # only sequences past the first block cover rows
        (40, [0, 39, 0, 39, 0, 39, 0, 39, 0, 40]),  # overlaps use up the chunk slots: row 39 has none
        (64, [0, 30, 64]),  # the valid case: nothing written
    ],
    ids=["gap", "ends", "none", "wild", "late", "no_slot", "valid"],
)
@pytest.mark.parametrize("chunk", [0, 16])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_zero_uncovered_rows(T, cu, chunk, dtype):
    # zero_uncovered_plan writes 0 in exactly the rows the op's kernels
    # leave unwritten (no clamped sequence covers them; with chunks, or no
    # chunk slot does), in every leading slice, and leaves the others as
    # they were (NaN here).
    from core_triton.common.launch import run_named
    from core_triton.common.sequences import chunk_offsets_plan, zero_uncovered_plan
    from torch_api._launch import launch

    if cu == "wild":
        cu = np.random.default_rng(0).integers(-50, T + 50, 41).tolist()
    n_seq = len(cu) - 1
    n_slots = -(-T // chunk) + n_seq if chunk else 0  # chunk.py's NS for packed input
    written, used = np.zeros(T, bool), 0
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        lo = min(max(a, 0), T)
        hi = min(max(b, lo), T)
        if chunk:
            n = min(-(-(hi - lo) // chunk), n_slots - used)
            used += n
            hi = min(hi, lo + n * chunk)
        written[lo:hi] = True
    if T == 40 and chunk:
        assert not written[39]  # the case reaches the slot clamp
    shape = (3, T, 2, 7)  # R = 14 columns, not a power of 2
    device = TorchFramework().device
    x = torch.full(shape, float("nan"), dtype=getattr(torch, dtype), device=device)
    steps = [zero_uncovered_plan("o", shape, dtype, 1, n_seq, chunk, n_slots)]
    if chunk:
        steps.insert(0, chunk_offsets_plan(n_seq, T, chunk, "chunk_offsets"))
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    out = run_named(steps, {"o": x, "cu_seqlens": cu_t}, launch)["o"]
    assert out.data_ptr() == x.data_ptr()
    got = out.float().cpu().numpy()
    assert np.isnan(got[:, written]).all()
    assert (got[:, ~written] == 0).all()
