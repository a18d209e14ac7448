"""Ceilings measured on a real GPU by ``python -m llmnote.bench ceilings``.

Datasheet peaks are promises; these are what the card delivered to PyTorch on random
data: the best device-to-device copy bandwidth and the best cuBLAS matmul rates.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..records import load_record

__all__ = ["MeasuredCeilings", "measured_ceilings"]


@dataclass(frozen=True)
class MeasuredCeilings:
    gpu: str
    copy_tbps: float  # device-to-device copy, bytes read + written per second
    matmul_tflops: dict[str, float]  # best cuBLAS rate per dtype
    h2d_gbps: float | None  # pinned host-to-device copy
    d2h_gbps: float | None
    date: str
    command: str


def measured_ceilings(topic: str = "ceilings") -> MeasuredCeilings | None:
    """The recorded ceilings, or None when no record exists yet."""
    rec = load_record(topic)
    if rec is None:
        return None
    rows = rec["rows"]

    def best(kernel: str, field: str, dtype: str | None = None) -> float | None:
        vals = [
            r[field] for r in rows if r["kernel"] == kernel and r[field] is not None and (dtype is None or r["dtype"] == dtype)
        ]
        return max(vals) if vals else None

    h2d, d2h = best("h2d-copy", "tbps"), best("d2h-copy", "tbps")
    return MeasuredCeilings(
        gpu=rec["meta"]["gpu"],
        copy_tbps=best("copy", "tbps"),
        matmul_tflops={d: best("matmul", "tflops", d) for d in sorted({r["dtype"] for r in rows if r["kernel"] == "matmul"})},
        h2d_gbps=None if h2d is None else h2d * 1000,
        d2h_gbps=None if d2h is None else d2h * 1000,
        date=rec["meta"]["date"],
        command=rec["meta"]["command"],
    )
