"""The flash kernels take few arguments (issue 29): each tensor's strides as
one tuple, and the constants a plan sets once a call as two constexpr
groups (flash_common.FWD_GROUPS), which the launch packs from the plan's
names (core_triton.common.launch.kernel_constexprs)."""

import inspect
import re

import pytest

from core_triton.attention.flash_bwd import flash_bwd_dbias_kernel, flash_bwd_dkdv_kernel, flash_bwd_dq_kernel
from core_triton.attention.flash_fwd import flash_fwd_kernel
from core_triton.common.launch import kernel_constexprs

KERNELS = [flash_fwd_kernel, flash_bwd_dkdv_kernel, flash_bwd_dq_kernel, flash_bwd_dbias_kernel]


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.fn.__name__)
def test_kernel_reads_its_groups_back_in_order(kernel):
    """Each group's constants are read back by name in the group's order
    (a name read from the wrong place would compile and run wrong), and no
    grouped name is also an argument of its own."""
    source = inspect.getsource(kernel.fn)
    for group, names in kernel.constexpr_groups.items():
        read = re.findall(rf"^    (\w+): tl\.constexpr = {group}\[(\d+)\]$", source, re.M)
        assert read == [(n, str(i)) for i, n in enumerate(names)], (group, read)
        assert group in kernel.arg_names
        assert not set(names) & set(kernel.arg_names)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.fn.__name__)
def test_kernel_takes_few_arguments(kernel):
    # forward 37, dK/dV 39, dQ 41, dbias 35 (73, 77, 81 and 68 before).
    assert len(kernel.arg_names) <= 41, len(kernel.arg_names)


def test_launch_packs_the_plan_names():
    """A plan names each constant; the launch gives the kernel its groups
    as tuples in their order and the rest as they are, and a missing name
    is an error rather than a default."""
    groups = flash_fwd_kernel.constexpr_groups
    names = [n for g in groups.values() for n in g]
    plan = {n: i for i, n in enumerate(names)} | {"BM": 64, "GATE": 0}
    packed = kernel_constexprs(flash_fwd_kernel, plan)
    assert packed == {"BM": 64, "GATE": 0} | {g: tuple(plan[n] for n in ns) for g, ns in groups.items()}
    with pytest.raises(KeyError, match="CAUSAL"):
        kernel_constexprs(flash_fwd_kernel, {n: 0 for n in names if n != "CAUSAL"})
    # A kernel without groups takes the names as they are.
    assert kernel_constexprs(flash_fwd_kernel.fn, {"X": 1}) == {"X": 1}
