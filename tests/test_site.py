"""The built website, checked in a real headless browser (Debian's Chromium + Playwright).

Serves ``_build/html`` on 127.0.0.1 and opens the landing page and every page of
``_toc.yml`` at 1280 px wide. On each page: nothing is requested from another host, nothing
fails to load, no script errors, the page's own bytes stay under a budget (plotly.js is
served once for the whole site, never inlined), every plotly figure is drawn, no figure
has text that overlaps other text or sticks out of the figure, no table runs out of the
text column, math is typeset by the vendored MathJax, and ipywidgets render. On the
animated pages the first figure's Play button animates it, every dropdown menu changes
its figure, and no slider step or menu choice makes texts collide. A full-page screenshot
of each page goes to ``tests/screenshots/``.

Needs ``make book`` first (``make test`` does it).
"""

from __future__ import annotations

import functools
import http.server
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from conftest import ROOT, chromium, toc_files

pytestmark = pytest.mark.browser

SITE = ROOT / "_build" / "html"
SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
# Pages whose widgets must respond: the first figure with a Play button on each, and every
# figure with a dropdown menu.
ANIMATED_PAGES = ("chapters/01_gpu/03_memory_hierarchy.html", "chapters/01_gpu/04_roofline.html")
RENDER_TIMEOUT_MS = 30_000
VIEWPORT = {"width": 1280, "height": 900}
# A page's own bytes: its HTML and every file it loads from outside _static/. The files
# under _static/ (theme, MathJax, require.js, the widget embedder, plotly.js) are the same
# URLs on every page, so a reader's browser fetches them once for the whole site.
SHARED_PREFIX = "/_static/"
PAGE_BUDGET_BYTES = 4_000_000
PLOTLY_JS = "/_static/plotly.min.js"
PLOTLY_BANNER = "* plotly.js v"  # the opening comment of the library: only in plotly.min.js
# Two texts may touch: their boxes may overlap by this many pixels in either direction.
TEXT_OVERLAP_TOLERANCE_PX = 2


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
    with chromium() as browser:
        yield browser


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


def served_file(url: str) -> Path | None:
    """The file of the built site that a 127.0.0.1 URL serves (None for other URLs)."""
    parts = urlsplit(url)
    if parts.hostname != "127.0.0.1":
        return None
    path = SITE / unquote(parts.path).lstrip("/")
    return path / "index.html" if path.is_dir() else path


def page_weight(requests: list[str]) -> tuple[int, int, list[tuple[int, str]]]:
    """``(own bytes, shared bytes, the five largest own files)`` of the files a page loaded."""
    own, shared, sizes = 0, 0, []
    for url in sorted(set(requests)):
        path = served_file(url)
        if path is None or not path.is_file():
            continue
        size = path.stat().st_size
        if urlsplit(url).path.startswith(SHARED_PREFIX):
            shared += size
        else:
            own += size
            sizes.append((size, urlsplit(url).path))
    return own, shared, sorted(sizes, reverse=True)[:5]


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
    """A figure's state: active slider steps and menu items, and what its traces show."""
    return page.evaluate(
        """(i) => {
            const gd = document.querySelectorAll('.js-plotly-plot')[i];
            const layout = gd._fullLayout || {};
            return JSON.stringify({
                active: (layout.sliders || []).map(s => s.active),
                menus: (layout.updatemenus || []).map(m => m.active),
                data: gd.data.map(t => [t.x, t.y, t.z, t.visible, t.opacity, t.selectedpoints]),
            });
        }""",
        index,
    )


# Text elements of each plotly figure, except hover labels and the items of a closed
# dropdown, that are visible: not display:none, not transparent (the roofline explorer
# hides the traces of the formats not chosen with opacity 0). For each, its text, the
# kind of element (CSS class of the text or of the nearest group that has one: gtitle,
# xtitle, legendtext, annotation-text, slider-label, xtick, bartext, ...) and the four
# corners of its box on the page (rotated with the text: slanted tick labels stay slanted).
FIGURE_TEXTS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(gd => {
    const box = gd.getBoundingClientRect();
    const texts = [];
    for (const el of gd.querySelectorAll('text')) {
        if (el.closest('.hoverlayer, .updatemenu-dropdown-button-group')) continue;
        const label = el.textContent.trim();
        if (!label) continue;
        let opacity = 1, shown = true;
        for (let n = el; n && n !== gd; n = n.parentElement) {
            const style = getComputedStyle(n);
            if (style.display === 'none' || style.visibility === 'hidden') { shown = false; break; }
            opacity *= parseFloat(style.opacity);
        }
        const fill = getComputedStyle(el);
        if (!shown || opacity < 0.05 || parseFloat(fill.fillOpacity) < 0.05 || /rgba\\(.*,\\s*0\\)$/.test(fill.fill)) continue;
        const b = el.getBBox(), m = el.getScreenCTM();
        if (b.width < 1 || b.height < 1 || !m) continue;
        const corners = [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height], [b.x, b.y + b.height]]
            .map(([x, y]) => { const q = new DOMPoint(x, y).matrixTransform(m); return [q.x, q.y]; });
        let kind = el.getAttribute('class');
        for (let n = el.parentElement; !kind && n && n !== gd; n = n.parentElement) kind = n.getAttribute('class');
        texts.push({label: label.slice(0, 60), kind: (kind || 'text').split(' ')[0], corners});
    }
    return {box: {left: box.left, right: box.right, top: box.top, bottom: box.bottom}, texts};
})"""


def _shrunk(corners: list[list[float]], by: float) -> list[tuple[float, float]]:
    """The rectangle ``corners`` (in order around it) moved inwards by ``by`` on every side."""
    (x0, y0), (x1, y1), _, (x3, y3) = corners
    u, v = (x1 - x0, y1 - y0), (x3 - x0, y3 - y0)
    lu, lv = max(math.hypot(*u), 1e-9), max(math.hypot(*v), 1e-9)
    du, dv = (u[0] / lu * by, u[1] / lu * by), (v[0] / lv * by, v[1] / lv * by)
    signs = ((1, 1), (-1, 1), (-1, -1), (1, -1))
    return [(x + su * du[0] + sv * dv[0], y + su * du[1] + sv * dv[1]) for (x, y), (su, sv) in zip(corners, signs)]


def _rectangles_overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    """Whether two (possibly rotated) rectangles overlap: no edge normal separates them."""
    for rect in (a, b):
        for (x0, y0), (x1, y1) in zip(rect, rect[1:] + rect[:1]):
            normal = (y0 - y1, x1 - x0)
            pa = [normal[0] * x + normal[1] * y for x, y in a]
            pb = [normal[0] * x + normal[1] * y for x, y in b]
            if max(pa) <= min(pb) or max(pb) <= min(pa):
                return False
    return True


def figure_text_problems(figure: dict, index: int, tolerance: float = TEXT_OVERLAP_TOLERANCE_PX) -> list[str]:
    """Texts of a figure (one item of ``FIGURE_TEXTS_JS``, the page's figure ``index``)
    that stick out of it, and pairs of its texts that overlap by more than ``tolerance`` px."""
    problems = []
    box, texts = figure["box"], figure["texts"]
    for t in texts:
        xs, ys = [c[0] for c in t["corners"]], [c[1] for c in t["corners"]]
        out = {"left": box["left"] - min(xs), "right": max(xs) - box["right"]}
        out |= {"top": box["top"] - min(ys), "bottom": max(ys) - box["bottom"]}
        sides = [f"{side} by {px:.0f} px" for side, px in out.items() if px > tolerance]
        if sides:
            problems.append(f"figure {index}: {t['kind']} {t['label']!r} sticks out of the figure ({', '.join(sides)})")
    inner = [_shrunk(t["corners"], tolerance / 2) for t in texts]
    for i, a in enumerate(texts):
        for j in range(i + 1, len(texts)):
            if _rectangles_overlap(inner[i], inner[j]):
                b = texts[j]
                at = ", ".join(f"({x:.0f}, {y:.0f})" for x, y in (a["corners"][0], b["corners"][0]))
                problems.append(f"figure {index}: {a['kind']} {a['label']!r} overlaps {b['kind']} {b['label']!r} (at {at})")
    return problems


# Tables of the article that are wider than the text column and cannot scroll sideways
# (no ancestor with overflow-x auto/scroll below the article), or that a container with
# overflow hidden cuts off.
CLIPPED_TABLES_JS = """() => {
    const article = document.querySelector('article.bd-article');
    if (!article) return [];
    const limit = article.getBoundingClientRect().right;
    const problems = [];
    [...article.querySelectorAll('table')].forEach((table, i) => {
        const heads = [...table.querySelectorAll('th')].slice(0, 3).map(th => th.textContent.trim()).join(' | ');
        const name = `table ${i} (${heads.slice(0, 80) || 'no header'})`;
        for (let n = table.parentElement; n && n !== article; n = n.parentElement) {
            const overflow = getComputedStyle(n).overflowX;
            if (overflow === 'auto' || overflow === 'scroll') return;
            if ((overflow === 'hidden' || overflow === 'clip') && n.scrollWidth > n.clientWidth + 1) {
                problems.push(`${name} is cut off: ${n.scrollWidth} px wide in a ${n.clientWidth} px box`
                              + ` with overflow ${overflow}`);
                return;
            }
        }
        const right = table.getBoundingClientRect().right;
        if (right > limit + 1) {
            problems.push(`${name} runs ${Math.round(right - limit)} px past the text column and cannot scroll`);
        }
    });
    return problems;
}"""


def text_problems_of(page, index: int, state: str) -> list[str]:
    """``figure_text_problems`` of figure ``index`` alone, each message saying in which state."""
    return [f"{p} {state}" for p in figure_text_problems(page.evaluate(FIGURE_TEXTS_JS)[index], index)]


def slider_problems(page, path: str) -> list[str]:
    """Step every slider of the page's figures through all its steps (as a click on the
    step would, with no transition), checking the figure's texts at each step."""
    problems = []
    for index in range(page.locator(".js-plotly-plot").count()):
        n_sliders = page.evaluate("(i) => (document.querySelectorAll('.js-plotly-plot')[i].layout.sliders || []).length", index)
        for s in range(n_sliders):
            labels = page.evaluate(
                "([i, s]) => document.querySelectorAll('.js-plotly-plot')[i].layout.sliders[s].steps.map(t => t.label)",
                [index, s],
            )
            for k in [*range(1, len(labels)), 0]:
                page.evaluate(
                    """([i, s, k]) => {
                        const gd = document.querySelectorAll('.js-plotly-plot')[i];
                        const step = gd.layout.sliders[s].steps[k];
                        return Promise.resolve(step.method === 'skip' || Plotly[step.method](gd, ...step.args))
                            .then(() => Plotly.relayout(gd, {[`sliders[${s}].active`]: k}));
                    }""",
                    [index, s, k],
                )
                problems += [f"{path}: {p}" for p in text_problems_of(page, index, f"(slider {s} at {labels[k]!r})")]
    return problems


def menu_problems(page, path: str) -> list[str]:
    """Pick every item of every dropdown menu of the page's figures with a click (the item
    shown first last): name the picks that leave their figure unchanged, and check the
    figure's texts after each."""
    problems = []
    figures = page.locator(".js-plotly-plot")
    for index in range(figures.count()):
        figure = figures.nth(index)
        headers = figure.locator("g.updatemenu-header")
        for m in range(headers.count()):
            n_items, active = page.evaluate(
                """([i, m]) => {
                    const menu = document.querySelectorAll('.js-plotly-plot')[i]._fullLayout.updatemenus
                        .filter(u => u.type === 'dropdown')[m];
                    return [menu.buttons.length, menu.active];
                }""",
                [index, m],
            )
            for item in [*(i for i in range(n_items) if i != active), active]:
                before = frame_state(page, index)
                headers.nth(m).scroll_into_view_if_needed()
                headers.nth(m).click()
                option = figure.locator("g.updatemenu-dropdown-button").nth(item)
                label = option.text_content()
                option.click()
                page.wait_for_timeout(200)
                if frame_state(page, index) == before:
                    problems.append(f"{path}: figure {index}, menu {m}: choosing {label!r} did not change the figure")
                problems += [f"{path}: {p}" for p in text_problems_of(page, index, f"(menu {m} at {label!r})")]
    return problems


@pytest.mark.parametrize("path", toc_pages())
def test_page(path: str, site_url: str, browser) -> None:
    html = (SITE / path).read_text(encoding="utf-8")
    n_plots = html.count('class="plotly-graph-div"')
    has_math = 'class="math notranslate' in html
    n_widget_views = html.count('type="application/vnd.jupyter.widget-view+json"')
    problems: list[str] = []

    page = browser.new_page(viewport=VIEWPORT)
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
                pass  # the check below says what is missing
            drawn = count_rendered_plots(page)
            if drawn != n_plots:
                problems.append(f"{path}: {n_plots} plotly outputs, {drawn} drawn")
            for index, figure in enumerate(page.evaluate(FIGURE_TEXTS_JS)):
                problems += [f"{path}: {p}" for p in figure_text_problems(figure, index)]
        problems += [f"{path}: {p}" for p in page.evaluate(CLIPPED_TABLES_JS)]

        if has_math:
            page.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
            if page.locator("mjx-container").count() == 0:
                problems.append(f"{path}: has math but MathJax typeset nothing")

        if n_widget_views:
            try:
                page.wait_for_selector(".widget-subarea .jupyter-widgets", timeout=RENDER_TIMEOUT_MS)
            except Exception:
                pass
            rendered = page.locator(".widget-subarea > .jupyter-widgets").count()
            if rendered < n_widget_views:
                problems.append(f"{path}: {n_widget_views} widget views, {rendered} rendered")

        if path in ANIMATED_PAGES:
            # Sliders and menus first: pressing Play starts an animation that a later
            # slider step would interrupt (plotly.js then rejects the Play promise).
            problems += slider_problems(page, path) + menu_problems(page, path)
            index = first_animated_plot(page)
            if index < 0:
                problems.append(f"{path}: no figure with a Play button")
            else:
                figure = page.locator(".js-plotly-plot").nth(index)
                figure.scroll_into_view_if_needed()
                before = frame_state(page, index)
                figure.locator("g.updatemenu-button").filter(has_text="Play").first.click()
                page.wait_for_timeout(1500)
                if frame_state(page, index) == before:
                    problems.append(f"{path}: pressing Play did not change figure {index}'s frame")

        page.wait_for_load_state("networkidle")
        SCREENSHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / (path.replace("/", "__").removesuffix(".html") + ".png")), full_page=True)
    finally:
        page.close()

    outside = sorted({url for url in log.requests if off_site(url)})
    if outside:
        problems.append(f"{path}: requests leaving 127.0.0.1: {outside}")
    if log.failures:
        problems.append(f"{path}: failed loads: {log.failures}")
    if log.errors:
        problems.append(f"{path}: script errors: {log.errors}")

    own, shared, largest = page_weight(log.requests)
    if own >= PAGE_BUDGET_BYTES:
        listing = ", ".join(f"{name} {size / 1e6:.2f} MB" for size, name in largest)
        problems.append(
            f"{path}: the page's own files weigh {own / 1e6:.2f} MB (budget {PAGE_BUDGET_BYTES / 1e6:.0f} MB,"
            f" plus {shared / 1e6:.2f} MB of shared _static/ files); largest: {listing}"
        )
    if PLOTLY_BANNER in html:
        problems.append(f"{path}: the HTML carries its own copy of plotly.js (load {PLOTLY_JS} instead)")
    plotly_js = {urlsplit(url).path for url in log.requests if urlsplit(url).path.endswith("plotly.min.js")}
    if n_plots and plotly_js != {PLOTLY_JS}:
        problems.append(f"{path}: has {n_plots} plotly figures but loads plotly.js from {sorted(plotly_js) or 'nowhere'}")

    assert not problems, "\n".join(problems)
