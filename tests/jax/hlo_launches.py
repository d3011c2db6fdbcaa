"""Kernel launches a compiled JAX program makes, read from its optimised HLO.

Each launch of ours is one custom call: ``triton_kernel_call`` (jax-triton,
on a GPU) or a Python CPU callback (Triton's interpreter inside
``jax.pure_callback``).  A call inside a ``while`` body (``lax.map``, what a
sequential ``vmap`` becomes) runs once per iteration: it counts the loop's
trip count times, which XLA states on the loop (``known_trip_count``).  A
loop without one raises: a count that could be wrong must not pass.
"""

from __future__ import annotations

import re

import jax

TARGETS = ("triton_kernel_call", "xla_ffi_python_cpu_callback", "xla_python_cpu_callback")

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")  # "[ENTRY] %name (params) -> type {"
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_SUB = re.compile(r"\b(?:calls|to_apply|body|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _computations(text: str):
    comps, entry, name = {}, None, None
    for line in text.splitlines():
        if name is None:
            m = _HEADER.match(line)
            if m and not line[:1].isspace():  # instructions are indented
                name = m.group(2)
                comps[name] = []
                if m.group(1):
                    entry = name
            continue
        if line.strip() == "}":
            name = None
        else:
            comps[name].append(line)
    return comps, entry


def count(text: str) -> int:
    """Launches of one run of the HLO module ``text``."""
    comps, entry = _computations(text)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    memo = {}

    def launches(name):
        if name not in memo:
            total = 0
            for line in comps[name]:
                target = _TARGET.search(line)
                if target and target.group(1) in TARGETS:
                    total += 1
                subs = _SUB.findall(line)
                branches = _BRANCHES.search(line)
                if branches:
                    subs += [s.strip().lstrip("%") for s in branches.group(1).split(",")]
                times = 1
                if " while(" in line:
                    trips = _TRIPS.search(line)
                    if trips is None:
                        raise ValueError(f"a while loop without a known trip count: {line[:200]}")
                    times = int(trips.group(1))
                total += sum(times * launches(sub) for sub in subs if sub in comps)
            memo[name] = total
        return memo[name]

    return launches(entry)


def run_and_count(fn, *args):
    """Compile ``fn`` for ``args``, run it once: ``(its result, its
    launches)``."""
    compiled = jax.jit(fn).lower(*args).compile()
    out = jax.block_until_ready(compiled(*args))
    return out, count(compiled.as_text())
