"""The README's speed table, and the ratios it claims, are what
bench/readme_tables.py writes from the saved benchmark results (no
hand-copied figure: a new result or a hand edit fails here)."""

from __future__ import annotations

from bench import readme_tables


def test_readme_speed_block_is_the_generated_one():
    text = (readme_tables.ROOT / "README.md").read_text()
    assert readme_tables.speed_block() in text, "run python -m bench.readme_tables"


def test_readme_flash_block_is_the_generated_one():
    text = (readme_tables.ROOT / "README.md").read_text()
    assert readme_tables.flash_block() in text, "run python -m bench.readme_tables"


def test_readme_segments_claim_is_the_generated_one():
    text = (readme_tables.ROOT / "README.md").read_text()
    assert readme_tables.segments_block() in text, "run python -m bench.readme_tables"
