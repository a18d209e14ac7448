"""The built website, checked in a real headless browser (Debian's Chromium + Playwright).

Serves ``_build/html`` on 127.0.0.1 and opens the landing page and every page of
``_toc.yml``. On each page: nothing is requested from another host, nothing fails to
load, no script errors, every plotly figure is drawn, math is typeset by the vendored
MathJax, ipywidgets render, and on the roofline page the first figure's Play button
animates it. A full-page screenshot of each page goes to ``tests/screenshots/``.

Needs ``make book`` first (``make test`` does it).
"""

from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import ROOT, toc_files

pytestmark = pytest.mark.browser

SITE = ROOT / "_build" / "html"
SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
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
# Pages whose widget must animate: the first figure with a Play button on each.
ANIMATED_PAGES = ("chapters/01_gpu/03_memory_hierarchy.html", "chapters/01_gpu/04_roofline.html")
RENDER_TIMEOUT_MS = 30_000


def toc_pages() -> list[str]:
    """The landing page and every file of _toc.yml, as paths of HTML pages."""
    return [f"{Path(f).with_suffix('').as_posix()}.html" for f in toc_files()]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib name)
        pass


@pytest.fixture(scope="module")
def site_url() -> Iterator[str]:
    """Serve the built site on 127.0.0.1 at a free port."""
    if not (SITE / "intro.html").is_file():
        pytest.fail(f"{SITE} has no built site: run `make book` first (`make test` does it).")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium driven by Playwright (never a downloaded browser)."""
    if not CHROMIUM.exists():
        if os.environ.get("LLMNOTE_ALLOW_NO_BROWSER") == "1":
            pytest.skip(f"{CHROMIUM} is missing and LLMNOTE_ALLOW_NO_BROWSER=1")
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (`make test` does it).")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class PageLog:
    """Everything a page did that the checks look at."""

    def __init__(self, page) -> None:
        self.requests: list[str] = []
        self.failures: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("requestfailed", lambda r: self.failures.append(f"{r.url} ({r.failure})"))
        page.on("response", lambda r: r.status >= 400 and self.failures.append(f"{r.url} (HTTP {r.status})"))
        page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text} at {m.location}"))
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))


def off_site(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme not in ("data", "blob", "about") and parts.hostname != "127.0.0.1"


def count_rendered_plots(page) -> int:
    return page.evaluate(
        "() => [...document.querySelectorAll('.js-plotly-plot')].filter(d => d.querySelector('svg.main-svg')).length"
    )


def first_animated_plot(page) -> int:
    """Index (among the page's plotly figures) of the first one with a Play button; -1 if none."""
    return page.evaluate(
        """() => [...document.querySelectorAll('.js-plotly-plot')].findIndex(gd =>
            [...gd.querySelectorAll('g.updatemenu-button')].some(b => b.textContent.trim() === 'Play'))"""
    )


def frame_state(page, index: int) -> str:
    """A figure's animation state: active slider step and the traces' data."""
    return page.evaluate(
        """(i) => {
            const gd = document.querySelectorAll('.js-plotly-plot')[i];
            const sliders = (gd._fullLayout && gd._fullLayout.sliders) || [];
            return JSON.stringify({active: sliders.map(s => s.active), data: gd.data.map(t => [t.x, t.y, t.z])});
        }""",
        index,
    )


@pytest.mark.parametrize("path", toc_pages())
def test_page(path: str, site_url: str, browser) -> None:
    html = (SITE / path).read_text(encoding="utf-8")
    n_plots = html.count('class="plotly-graph-div"')
    has_math = 'class="math notranslate' in html
    n_widget_views = html.count('type="application/vnd.jupyter.widget-view+json"')

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    log = PageLog(page)
    try:
        page.goto(f"{site_url}/{path}", wait_until="load")
        page.wait_for_load_state("networkidle")

        if n_plots:
            try:
                page.wait_for_function(
                    f"() => document.querySelectorAll('.js-plotly-plot svg.main-svg').length >= {n_plots}",
                    timeout=RENDER_TIMEOUT_MS,
                )
            except Exception:
                pass  # the assertion below says what is missing
            assert count_rendered_plots(page) == n_plots, f"{path}: {n_plots} plotly outputs, {count_rendered_plots(page)} drawn"

        if has_math:
            page.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
            assert page.locator("mjx-container").count() > 0, f"{path}: has math but MathJax typeset nothing"

        if n_widget_views:
            try:
                page.wait_for_selector(".widget-subarea .jupyter-widgets", timeout=RENDER_TIMEOUT_MS)
            except Exception:
                pass
            rendered = page.locator(".widget-subarea > .jupyter-widgets").count()
            assert rendered >= n_widget_views, f"{path}: {n_widget_views} widget views, {rendered} rendered"

        if path in ANIMATED_PAGES:
            index = first_animated_plot(page)
            assert index >= 0, f"{path}: no figure with a Play button"
            figure = page.locator(".js-plotly-plot").nth(index)
            figure.scroll_into_view_if_needed()
            before = frame_state(page, index)
            figure.locator("g.updatemenu-button").filter(has_text="Play").first.click()
            page.wait_for_timeout(1500)
            assert frame_state(page, index) != before, f"{path}: pressing Play did not change the figure's frame"

        page.wait_for_load_state("networkidle")
        SCREENSHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / (path.replace("/", "__").removesuffix(".html") + ".png")), full_page=True)
    finally:
        page.close()

    outside = sorted({url for url in log.requests if off_site(url)})
    assert not outside, f"{path}: requests leaving 127.0.0.1: {outside}"
    assert not log.failures, f"{path}: failed loads: {log.failures}"
    assert not log.errors, f"{path}: script errors: {log.errors}"
