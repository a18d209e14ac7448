"""Shared paths and the book's notebooks, for the tests under tests/."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
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


# Debian's Chromium, driven by Playwright (never a browser Playwright downloads), with the
# flags that keep it from reaching the network on its own.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@contextmanager
def chromium() -> Iterator:
    """A launched Chromium (a Playwright ``Browser``); fails the test if it is not installed."""
    if not CHROMIUM.exists():
        if os.environ.get("LLMNOTE_ALLOW_NO_BROWSER") == "1":
            pytest.skip(f"{CHROMIUM} is missing and LLMNOTE_ALLOW_NO_BROWSER=1")
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (`make test` does it).")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
