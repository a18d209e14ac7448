"""Keep the llmnote website self-contained: no page loads anything from another host.

Three small jobs:

1. Plotly's ``notebook`` renderer puts a ``<script src="https://cdnjs.../mathjax/...">``
   tag before every figure (it wants MathJax for LaTeX in labels). The page already loads
   the vendored MathJax, so the CDN tag is dropped from the notebook outputs.
2. After the build, every HTML page is scanned; a ``<script src>`` or stylesheet
   ``<link href>`` that points off-site is reported as a warning, which fails the build
   (the book is built with ``-W``).
3. Inline scripts that extensions register while reading (sphinx-thebe,
   sphinx-togglebutton) end up twice on each page under Sphinx 7.4 (once with filename
   None, once with ""); a doubled ``const`` is a script error, so each page's script list
   is de-duplicated.
"""

from __future__ import annotations

import re
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

PLOTLY_CDN_MATHJAX = re.compile(r'<script src="https://[^"]*/mathjax/[^"]*"></script>')
OFF_SITE_SCRIPT = re.compile(r'<script[^>]*\ssrc="(?:https?:)?//[^"]*"', re.IGNORECASE)
OFF_SITE_STYLESHEET = re.compile(r'<link[^>]*rel="stylesheet"[^>]*href="(?:https?:)?//[^"]*"', re.IGNORECASE)


def drop_cdn_mathjax(app: Sphinx, doctree: nodes.document) -> None:
    """Remove plotly's CDN MathJax tag from raw HTML outputs."""
    for node in list(doctree.findall(nodes.raw)):
        if "html" in node.get("format", "").split() and PLOTLY_CDN_MATHJAX.search(node.astext()):
            text = PLOTLY_CDN_MATHJAX.sub("", node.astext())
            node.replace_self(nodes.raw(text, text, format=node["format"]))


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
    """Warn about any page that would load a script or stylesheet from another host."""
    if exception is not None or app.builder.format != "html":
        return
    for page in sorted(Path(app.outdir).rglob("*.html")):
        html = page.read_text(encoding="utf-8")
        for match in [*OFF_SITE_SCRIPT.finditer(html), *OFF_SITE_STYLESHEET.finditer(html)]:
            where = page.relative_to(app.outdir).as_posix()
            logger.warning("%s loads an off-site asset: %s", where, match.group(0)[:160])


def setup(app: Sphinx) -> dict:
    app.connect("doctree-read", drop_cdn_mathjax)
    app.connect("html-page-context", dedupe_scripts, priority=900)
    app.connect("build-finished", report_off_site_assets)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
