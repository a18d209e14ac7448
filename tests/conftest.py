"""Shared paths and the book's notebooks, for the tests under tests/."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIRS = ("chapters", "labs")


def book_notebooks() -> list[Path]:
    """Every notebook under chapters/ and labs/ (checkpoints excluded), sorted."""
    found = (p for d in NOTEBOOK_DIRS for p in (ROOT / d).rglob("*.ipynb"))
    return sorted(p for p in found if ".ipynb_checkpoints" not in p.parts)


def book_config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def toc_files() -> list[str]:
    """Every file of _toc.yml (root first), as written there: without suffix."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(entries: list[dict]) -> None:
        for entry in entries:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections", []))

    for part in toc.get("parts", []):
        walk(part.get("chapters", []))
    walk(toc.get("chapters", []))
    return files
