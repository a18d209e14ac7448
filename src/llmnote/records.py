"""The benchmark record format (see DESIGN.md): its writer, used by the bench harness, and
its reader, used by the hardware tables, the figures and the chapters.

A record file ``assets/benchmarks/<topic>.json`` is::

    {"meta": {"gpu", "torch", "triton", "date", "command"},
     "rows": [{"kernel", "case", "dtype", "provider", "median_ms", "tflops", "tbps"}]}

Rates that do not apply are ``null``. Only the harness writes these files; ``meta`` may
also hold ``device``, what the driver reported about the GPU, and keys a suite adds through
``Record.extra_meta`` (for example ``gpus``, the number of GPUs a multi-GPU run used). Readers
rely only on the five keys above; a record without extra keys stays valid.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .paths import benchmarks_dir

__all__ = ["META_KEYS", "ROW_KEYS", "Record", "load_record", "record_topics", "validate_record"]

META_KEYS = ("gpu", "torch", "triton", "date", "command")
ROW_KEYS = ("kernel", "case", "dtype", "provider", "median_ms", "tflops", "tbps")


def _versions() -> tuple[str, str]:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    return torch.__version__, triton_version


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def device_properties() -> dict:
    """What the driver says about GPU 0 (kept beside the measurements in ``meta``)."""
    import torch

    p = torch.cuda.get_device_properties(0)
    return {
        "name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "sm_count": p.multi_processor_count,
        "memory_bytes": p.total_memory,
        "l2_bytes": getattr(p, "L2_cache_size", None),
    }


@dataclass
class Record:
    """Rows of one benchmark run, with provenance filled in from the running process."""

    command: str = field(default_factory=lambda: "python -m " + " ".join(["llmnote.bench", *sys.argv[1:]]))
    rows: list[dict] = field(default_factory=list)
    extra_meta: dict = field(default_factory=dict)  # JSON-serialisable keys added to meta (not the five required ones)

    def add(
        self,
        kernel: str,
        case: str,
        dtype: str,
        provider: str,
        median_ms: float,
        flops: float | None = None,
        nbytes: float | None = None,
    ) -> dict:
        """Append one measurement; rates are computed from ``flops`` and ``nbytes`` if given."""
        if not median_ms > 0:
            raise ValueError(f"median_ms must be positive, got {median_ms}")
        seconds = median_ms * 1e-3
        row = {
            "kernel": kernel,
            "case": case,
            "dtype": dtype,
            "provider": provider,
            "median_ms": median_ms,
            "tflops": None if flops is None else flops / seconds / 1e12,
            "tbps": None if nbytes is None else nbytes / seconds / 1e12,
        }
        self.rows.append(row)
        return row

    def to_dict(self) -> dict:
        torch_version, triton_version = _versions()
        meta = {
            "gpu": _gpu_name(),
            "torch": torch_version,
            "triton": triton_version,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": self.command,
        }
        if torch_cuda_available():
            meta["device"] = device_properties()
        clash = sorted(set(self.extra_meta) & {*META_KEYS, "device"})
        if clash:
            raise ValueError(f"extra_meta must not set the record's own keys {clash}")
        return validate_record({"meta": {**meta, **self.extra_meta}, "rows": self.rows})

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path


def validate_record(rec: dict) -> dict:
    """Raise ``ValueError`` unless ``rec`` follows the record format; return it."""
    if not isinstance(rec, dict) or set(rec) != {"meta", "rows"}:
        raise ValueError("a record is a dict with exactly the keys 'meta' and 'rows'")
    missing = [k for k in META_KEYS if not isinstance(rec["meta"].get(k), str)]
    if missing:
        raise ValueError(f"record meta lacks string fields {missing}")
    if not isinstance(rec["rows"], list) or not rec["rows"]:
        raise ValueError("record rows must be a non-empty list")
    for i, row in enumerate(rec["rows"]):
        if set(row) != set(ROW_KEYS):
            raise ValueError(f"row {i} has keys {sorted(row)}, expected {sorted(ROW_KEYS)}")
        for key in ("kernel", "case", "dtype", "provider"):
            if not isinstance(row[key], str) or not row[key]:
                raise ValueError(f"row {i}: {key!r} must be a non-empty string")
        if not isinstance(row["median_ms"], (int, float)) or row["median_ms"] <= 0:
            raise ValueError(f"row {i}: median_ms must be a positive number")
        for key in ("tflops", "tbps"):
            if row[key] is not None and (not isinstance(row[key], (int, float)) or row[key] <= 0):
                raise ValueError(f"row {i}: {key} must be a positive number or null")
    return rec


def load_record(topic: str, folder: str | Path | None = None) -> dict | None:
    """Read and validate ``<folder>/<topic>.json`` (default: the book's benchmarks); None if absent.

    The command in ``meta`` is given as a reader would type it from the repository root: the
    output file it wrote (wherever that was on the recording machine) is named by its place in
    the book, ``assets/benchmarks/<topic>.json``.
    """
    path = Path(folder) if folder is not None else benchmarks_dir()
    path = path / f"{topic}.json"
    if not path.exists():
        return None
    record = validate_record(json.loads(path.read_text()))
    words = record["meta"]["command"].split()
    book = f"assets/benchmarks/{topic}.json"  # what --out wrote, whatever the recording machine named it
    record["meta"]["command"] = " ".join(book if i and words[i - 1] == "--out" else w for i, w in enumerate(words))
    return record


def record_topics(folder: str | Path | None = None) -> list[str]:
    """The topics of the records in ``folder`` (default: the book's benchmarks), sorted."""
    path = Path(folder) if folder is not None else benchmarks_dir()
    return sorted(p.stem for p in path.glob("*.json")) if path.is_dir() else []
