"""``llmnote.show(obj)``: print the highlighted source of a function or class, so that a
notebook explains the code the package really runs (one source of truth)."""

from __future__ import annotations

import inspect
import textwrap

from pygments import highlight
from pygments.formatters import HtmlFormatter, TerminalFormatter
from pygments.lexers import PythonLexer

__all__ = ["show", "source_of"]


def source_of(obj: object) -> str:
    """The dedented source of a function, class, method or module."""
    target = getattr(obj, "fn", obj)  # a @triton.jit kernel keeps the Python function in .fn
    try:
        return textwrap.dedent(inspect.getsource(target))
    except (TypeError, OSError) as err:
        raise TypeError(f"cannot show the source of {obj!r}: {err}") from None


class _Source:
    """Displays as highlighted HTML in Jupyter (website, JupyterLab, Colab), ANSI text elsewhere."""

    def __init__(self, code: str, title: str):
        self.code, self.title = code, title

    def _repr_html_(self) -> str:
        body = highlight(self.code, PythonLexer(), HtmlFormatter(noclasses=True, style="friendly", nobackground=False))
        return f'<div class="llmnote-source"><div style="font-size:0.8em;color:#666">{self.title}</div>{body}</div>'

    def __repr__(self) -> str:
        return f"# {self.title}\n{highlight(self.code, PythonLexer(), TerminalFormatter())}"


def show(obj: object):
    """Return a displayable view of ``obj``'s source; the last line of a cell shows it."""
    if inspect.ismodule(obj):
        return _Source(source_of(obj), obj.__name__)
    module = getattr(inspect.getmodule(getattr(obj, "fn", obj)), "__name__", "")
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", type(obj).__name__))
    return _Source(source_of(obj), f"{module}.{name}" if module else name)
