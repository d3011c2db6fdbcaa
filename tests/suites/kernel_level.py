"""Cases that exercise the kernels and plans rather than the binding.

Both bindings launch the same plans and kernels (tests/cross checks that
their bits agree), so the whole matrix of such cases in one binding proves
the kernels, and a cross-section in the other proves its binding: a suite's
framework module sets ``kernel_cases = False`` to run only the cross-section
(CI time).
"""

from __future__ import annotations

import pytest


class KernelLevelCases:
    """Mixin of the shared suites: ``_kernel_level(binding_case)`` skips a
    kernel-level case in a binding whose ``kernel_cases`` is False, unless
    it belongs to that binding's cross-section."""

    kernel_cases = True

    def _kernel_level(self, binding_case: bool = False) -> None:
        if not (self.kernel_cases or binding_case):
            pytest.skip("kernel-level case: the PyTorch binding runs it (same plans and kernels)")
