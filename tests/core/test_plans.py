"""Launch plans: grids sized from shapes alone, every slot accounted for."""

from core_triton import TensorInfo, cdiv, chunk_global_cumsum, chunk_local_cumsum
from core_triton.utils import contiguous_strides


def _info(shape, dtype="float32"):
    return TensorInfo(shape, dtype, contiguous_strides(shape))


def test_local_grid_covers_every_chunk_of_packed_input():
    # N sequences add at most N partial chunks to cdiv(T, chunk).
    cu = _info((5,), "int32")
    (p,) = chunk_local_cumsum.plans(_info((1, 1000, 4)), 64, cu_seqlens=cu).forward
    assert p.grid[0] == cdiv(1000, 64) + 4
    assert p.constexprs["BT"] == 64 and p.outputs[0].shape == (1, 1000, 4)


def test_global_grid_has_enough_programs():
    (p,) = chunk_global_cumsum.plans(_info((4, 4096, 16, 128))).forward
    assert p.grid[1] * p.grid[2] >= 256


def test_backward_plan_flips_direction_and_keeps_input_dtype():
    plans = chunk_local_cumsum.plans(_info((2, 10, 3), "bfloat16"), 8, reverse=True, output_dtype="float32")
    (back,) = plans.backward(_info((2, 10, 3), "float32"))
    assert plans.forward[0].constexprs["REVERSE"] and not back.constexprs["REVERSE"]
    assert back.outputs[0].dtype == "bfloat16" and plans.forward[0].outputs[0].dtype == "float32"


def test_global_scan_splits_only_when_too_few_programs():
    # 8 rows x 1 feature tile: two launches over chunks (totals, then scans).
    split = chunk_global_cumsum.plans(_info((8, 65536, 16))).forward
    assert [p.constexprs["PASS"] for p in split] == [1, 2]
    assert split[0].output_names == ("totals",) and split[0].outputs[0].dtype == "float32"
    assert split[1].grid[0] * split[1].grid[1] * split[1].grid[2] >= 1024
    # Enough (row, feature tile) programs, or short sequences: one launch.
    assert len(chunk_global_cumsum.plans(_info((8, 8192, 16, 128))).forward) == 1
    assert len(chunk_global_cumsum.plans(_info((8, 1000, 16))).forward) == 1
