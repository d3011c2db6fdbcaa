"""What a user installs: every package of the source tree in the
distribution (the integrations once were not), type hints marked, the
license file beside the license that pyproject.toml names."""

from __future__ import annotations

import fnmatch
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOPS = ("core_triton", "jax_api", "torch_api")


def _pyproject():
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_every_package_is_distributed():
    include = _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in TOPS
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert {"torch_api.integrations", "jax_api.integrations", "core_triton.delta_rule"} <= packages
    missing = sorted(p for p in packages if not any(fnmatch.fnmatchcase(p, pat) for pat in include))
    assert not missing, f"packages left out of the distribution: {missing}"


def test_type_hints_and_license_ship():
    cfg = _pyproject()
    assert cfg["tool"]["setuptools"]["package-data"]["*"] == ["py.typed"]
    for top in TOPS:
        assert (ROOT / top / "py.typed").is_file(), top
    assert cfg["project"]["license"]["text"] == "Apache-2.0"
    head = (ROOT / "LICENSE").read_text().splitlines()[:2]
    assert head[0].strip() == "Apache License" and head[1].strip() == "Version 2.0, January 2004"
