"""Framework-free description of one kernel launch.

A binding asks an op module for a :class:`LaunchPlan`, maps the plan's named
inputs to its own arrays, allocates the outputs the plan describes, and
launches.  The parameter order follows jax-triton's convention, so the same
kernel signature serves both bindings: inputs and scalars in the order of
``params``, then one pointer per output, then the constexpr metaparameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TensorInfo:
    """What a plan needs to know of an array: shape, dtype name, element
    strides (row-major when the framework has no other layout) and device
    (``None`` where the framework places arrays itself)."""

    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]
    device: str | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class In:
    """A pointer parameter fed by the binding's input called ``name``."""

    name: str


@dataclass(frozen=True)
class OutputSpec:
    """An output buffer: its shape, dtype name and initial fill.

    ``fill=None`` means the kernel writes every element (tests poison such
    buffers with NaN); ``fill=0.0`` means the kernel accumulates into it.
    """

    shape: tuple[int, ...]
    dtype: str
    fill: float | None = None


@dataclass(frozen=True)
class LaunchPlan:
    """One launch.  ``grid`` is a tuple, or a callable of the metaparameters
    for autotuned kernels (whose configs then set ``num_warps`` and
    ``num_stages``: leave both None)."""

    kernel: Any
    grid: tuple[int, ...] | Callable[[dict[str, Any]], tuple[int, ...]]
    params: tuple[Any, ...]
    outputs: tuple[OutputSpec, ...]
    constexprs: Mapping[str, Any] = field(default_factory=dict)
    num_warps: int | None = 4
    num_stages: int | None = 2
    # Names under which the outputs join the inputs of later launches of a
    # multi-launch op (see run_steps).
    output_names: tuple[str, ...] = ("out",)

    def is_empty(self) -> bool:
        """True when a fixed grid has no program (zero-size tensors)."""
        return not callable(self.grid) and 0 in self.grid

    def input_names(self) -> list[str]:
        """Names of the array inputs, in parameter order."""
        return [p.name for p in self.params if isinstance(p, In)]

    def arguments(self, inputs: Mapping[str, Any]) -> list[Any]:
        """Positional kernel arguments (outputs excluded)."""
        missing = [n for n in self.input_names() if n not in inputs]
        if missing:
            raise KeyError(f"launch plan needs inputs {missing}")
        return [inputs[p.name] if isinstance(p, In) else p for p in self.params]

    def launch_options(self) -> dict[str, Any]:
        opts = dict(self.constexprs)
        if self.num_warps is not None:
            opts["num_warps"] = self.num_warps
        if self.num_stages is not None:
            opts["num_stages"] = self.num_stages
        return opts


def launch_direct(plan: LaunchPlan, inputs: Mapping[str, Any], outputs: Sequence[Any]) -> None:
    """Launch ``plan`` on tensors Triton takes directly (torch tensors, on a
    GPU or, under the interpreter, on the CPU); ``outputs`` are allocated by
    the caller as ``plan.outputs`` describes."""
    if plan.is_empty():
        return
    grid = plan.grid if callable(plan.grid) else tuple(plan.grid)
    plan.kernel[grid](*plan.arguments(inputs), *outputs, **plan.launch_options())


def run_steps(steps: Sequence[LaunchPlan], inputs: Mapping[str, Any], launch_one) -> list[Any]:
    """Run launch plans in order, each seeing the op's inputs and the named
    outputs of the steps before it; returns the last step's outputs.
    ``launch_one(plan, named_arrays)`` is the binding's launcher."""
    env = dict(inputs)
    outputs: list[Any] = []
    for step in steps:
        outputs = list(launch_one(step, env))
        env.update(zip(step.output_names, outputs, strict=True))
    return outputs


def run_named(steps: Sequence[LaunchPlan], inputs: Mapping[str, Any], launch_one) -> dict[str, Any]:
    """Like :func:`run_steps`, for ops with several results: returns every
    named array (the inputs and each step's outputs) by name."""
    env = dict(inputs)
    for step in steps:
        env.update(zip(step.output_names, launch_one(step, env), strict=True))
    return env
