"""scripts/execute_notebooks.py: what it caches is what Jupyter Book's build looks up."""

from __future__ import annotations

import sys

import nbformat
from conftest import ROOT, toc_files
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn

sys.path.insert(0, str(ROOT / "scripts"))
import execute_notebooks  # noqa: E402


def test_the_book_notebooks_are_the_toc_notebooks():
    listed = {p.relative_to(ROOT).with_suffix("").as_posix() for p in execute_notebooks.book_notebooks()}
    assert listed == {f for f in toc_files() if (ROOT / f"{f}.ipynb").is_file()} and len(listed) > 40


def test_an_executed_notebook_is_found_by_the_builds_lookup(tmp_path):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("print(6 * 7)")]
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)
    _, text, _, err = execute_notebooks._execute((str(path), 60))
    assert err is None and "42" in text
    cache = get_cache(str(tmp_path / "cache"))
    record = cache.add_nb_to_project(str(path))
    cache.cache_notebook_bundle(CacheBundleIn(nbformat.reads(text, as_version=4), record.uri), check_validity=False)
    # myst-nb matches the notebook as read from disk, outputs and all, against the cache
    match = cache.match_cache_notebook(nbformat.read(path, as_version=4))
    assert match is not None
    _, merged = cache.merge_match_into_notebook(nbformat.read(path, as_version=4))
    assert "42" in merged.cells[1].outputs[0]["text"]

    failing = tmp_path / "bad.ipynb"
    nb.cells = [nbformat.v4.new_code_cell("raise ValueError('no')")]
    nbformat.write(nb, failing)
    _, text, _, err = execute_notebooks._execute((str(failing), 60))
    assert text is None and "ValueError" in err  # reported, never cached
