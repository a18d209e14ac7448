"""The lab notebooks (labs/*.ipynb).

- each lab has exercise cells (first line ``# EXERCISE``) holding stubs, and one check cell
  for each, tagged ``raises-exception`` (no NBVAL marker comment in the displayed code);
- no answer sits in plain view: the solutions are in <details> blocks;
- run as committed, each check cell shows one short line, with no traceback or file path;
- each notebook runs clean, top to bottom, with the reference answers in place of its
  exercise cells, and every check passes.
"""

from __future__ import annotations

import re

import nbformat
import pytest
from conftest import ROOT
from nbclient import NotebookClient

from llmnote.labs import solutions

pytestmark = pytest.mark.device

# lab: (notebook, a function its exercise cell defines, the check it calls)
LABS = {
    "vector_add": ("labs/02_vector_add.ipynb", "vector_add", "check_vector_add(vector_add)"),
    "softmax": ("labs/03_fused_softmax.ipynb", "softmax", "check_softmax(softmax)"),
    "matmul": ("labs/04_tiled_matmul.ipynb", "matmul", "check_matmul(matmul)"),
    "merge": ("labs/06_flash_attention.ipynb", "merge", "check_softmax_merge(merge)"),
    "attention": ("labs/06_flash_attention.ipynb", "attention", "check_attention(attention)"),
    "roofline": ("labs/01_roofline_placement.ipynb", "place", "check_roofline_placement("),
    "decode_step": ("labs/05_kv_cache_decode.ipynb", "decode_step", "check_decode_step(decode_step)"),
    "quantize": ("labs/07_quantization.ipynb", "quantize_groups", "check_quantize_groups(quantize_groups, dequantize_groups)"),
    "pack_int4": ("labs/07_quantization.ipynb", "pack_int4", "check_pack_int4(pack_int4)"),
    "w4a16_gemv": ("labs/07_quantization.ipynb", "w4a16_gemv", "check_w4a16_gemv(w4a16_gemv)"),
    "block_manager": ("labs/08_block_manager.ipynb", "MyBlockManager", "check_block_manager(MyBlockManager)"),
}
NOTEBOOKS = sorted({notebook for notebook, _, _ in LABS.values()})
TAG = "raises-exception"


def read(notebook: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / notebook, as_version=4)


def labs_of(notebook: str) -> list[str]:
    return [lab for lab, (path, _, _) in LABS.items() if path == notebook]


def exercise_cell(nb: nbformat.NotebookNode, lab: str) -> nbformat.NotebookNode:
    name = LABS[lab][1]
    defines = re.compile(rf"^(?:def|class) {name}\b", re.M)  # the exercise is a function or a class
    code = [c for c in nb.cells if c.cell_type == "code"]
    cells = [c for c in code if c.source.startswith(solutions.EXERCISE_MARK) and defines.search(c.source)]
    assert len(cells) == 1, f"expected one exercise cell defining {name}, found {len(cells)}"
    return cells[0]


def check_cell(nb: nbformat.NotebookNode, lab: str) -> nbformat.NotebookNode:
    cells = [c for c in nb.cells if c.cell_type == "code" and LABS[lab][2] in c.source]
    assert len(cells) == 1, f"expected one check cell calling {LABS[lab][2]}, found {len(cells)}"
    return cells[0]


def test_every_lab_notebook_is_tested():
    assert sorted(str(p.relative_to(ROOT)) for p in (ROOT / "labs").glob("*.ipynb")) == NOTEBOOKS


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_lab_structure(notebook):
    nb = read(notebook)
    labs = labs_of(notebook)
    assert re.match(r"# Lab \d: ", nb.cells[0].source)
    for lab in labs:
        exercise, check = exercise_cell(nb, lab), check_cell(nb, lab)
        assert "raise NotImplementedError" in exercise.source
        assert nb.cells.index(exercise) < nb.cells.index(check)
        assert check.metadata.get("tags") == [TAG] and check.source.startswith("report = check_")
    exercises = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(solutions.EXERCISE_MARK)]
    tagged = [c for c in nb.cells if TAG in c.metadata.get("tags", [])]
    assert len(exercises) == len(tagged) == len(labs)  # nothing else is expected to fail
    assert not any("NBVAL_RAISES_EXCEPTION" in c.source for c in nb.cells)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "## Going further" in markdown and markdown.count("<details>") == markdown.count("</details>")
    assert re.search(r"<summary>Solution</summary>", markdown)


def visible_text(nb: nbformat.NotebookNode) -> str:
    """What a reader sees without opening any <details> block."""
    return "\n".join(re.sub(r"<details>.*?</details>", "", c.source, flags=re.S) for c in nb.cells)


@pytest.mark.parametrize("lab", LABS)
def test_no_answer_in_plain_view(lab):
    # The answer's lines (signatures and one-word lines aside) may appear in hints, one at a time,
    # but most of them only inside a <details> block.
    text = visible_text(read(LABS[lab][0]))
    lines = [line.split("  #")[0].strip() for line in solutions.source(lab).splitlines()[1:]]
    lines = [line for line in lines if len(line) >= 12 and not line.startswith(("def ", "@triton", "return out"))]
    shown = [line for line in lines if line in text]
    assert len(shown) <= 0.35 * len(lines), f"{lab}: {len(shown)} of {len(lines)} answer lines in plain view: {shown}"


def run(nb: nbformat.NotebookNode) -> None:
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "labs")}}).execute()


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_unfinished_lab_shows_one_short_message(notebook):
    nb = read(notebook)
    run(nb)  # cells tagged raises-exception may fail; any other error fails the run
    for lab in labs_of(notebook):
        (error,) = [out for out in check_cell(nb, lab).outputs if out.output_type == "error"]
        assert error.ename == "LabCheckError"
        shown = "\n".join(error.traceback)
        assert len(error.traceback) == 1 and shown.startswith("LabCheckError: ") and "not written yet" in shown, shown
        assert "File " not in shown and "/" not in shown and len(shown) < 250, shown


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_lab_runs_clean_with_the_solution_filled_in(notebook):
    nb = read(notebook)
    for lab in labs_of(notebook):
        exercise_cell(nb, lab).source = solutions.source(lab)
        check_cell(nb, lab).metadata["tags"] = []
    run(nb)
    for lab in labs_of(notebook):
        printed = "".join(out.get("text", "") for out in check_cell(nb, lab).outputs if out.output_type == "stream")
        assert re.search(r"^\w+: \d+ cases passed", printed), printed
