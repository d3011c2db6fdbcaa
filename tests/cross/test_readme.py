"""Every Python block of the README runs as written, each in a fresh
process (a block sets TRITON_INTERPRET itself when there is no GPU, as a
user's script would)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_the_readme_has_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path):
    script = tmp_path / f"block{index}.py"
    script.write_text(BLOCKS[index])
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TWINKERNELS_POISON")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, f"README block {index} failed:\n{BLOCKS[index]}\n{proc.stderr[-4000:]}"
