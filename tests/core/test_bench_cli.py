"""``python -m bench``: what it runs is listed, and every benchmark module
of bench/ (one with ``run`` and ``count``) is in that list."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _bench(*args):
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_list_names_every_benchmark_module():
    from bench.__main__ import MODULES

    on_disk = set()
    for path in (ROOT / "bench").glob("*.py"):
        text = path.read_text()
        if "\ndef run(" in text and "\ndef count(" in text and path.stem != "ring":
            on_disk.add(path.stem)
    assert on_disk == set(MODULES), on_disk ^ set(MODULES)
    run = _bench("--list")
    assert run.returncode == 0, run.stderr
    listed = [line.split()[0] for line in run.stdout.splitlines()]
    assert listed == list(MODULES), run.stdout
    assert all(len(line.split(maxsplit=1)) == 2 for line in run.stdout.splitlines()), run.stdout


@pytest.mark.parametrize("args", [("--help",), ("-h",)])
def test_help(args):
    run = _bench(*args)
    assert run.returncode == 0 and run.stdout.startswith("usage: python -m bench"), run


def test_unknown_name_is_named():
    run = _bench("flash", "no_such_bench")
    assert run.returncode != 0 and "no_such_bench" in run.stderr and "segments" in run.stderr, run
