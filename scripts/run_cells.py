"""Run the code cells of notebooks as plain Python, top to bottom, one namespace per
notebook: for machines without Jupyter (such as a bare GPU box), where the GPU branches
of the chapters should still be exercised. Usage: python scripts/run_cells.py NB.ipynb ...
Exit status 1 if any cell raised (cells marked NBVAL_RAISES_EXCEPTION are expected to)."""

from __future__ import annotations

import json
import linecache
import sys
import time
import traceback


def run(path: str) -> bool:
    cells = [c for c in json.load(open(path))["cells"] if c["cell_type"] == "code"]
    namespace: dict = {"__name__": "__main__", "display": lambda *a, **k: None}
    ok = True
    start = time.perf_counter()
    for i, cell in enumerate(cells):
        source = "".join(cell["source"])
        expect_error = "NBVAL_RAISES_EXCEPTION" in source
        lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
        code, filename = "\n".join(lines) + "\n", f"<{path}:cell{i}>"
        # Triton reads a kernel's source through linecache, as it does for IPython cells.
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            exec(compile(code, filename, "exec"), namespace)
            if expect_error:
                print(f"  cell {i}: expected an exception, none raised")
                ok = False
        except Exception:
            if not expect_error:
                print(f"  cell {i} failed:\n{traceback.format_exc(limit=3)}")
                ok = False
    print(f"{'ok  ' if ok else 'FAIL'} {path} ({len(cells)} code cells, {time.perf_counter() - start:.1f} s)")
    return ok


if __name__ == "__main__":
    results = [run(p) for p in sys.argv[1:]]
    sys.exit(0 if all(results) else 1)
