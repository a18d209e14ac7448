"""Strip outputs and execution counts from notebooks before they are committed.

Cells whose source contains ``# NBVAL_CHECK_OUTPUT`` keep their outputs: nbval compares
them on every test run (see DESIGN.md). Notebook metadata left by a run (widget state) is
removed too.

    python scripts/strip_outputs.py                 # every notebook under chapters/ and labs/
    python scripts/strip_outputs.py path/to/x.ipynb # just these
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIRS = ("chapters", "labs")
KEEP_MARK = "# NBVAL_CHECK_OUTPUT"
RUN_METADATA = ("widgets", "execution")


def find_notebooks(root: Path = ROOT) -> list[Path]:
    """Every notebook of the book (chapters/ and labs/), checkpoints excluded."""
    found = (p for d in NOTEBOOK_DIRS for p in (root / d).rglob("*.ipynb"))
    return sorted(p for p in found if ".ipynb_checkpoints" not in p.parts)


def strip(nb: nbformat.NotebookNode) -> bool:
    """Strip ``nb`` in place; return True if anything changed."""
    changed = False
    for key in RUN_METADATA:
        changed |= nb.metadata.pop(key, None) is not None
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        changed |= cell.metadata.pop("execution", None) is not None
        if KEEP_MARK in cell.source:
            continue
        if cell.outputs or cell.execution_count is not None:
            cell.outputs, cell.execution_count = [], None
            changed = True
    return changed


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or find_notebooks()
    for path in paths:
        nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
        if strip(nb):
            nbformat.write(nb, path)
            print(f"stripped {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
