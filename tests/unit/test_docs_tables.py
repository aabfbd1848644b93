"""The project's Markdown tables render as tables: every row has its header's number of cells.

A row with a cell too many or too few still renders, but its figures land under the wrong
column or vanish (GitHub drops cells past the header's). A pipe splits a cell wherever it is
not escaped, inside a code span too, as GitHub Flavored Markdown has it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("charts/*/README.md"),
        *ROOT.glob("examples/*.md"),
    ]
)
UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def cell_count(row: str) -> int:
    inner = row.strip().removeprefix("|")
    if inner.endswith("|") and not inner.endswith("\\|"):
        inner = inner[:-1]
    return len(UNESCAPED_PIPE.split(inner))


def misshapen_rows(text: str) -> Iterator[str]:
    """Each table row whose cells differ in number from its table's header row."""
    header: int | None = None
    header_line = 0
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, header = not fenced, None
            continue
        if fenced or not line.lstrip().startswith("|"):
            header = None
            continue
        if header is None:
            header, header_line = cell_count(line), number
        elif (count := cell_count(line)) != header:
            yield f"line {number}: {count} cells, the header (line {header_line}) has {header}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_table_row_has_its_headers_cells(document: Path) -> None:
    assert list(misshapen_rows(document.read_text())) == []


def test_a_row_with_a_cell_too_many_is_found() -> None:
    table = "| a | b |\n|---|---|\n| 1 | 2 |\n| 1 | 2 | 3 |\n| `x \\| y` | 2 |\n"
    assert list(misshapen_rows(table)) == ["line 4: 3 cells, the header (line 1) has 2"]
