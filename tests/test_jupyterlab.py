"""The notebooks as a reader opens them in JupyterLab (and, by the same markup, in Colab),
checked in a real headless browser (Debian's Chromium + Playwright).

Starts JupyterLab from this environment on 127.0.0.1 over a copy of the book's notebooks
(so that nothing it does can touch the repository), opens every notebook of ``_toc.yml``
and checks what the rendered markdown shows: every markdown cell rendered, every answer and
solution (an HTML ``<details>`` block) present and closed, no MyST markup left as literal
text (JupyterLab does not render MyST roles or directives), math typeset, and every relative
link pointing at a file of the book.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import NOTEBOOK_DIRS, ROOT, chromium, toc_files

pytestmark = pytest.mark.browser

TOKEN = "llmnote-test"
# User settings: render every cell (JupyterLab otherwise renders only the cells in view),
# never autosave, never fetch news or check for updates (no request leaves the machine).
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
}
MYST_LEFTOVERS = re.compile(r"\{(admonition|doc|ref|note|warning|term|numref|math|eq)\}|:class:|^:::", re.M)
# The notebook in view (JupyterLab keeps other documents' panels in the DOM, hidden).
PANEL = "document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)')"
UNRENDERED_MATH = re.compile(r"\$[^$\s][^$]*\$")


def toc_notebooks() -> list[str]:
    return [f"{f}.ipynb" for f in toc_files() if (ROOT / f"{f}.ipynb").is_file()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab_url(tmp_path_factory) -> Iterator[str]:
    """JupyterLab serving a copy of chapters/ and labs/."""
    if shutil.which("jupyter-lab", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("JupyterLab is not installed in this environment (it is in requirements.txt: run `make venv`)")
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "book"
    for d in NOTEBOOK_DIRS:
        shutil.copytree(ROOT / d, root / d, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    for name, values in SETTINGS.items():
        path = base / "settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port = _free_port()
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(base / "settings"), "JUPYTER_RUNTIME_DIR": str(base / "runtime")}
    cmd = [
        str(Path(sys.executable).parent / "jupyter-lab"),
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={TOKEN}",
        f"--ServerApp.root_dir={root}",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = (base / "jupyterlab.log").open("w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=5)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start: {(base / 'jupyterlab.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def lab_browser():
    """One Chromium context for every notebook, so JupyterLab's bundles are fetched once."""
    with chromium() as browser:
        yield browser.new_context(viewport={"width": 1280, "height": 900})


def _rendered(page, n_markdown: int, n_details: int) -> dict:
    """Wait until the markdown cells hold their rendered content and MathJax is done, then read them."""
    ready = (
        f"() => {{ const p = {PANEL}; if (!p) return false;"
        f" const md = [...p.querySelectorAll('.jp-MarkdownCell .jp-RenderedMarkdown')];"
        f" return md.length >= {n_markdown} && md.every(e => e.childElementCount > 0)"
        f" && p.querySelectorAll('details').length >= {n_details}; }}"
    )
    try:
        page.wait_for_function(ready, timeout=90_000)
    except Exception:
        pass  # the assertions below say what is missing
    page.wait_for_timeout(1500)  # MathJax typesets after the markdown is in the DOM
    return page.evaluate(
        """() => {
            const panel = """
        + PANEL
        + """;
            const cells = [...panel.querySelectorAll('.jp-MarkdownCell .jp-RenderedMarkdown')];
            const text = (el) => {
                const copy = el.cloneNode(true);
                copy.querySelectorAll('code, pre, mjx-container').forEach(c => c.remove());
                copy.querySelectorAll('details').forEach(d => d.setAttribute('open', ''));
                return copy.innerText;
            };
            return {
                texts: cells.map(text),
                details: cells.reduce((n, c) => n + c.querySelectorAll('details').length, 0),
                open: cells.reduce((n, c) => n + c.querySelectorAll('details[open]').length, 0),
                summaries: cells.reduce((n, c) => n + c.querySelectorAll('details > summary').length, 0),
                math: panel.querySelectorAll('.jp-RenderedMarkdown mjx-container').length,
                links: [...panel.querySelectorAll('.jp-RenderedMarkdown a[href]')].map(a => a.getAttribute('href')),
            };
        }"""
    )


@pytest.mark.parametrize("notebook", toc_notebooks())
def test_notebook_in_jupyterlab(notebook: str, lab_url: str, lab_browser) -> None:
    cells = json.loads((ROOT / notebook).read_text())["cells"]
    markdown = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    n_details = sum(m.count("<details>") for m in markdown)
    has_math = any(UNRENDERED_MATH.search(m) or "$$" in m for m in markdown)

    page = lab_browser.new_page()
    try:
        page.goto(f"{lab_url}/lab/tree/{notebook}?reset&token={TOKEN}")  # reset: a fresh workspace
        seen = _rendered(page, len(markdown), n_details)
    finally:
        page.close()

    assert seen["details"] == n_details, f"{notebook}: {n_details} <details> blocks in the source, {seen['details']} rendered"
    assert seen["summaries"] == n_details, f"{notebook}: a <details> block without its <summary>"
    assert seen["open"] == 0, f"{notebook}: {seen['open']} answer/solution blocks are open when the notebook opens"
    leftovers = [m.group(0) for t in seen["texts"] for m in MYST_LEFTOVERS.finditer(t)]
    assert not leftovers, f"{notebook}: MyST markup shown as text in JupyterLab: {sorted(set(leftovers))}"
    raw_math = [m.group(0)[:60] for t in seen["texts"] for m in UNRENDERED_MATH.finditer(t)]
    assert not raw_math, f"{notebook}: math left untypeset: {raw_math[:5]}"
    if has_math:
        assert seen["math"] > 0, f"{notebook}: has math but MathJax typeset nothing"
    here = (ROOT / notebook).parent
    broken = []
    for href in seen["links"]:
        target = href.split("#")[0]
        if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):  # in-page anchors and absolute URLs
            continue
        if not (here / target).exists():
            broken.append(href)
    assert not broken, f"{notebook}: relative links to missing files: {broken}"
