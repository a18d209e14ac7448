"""Execute the book's notebooks into its execution cache, several at a time.

Jupyter Book executes each page's notebook one after another as it reads the page (``execute:
cache``), on one kernel. Run first, this script fills the same cache (``_build/.jupyter_cache``,
jupyter-cache's format, keyed by the hash of the code cells) with ``--jobs`` kernels at once, each
on one intra-op thread; the build then finds every notebook executed. A notebook that is
already cached is skipped. A notebook that fails is left out of the cache and reported: the
build executes it again and fails on it with the full traceback, so this step never hides an
error. Usage: ``python scripts/execute_notebooks.py [--jobs N]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

import nbformat
import yaml
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn
from jupyter_cache.executors.utils import single_nb_execution
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "_build" / ".jupyter_cache"
sys.path.insert(0, str(ROOT / "tests"))
from conftest import toc_files  # noqa: E402  (the tests' reading of _toc.yml, shared)


def book_notebooks() -> list[Path]:
    """The notebooks that _toc.yml puts in the book."""
    return [ROOT / f"{f}.ipynb" for f in toc_files() if (ROOT / f"{f}.ipynb").is_file()]


def _execute(args: tuple[str, int]) -> tuple[str, str | None, float, str | None]:
    """Run one notebook in its own directory; returns (path, executed notebook as JSON or None, seconds, error)."""
    path, timeout = args
    nb = nbformat.read(path, as_version=4)
    result = single_nb_execution(nb, cwd=str(Path(path).parent), timeout=timeout, allow_errors=False, meta_override=True)
    if result.err is not None:
        return path, None, result.time, f"{type(result.err).__name__}: {str(result.err).splitlines()[-1][:300]}"
    return path, nbformat.writes(nb), result.time, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="notebooks run at once (default: the CPU count)")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    timeout = config.get("execute", {}).get("timeout", 300)
    cache = get_cache(str(CACHE))
    todo = []
    for path in book_notebooks():
        try:
            cache.match_cache_notebook(nbformat.read(path, as_version=4))
        except KeyError:
            todo.append(path)
    if not todo:
        print("every notebook of the book is in the execution cache")
        return 0
    # The largest first, so that a long notebook does not start last (file size stands in for run time).
    todo.sort(key=lambda p: p.stat().st_size, reverse=True)
    os.environ["OMP_NUM_THREADS"] = "1"  # the kernels inherit it: one intra-op thread each, as many kernels as cores
    failed = []
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(min(args.jobs, len(todo))) as pool:
        runs = pool.imap_unordered(_execute, [(str(p), timeout) for p in todo])
        for path, text, seconds, err in tqdm(runs, total=len(todo), desc="executing notebooks", unit="nb"):
            name = Path(path).relative_to(ROOT)
            if err is not None:
                failed.append(name)
                tqdm.write(f"{name} failed after {seconds:.0f} s ({err}); the build will run it again and report it")
                continue
            record = cache.add_nb_to_project(path)
            bundle = CacheBundleIn(nbformat.reads(text, as_version=4), record.uri, data={"execution_seconds": seconds})
            cache.cache_notebook_bundle(bundle, check_validity=False, overwrite=True)
    print(f"executed {len(todo) - len(failed)} of {len(todo)} notebooks in {time.perf_counter() - start:.0f} s"
          f" with {args.jobs} at a time" + (f"; failed: {', '.join(map(str, failed))}" if failed else ""))
    return 0  # the build reports failures


if __name__ == "__main__":
    sys.exit(main())
