"""Rules every notebook of the book follows (DESIGN.md, "Notebooks").

- committed without outputs or execution counts, except cells marked NBVAL_CHECK_OUTPUT;
- the first code cell is the Colab install guard, exactly COLAB_GUARD;
- _toc.yml lists every notebook, and every _toc.yml entry exists;
- the test command validates the notebooks with nbval, and nbval collects each one.

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
