"""The project's documents cite only files that are in the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_MD_NAME = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[A-Z][A-Z0-9_]*\.md)\b")  # docs/X.md: documents


def _sources() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return files + sorted((ROOT / "edge_node").rglob("*.py"))


def test_every_cited_markdown_file_exists():
    missing = []
    for path in _sources():
        for name in set(_MD_NAME.findall(path.read_text(encoding="utf-8"))):
            here = path.parent / name
            if not (ROOT / name).is_file() and not here.is_file():
                missing.append(f"{path.relative_to(ROOT)} cites {name}")
    assert not missing, missing


def test_the_algorithm_is_documented_in_the_repository():
    text = (ROOT / "docs" / "ALGORITHM.md").read_text(encoding="utf-8")
    for section in ("One round of client i", "ERK", "setting (ii)", "Accounting"):
        assert section in text
