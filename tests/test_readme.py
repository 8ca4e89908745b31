"""The README gets a newcomer from clone to a served model in at most 150 lines (issue 31), and its set-up is
exactly two commands, `make run` and `make test` (the developers' guide), both targets of the Makefile."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    first_block = re.search(r"```\n(.*?)```", text, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.split("#")[0].strip()]
    assert commands == ["make run", "make test"]
    targets = re.findall(r"^([a-z]+):", (ROOT / "Makefile").read_text(), re.M)
    assert {"run", "test"} <= set(targets)


def test_the_quality_section_is_short_and_its_numbers_come_from_the_quality_write_ups():
    """The README's quality section summarises docs/quality.md and benchmarks/results/quality/{,operating_point/}
    README.md: at most 12 lines, pointing to the first, and every decimal figure in it stated in one of them."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Quality under compression\n")[1].split("\n## ")[0].strip()
    assert 0 < len(section.splitlines()) <= 12 and "docs/quality.md" in section
    quality = ROOT / "benchmarks" / "results" / "quality"
    sources = (ROOT / "docs" / "quality.md").read_text() + (quality / "README.md").read_text() + \
        (quality / "operating_point" / "README.md").read_text()
    figures = re.findall(r"[+-]?\d+\.\d+", section)
    assert "-5.09" in figures and len(figures) >= 8      # the operating point's nr16 - dense (KDA)
    assert [f for f in figures if f not in sources] == []
