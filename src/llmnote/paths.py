"""Where the book's data lives: the repository's ``assets/`` in a checkout, or the copy
packed into the wheel when ``llmnote`` was installed from git (Colab)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["assets_dir", "benchmarks_dir", "models_dir", "repo_root"]

_PACKAGE = Path(__file__).resolve().parent


def repo_root() -> Path | None:
    """The checkout that holds this package (``src/llmnote``), or None for a wheel install."""
    root = _PACKAGE.parent.parent
    return root if (root / "assets").is_dir() and (root / "src").is_dir() else None


def assets_dir() -> Path:
    root = repo_root()
    return root / "assets" if root is not None else _PACKAGE / "_assets"


def benchmarks_dir() -> Path:
    """Folder of recorded benchmark files ``<topic>.json``."""
    return assets_dir() / "benchmarks"


def models_dir() -> Path:
    """Folder of the project's own trained checkpoints (``llmnote-tiny``, ``llmnote-draft``)."""
    return assets_dir() / "models"
