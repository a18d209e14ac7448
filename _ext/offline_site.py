"""Keep the llmnote website self-contained and light: no page loads anything from another
host, and plotly.js is served once for the whole site.

The jobs:

1. Plotly's ``notebook`` renderer puts a ``<script src="https://cdnjs.../mathjax/...">``
   tag before every figure (it wants MathJax for LaTeX in labels). The page already loads
   the vendored MathJax, so the CDN tag is dropped from the notebook outputs.
2. The same renderer inlines the whole plotly.js bundle (about 4.8 MB) into the first
   figure output of every notebook. That ``<script>`` is dropped from the outputs, and a
   page that holds a figure loads the vendored ``_static/plotly.min.js`` instead (one file
   for the whole site, cached by the browser), in ``<head>`` and before require.js, so that
   ``window.Plotly`` exists when the figures' inline scripts run and plotly.js never meets
   an AMD ``define``.
3. After the build, every HTML page is scanned; a ``<script src>`` or stylesheet
   ``<link href>`` that points off-site, or an inlined copy of plotly.js, is reported as a
   warning, which fails the build (the book is built with ``-W``).
4. Inline scripts that extensions register while reading (sphinx-thebe,
   sphinx-togglebutton) end up twice on each page under Sphinx 7.4 (once with filename
   None, once with ""); a doubled ``const`` is a script error, so each page's script list
   is de-duplicated.
5. The site serves plotly's cartesian bundle, which draws the trace types in
   ``CARTESIAN_TRACES``; a figure with another trace type is reported as a warning (it
   would not draw).
6. The site's own stylesheet, ``static/llmnote.css`` beside this file (answer boxes, wide
   tables), is served with every page.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

PLOTLY_CDN_MATHJAX = re.compile(r'<script src="https://[^"]*/mathjax/[^"]*"></script>')
# The <script> that holds plotly.js itself: its source opens with the bundle's banner.
INLINE_PLOTLY_JS = re.compile(r"<script[^>]*>\s*/\*\*?\s*\*\s*plotly\.js v\d[\s\S]*?</script>")
PLOTLY_FIGURE = 'class="plotly-graph-div"'
# The trace types of plotly.js's "cartesian" partial bundle, and where a figure's data begins.
CARTESIAN_TRACES = {"bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour", "image", "pie",
                    "scatter", "scatterternary", "violin"}  # fmt: skip
NEW_PLOT = re.compile(r'Plotly\.newPlot\(\s*"[^"]*",\s*')
# What plotly's renderer sets before it loads the library: MathJax is the page's own.
PLOTLY_CONFIG = "window.PlotlyConfig = {MathJaxConfig: 'local'};"
STATIC = Path(__file__).resolve().parent / "static"
OFF_SITE_SCRIPT = re.compile(r'<script[^>]*\ssrc="(?:https?:)?//[^"]*"', re.IGNORECASE)
OFF_SITE_STYLESHEET = re.compile(r'<link[^>]*rel="stylesheet"[^>]*href="(?:https?:)?//[^"]*"', re.IGNORECASE)


def drop_cdn_mathjax_and_plotly_js(app: Sphinx, doctree: nodes.document) -> None:
    """Remove plotly's CDN MathJax tag and its inlined plotly.js from raw HTML outputs."""
    for node in list(doctree.findall(nodes.raw)):
        if "html" not in node.get("format", "").split():
            continue
        html = node.astext()
        text = INLINE_PLOTLY_JS.sub("", PLOTLY_CDN_MATHJAX.sub("", html))
        if text != html:
            node.replace_self(nodes.raw(text, text, format=node["format"]))


def add_plotly_js(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Load the vendored plotly.js on pages that hold a plotly figure, before require.js
    (priority 500) so that it defines ``window.Plotly`` rather than an AMD module."""
    if doctree is not None and PLOTLY_FIGURE in context.get("body", ""):
        app.add_js_file(None, body=PLOTLY_CONFIG, priority=390)
        app.add_js_file("plotly.min.js", priority=400)


def add_static_files(app: Sphinx, config) -> None:
    """Serve ``static/`` beside this file under ``_static/`` (not a root ``_static`` folder,
    whose scripts Jupyter Book 1 would put on every page)."""
    config.html_static_path.append(str(STATIC))


def dedupe_scripts(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Keep the first of identical script entries of a page (same file, same attributes)."""
    seen, unique = set(), []
    for script in context.get("script_files", []):
        # An inline script has filename None or "" depending on how it was registered.
        key = (getattr(script, "filename", script) or "", tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"][:] = unique


def report_off_site_assets(app: Sphinx, exception: Exception | None) -> None:
    """Warn about any page that would load a script or stylesheet from another host, or
    that carries its own copy of plotly.js."""
    if exception is not None or app.builder.format != "html":
        return
    for page in sorted(Path(app.outdir).rglob("*.html")):
        html = page.read_text(encoding="utf-8")
        where = page.relative_to(app.outdir).as_posix()
        for match in [*OFF_SITE_SCRIPT.finditer(html), *OFF_SITE_STYLESHEET.finditer(html)]:
            logger.warning("%s loads an off-site asset: %s", where, match.group(0)[:160])
        if INLINE_PLOTLY_JS.search(html):
            logger.warning("%s inlines plotly.js (the site serves _static/plotly.min.js)", where)
        for kind in sorted(trace_types(html) - CARTESIAN_TRACES):
            logger.warning("%s draws a %r trace, which the site's plotly.js (cartesian bundle) lacks", where, kind)


def trace_types(html: str) -> set[str]:
    """The trace types of every plotly figure in a page (the data of each ``Plotly.newPlot``)."""
    decoder, kinds = json.JSONDecoder(), set()
    for match in NEW_PLOT.finditer(html):
        data, _ = decoder.raw_decode(html, match.end())
        kinds.update(trace.get("type", "scatter") for trace in data)
    return kinds


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", add_static_files)
    app.add_css_file("llmnote.css")
    app.connect("doctree-read", drop_cdn_mathjax_and_plotly_js)
    app.connect("html-page-context", add_plotly_js)
    app.connect("html-page-context", dedupe_scripts, priority=900)
    app.connect("build-finished", report_off_site_assets)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
