"""docs/api.md, the API reference, stays in sync with both bindings.

Every public function (each binding's ``__all__``, and the JAX-only
``ring_attention_mesh``) has a section in docs/api.md: a heading with its
name in backticks, up to the next heading of the same or a higher level.
Every parameter of its signature has a row in that section's parameter
table (its name in backticks in the first cell); its docstring points to
the section (``docs/api.md#<anchor>``); the two bindings' signatures agree
(names, order, kinds, defaults) except the framework-specific defaults
listed here, which the sections must mention.  Every ``docs/api.md#...``
pointer in the code and every in-page link of docs/api.md leads to a
heading.  No kernel runs: a binding that is not installed is skipped.
"""

from __future__ import annotations

import inspect
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "api.md")
BINDINGS = ("torch_api", "jax_api")
# As a parameter: the JAX binding's cases carry the jax mark (the JAX
# session runs those of tests/core, tests/core/conftest.py).
BINDING_PARAMS = ("torch_api", pytest.param("jax_api", marks=pytest.mark.jax))
# Public functions outside __all__ (documented as such).
EXTRA = {"jax_api": ("ring_attention_mesh",)}
# Defaults that are a framework's own object: (function, parameter) -> the
# dtype name both defaults stand for, and the words the section must hold.
FRAMEWORK_DEFAULTS = {
    ("prepare_cu_seqlens_from_mask", "out_dtype"): ("int32", ("`torch.int32`", "`jnp.int32`")),
}
# Parameters whose meaning differs between the bindings; the section must
# say which binding takes them.
FRAMEWORK_PARAMS = {("ring_attention", "axis_name"): "JAX", ("ring_attention", "group"): "PyTorch"}


def _doc() -> str:
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def _headings(text: str) -> list[tuple[int, int, str]]:
    """``(offset, level, title)`` of every Markdown heading outside code blocks."""
    out, fenced, offset = [], False, 0
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"(#{1,6})\s+(.*?)\s*$", line)
        if m:
            out.append((offset, len(m.group(1)), m.group(2)))
        offset += len(line)
    return out


def slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than
    ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def sections(text: str) -> dict[str, tuple[str, str]]:
    """``{name: (anchor, section text)}`` for every heading that holds a
    backticked name."""
    heads = _headings(text)
    out = {}
    for i, (start, level, title) in enumerate(heads):
        end = next((o for o, lv, _ in heads[i + 1 :] if lv <= level), len(text))
        for name in re.findall(r"`(\w+)`", title):
            if name in out:
                raise AssertionError(f"two headings of docs/api.md hold `{name}`")
            out[name] = (slug(title), text[start:end])
    return out


def public_functions(binding: str) -> dict[str, object]:
    module = pytest.importorskip(binding)
    names = (*module.__all__, *EXTRA.get(binding, ()))
    return {n: getattr(module, n) for n in names}


@pytest.mark.parametrize("binding", BINDING_PARAMS)
def test_every_public_function_has_a_section(binding):
    documented = sections(_doc())
    missing = sorted(set(public_functions(binding)) - set(documented))
    assert not missing, f"no section in docs/api.md for {missing}"


def table_names(section: str) -> set[str]:
    """Backticked names in the first cell of the section's table rows."""
    names = set()
    for line in section.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2:
            names.update(re.findall(r"`(\w+)`", cells[1]))
    return names


@pytest.mark.parametrize("binding", BINDING_PARAMS)
def test_every_parameter_is_documented(binding):
    documented = sections(_doc())
    missing = []
    for name, fn in public_functions(binding).items():
        rows = table_names(documented[name][1])
        missing += [f"{name}({p})" for p in inspect.signature(fn).parameters if p not in rows]
    assert not missing, f"parameters without a row in their section's table in docs/api.md: {missing}"


@pytest.mark.parametrize("binding", BINDING_PARAMS)
def test_docstrings_point_to_their_section(binding):
    documented = sections(_doc())
    wrong = []
    for name, fn in public_functions(binding).items():
        anchor, _ = documented[name]
        if f"docs/api.md#{anchor}" not in (inspect.getdoc(fn) or ""):
            wrong.append(name)
    assert not wrong, f"docstrings without a pointer to their docs/api.md section: {wrong}"


def _dtype_name(binding: str, value) -> str:
    if binding == "torch_api":
        return str(value).removeprefix("torch.")
    import jax.numpy as jnp

    return jnp.dtype(value).name


@pytest.mark.jax
def test_signatures_agree():
    funcs = {b: public_functions(b) for b in BINDINGS}
    torch_api, jax_api = (pytest.importorskip(b) for b in BINDINGS)
    assert sorted(torch_api.__all__) == sorted(jax_api.__all__)
    documented = sections(_doc())
    for name in torch_api.__all__:
        pt = inspect.signature(funcs["torch_api"][name]).parameters
        pj = inspect.signature(funcs["jax_api"][name]).parameters
        assert list(pt) == list(pj), name
        for p in pt:
            assert pt[p].kind == pj[p].kind, (name, p)
            dt, dj = pt[p].default, pj[p].default
            if (name, p) in FRAMEWORK_DEFAULTS:
                want, words = FRAMEWORK_DEFAULTS[name, p]
                assert _dtype_name("torch_api", dt) == _dtype_name("jax_api", dj) == want, (name, p)
                for w in words:
                    assert w in documented[name][1], f"docs/api.md#{name} does not mention {w}"
            else:
                assert type(dt) is type(dj) and dt == dj, (name, p, dt, dj)


def test_framework_specific_parameters_are_marked():
    documented = sections(_doc())
    for (name, p), framework in FRAMEWORK_PARAMS.items():
        row = next((line for line in documented[name][1].splitlines() if line.startswith(f"| `{p}` |")), "")
        assert f"**{framework}**" in row, f"docs/api.md#{name}: the row of `{p}` must say **{framework}**"


def test_pointers_lead_to_headings():
    text = _doc()
    anchors = {slug(title) for _, _, title in _headings(text)}
    bad = [f"docs/api.md: #{a}" for a in re.findall(r"\]\(#([^)]+)\)", text) if a not in anchors]
    for folder in ("core_triton", "torch_api", "jax_api", "tests", "bench"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8") as fh:
                    for a in re.findall(r"docs/api\.md#([\w\-]+)", fh.read()):
                        if a not in anchors:
                            bad.append(f"{os.path.relpath(path, ROOT)}: #{a}")
    assert not bad, f"pointers to no heading of docs/api.md: {bad}"
