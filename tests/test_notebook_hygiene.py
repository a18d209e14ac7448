"""Rules every notebook of the book follows (DESIGN.md, "Notebooks").

- committed without outputs or execution counts, except cells marked NBVAL_CHECK_OUTPUT;
- the first code cell is the Colab install guard, exactly COLAB_GUARD;
- _toc.yml lists every notebook, and every _toc.yml entry exists;
- the test command validates the notebooks with nbval, and nbval collects each one;
- markdown that JupyterLab and Colab render as the website does: no MyST roles or
  directives, answers and solutions in closed HTML <details> blocks with a <summary>;
- test markers live in cell tags, not in the code a reader sees;
- chapter pages teach: under about 5,000 words, and they do not narrate the project.

`make strip` (scripts/strip_outputs.py) removes outputs before a commit.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT, book_config, book_notebooks, toc_files

KEEP_MARK = "# NBVAL_CHECK_OUTPUT"
REPOSITORY_URL = book_config()["repository"]["url"]

# The first code cell of every notebook. In Colab it installs llmnote from the book's
# repository (the URL comes from _config.yml, the one place it is written);
# anywhere else it does nothing.
COLAB_GUARD = f"""\
# Running in Colab? Install the book's package first (this does nothing anywhere else).
import sys

if "google.colab" in sys.modules:
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "llmnote @ git+{REPOSITORY_URL}"], check=True)"""

NOTEBOOKS = book_notebooks()
# MyST that only the website renders: roles such as {doc}`x`, directive fences, colon fences.
MYST_ONLY = re.compile(r"\{[a-z][a-z-]*\}`|^\s*(`{3,}|~{3,}|:{3,})\s*\{[a-z-]+\}|^:class:", re.MULTILINE)
# How the project talks about itself; chapter text talks about GPUs and kernels instead.
NARRATION = re.compile(
    r"the issue's|\bissue \d|this project|this machine|\bour targets?\b|after a fresh start|run-to-run history", re.IGNORECASE
)
MAX_WORDS = 5500


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=rel)
def test_committed_without_outputs(path: Path) -> None:
    nb = read(path)
    dirty = [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and KEEP_MARK not in cell.source and (cell.outputs or cell.execution_count is not None)
    ]
    assert not dirty, f"{rel(path)}: cells {dirty} have outputs or execution counts: run `make strip`"
    assert "widgets" not in nb.metadata, f"{rel(path)}: saved widget state in the metadata: run `make strip`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=rel)
def test_first_code_cell_is_colab_guard(path: Path) -> None:
    code = [cell for cell in read(path).cells if cell.cell_type == "code"]
    assert code, f"{rel(path)}: has no code cell"
    assert code[0].source.strip() == COLAB_GUARD, f"{rel(path)}: the first code cell must be exactly:\n{COLAB_GUARD}"


def test_toc_lists_every_notebook() -> None:
    listed = set(toc_files())
    missing = [rel(p) for p in NOTEBOOKS if rel(p.with_suffix("")) not in listed]
    assert not missing, f"notebooks not in _toc.yml: {missing}"


def test_every_toc_entry_exists() -> None:
    absent = [f for f in toc_files() if not any((ROOT / f).with_suffix(s).is_file() for s in (".ipynb", ".md"))]
    assert not absent, f"_toc.yml entries with no .ipynb or .md file: {absent}"


def test_no_static_folder_at_book_root() -> None:
    # Jupyter Book 1 injects every .js under <root>/_static (and under every other
    # html_static_path, vendor/site included) into every page once that folder exists.
    assert not (ROOT / "_static").exists(), "no `_static` folder at the book root: see _config.yml"


def test_the_test_command_runs_nbval_over_the_notebooks() -> None:
    makefile = (ROOT / "Makefile").read_text()
    command = re.search(r"^PYTEST_CMD := (.*)$", makefile, re.MULTILINE)
    assert command, "Makefile has no PYTEST_CMD"
    for part in ("--nbval-lax", "--nbval-current-env", "tests", "$(NOTEBOOK_DIRS)"):
        assert part in command.group(1).split(), f"PYTEST_CMD lacks {part}"
    assert re.search(r"^NOTEBOOK_DIRS := \$\(wildcard chapters labs\)$", makefile, re.MULTILINE)


@pytest.mark.skipif(not NOTEBOOKS, reason="no notebooks yet")
def test_nbval_collects_every_notebook() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "--nbval-lax",
            "--nbval-current-env",
            *map(str, NOTEBOOKS),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    collected = {line.split("::")[0] for line in result.stdout.splitlines() if "::" in line}
    assert collected == {rel(p) for p in NOTEBOOKS}, result.stdout


def test_python3_kernel_is_this_environment() -> None:
    # jupyter-book executes notebooks with the kernel "python3"; it must be this venv's python.
    from jupyter_client.kernelspec import KernelSpecManager

    argv0 = KernelSpecManager().get_kernel_spec("python3").argv[0]
    executable = Path(argv0 if Path(argv0).is_absolute() else shutil.which(argv0) or argv0)
    assert executable.parent == Path(sys.executable).parent, f"kernel python3 runs {executable}, not {sys.executable}"


def markdown_cells(path: Path) -> list[str]:
    return [cell.source for cell in read(path).cells if cell.cell_type == "markdown"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=rel)
def test_markdown_renders_outside_the_website(path: Path) -> None:
    for i, text in enumerate(markdown_cells(path)):
        found = MYST_ONLY.search(text)
        assert not found, (
            f"{rel(path)}: markdown cell {i} uses MyST markup ({found.group(0).strip()!r}) that JupyterLab shows raw"
        )
        opened, closed = text.count("<details>"), text.count("</details>")
        assert opened == closed, f"{rel(path)}: markdown cell {i} opens {opened} <details> and closes {closed}"
        assert "<details open" not in text, f"{rel(path)}: markdown cell {i}: answers start folded"
        for block in text.split("<details>")[1:]:
            head = block.lstrip("\n")
            assert head.startswith("<summary>"), f"{rel(path)}: markdown cell {i}: a <details> block without a <summary> first"
            after = head.split("</summary>", 1)[1]
            assert after.startswith("\n\n"), f"{rel(path)}: markdown cell {i}: leave a blank line after </summary>"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=rel)
def test_test_markers_are_tags_not_code(path: Path) -> None:
    shown = [
        i for i, cell in enumerate(read(path).cells) if "NBVAL_RAISES_EXCEPTION" in cell.source or "NBVAL_SKIP" in cell.source
    ]
    assert not shown, f"{rel(path)}: cells {shown}: use the cell tags raises-exception / nbval-skip instead of a comment"


CHAPTER_PAGES = [p for p in NOTEBOOKS if p.parts[-3] == "chapters" and p.parent.name != "appendix"]


@pytest.mark.parametrize("path", CHAPTER_PAGES, ids=rel)
def test_chapter_pages_teach(path: Path) -> None:
    text = "\n".join(markdown_cells(path))
    words = len(text.split())
    assert words <= MAX_WORDS, f"{rel(path)}: {words} words of text; split the page (about 5,000 at most)"
    said = sorted({m.group(0) for m in NARRATION.finditer(text)})
    assert not said, f"{rel(path)}: narrates the project ({said}); that story belongs in the appendix's engineering notes"
