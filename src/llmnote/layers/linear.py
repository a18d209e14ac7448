"""Linear layers: one interface for dense, quantized and tensor-parallel projections.

A :class:`Linear` owns the *logical* shape ``(out_features, in_features)`` of a weight as a
checkpoint stores it, and two choices made apart from the model's code:

- **how the weight is stored and multiplied**, a :class:`LinearMethod`: :class:`Dense` keeps
  the matrix as it is; a quantized method keeps packed integers and scales instead, and
  quantizes each checkpoint tensor as it is loaded;
- **which slice this process holds**, a :class:`TensorParallel`: a *column-parallel* layer
  keeps a slice of the output features (its output is a slice too), a *row-parallel* layer a
  slice of the input features (its partial outputs are summed across processes with an
  all-reduce), as in Megatron-LM (Shoeybi et al., 2019).

Several projections of one input may be *merged* into one matrix (``output_sizes``): the
query, key and value projections, or the gate and up projections of a SwiGLU MLP. One
matrix product then reads the input once and launches one kernel instead of three. The
checkpoint still stores the parts apart; :meth:`Linear.load` copies each part (``shard``)
into its rows, sliced for this process's rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["TensorParallel", "LinearMethod", "Dense", "Linear"]


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in a tensor-parallel group: ``rank`` of ``size`` (``group`` is a
    ``torch.distributed`` process group, or None for the default one)."""

    rank: int = 0
    size: int = 1
    group: object = None

    def __post_init__(self):
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank must be in [0, size), got rank {self.rank} of size {self.size}")


SINGLE = TensorParallel()


class LinearMethod:
    """How a :class:`Linear` stores its weight and multiplies by it."""

    def create_weights(self, layer: Linear, out_features: int, in_features: int, dtype: torch.dtype | None) -> None:
        """Register the parameters of a ``(out_features, in_features)`` local weight on ``layer``."""
        raise NotImplementedError

    def load_rows(self, layer: Linear, weight: torch.Tensor, rows: slice) -> None:
        """Store ``weight`` (rows of the local weight, full local width) at ``rows``."""
        raise NotImplementedError

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W^T + bias`` for ``x`` (..., in_features)."""
        raise NotImplementedError

    def dense_weight(self, layer: Linear) -> torch.Tensor:
        """The local weight as a dense ``(out, in)`` matrix (for export and inspection)."""
        raise NotImplementedError


class Dense(LinearMethod):
    """The weight as one matrix, multiplied by cuBLAS (``torch.nn.functional.linear``)."""

    def create_weights(self, layer, out_features, in_features, dtype):
        layer.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))

    def load_rows(self, layer, weight, rows):
        with torch.no_grad():
            layer.weight[rows].copy_(weight)

    def apply(self, layer, x, bias):
        return F.linear(x, layer.weight, bias)

    def dense_weight(self, layer):
        return layer.weight


class Linear(nn.Module):
    """``y = x W^T + b`` with ``W`` of shape ``(sum(output_sizes), in_features)``.

    ``output_sizes``: the sizes of the merged parts (one part: a plain projection).
    ``parallel``: ``"none"``, ``"column"`` (each part's outputs split across ``tp.size``
    processes) or ``"row"`` (the inputs split; outputs all-reduced). ``method`` defaults to
    :class:`Dense`.
    """

    def __init__(
        self,
        in_features: int,
        output_sizes: int | list[int],
        bias: bool = False,
        *,
        parallel: Literal["none", "column", "row"] = "none",
        tp: TensorParallel = SINGLE,
        method: LinearMethod | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        sizes = [output_sizes] if isinstance(output_sizes, int) else list(output_sizes)
        if parallel not in ("none", "column", "row"):
            raise ValueError(f"parallel must be 'none', 'column' or 'row', got {parallel!r}")
        if parallel == "none" and tp.size != 1:
            raise ValueError("a tensor-parallel group needs parallel='column' or 'row'")
        if parallel == "column" and any(s % tp.size for s in sizes):
            raise ValueError(f"output sizes {sizes} must be multiples of the tensor-parallel size {tp.size}")
        if parallel == "row" and in_features % tp.size:
            raise ValueError(f"in_features {in_features} must be a multiple of the tensor-parallel size {tp.size}")
        self.in_features, self.output_sizes, self.parallel, self.tp = in_features, sizes, parallel, tp
        split = tp.size if parallel == "column" else 1
        self.local_sizes = [s // split for s in sizes]
        self.local_in = in_features // tp.size if parallel == "row" else in_features
        self.method = method or Dense()
        self.method.create_weights(self, sum(self.local_sizes), self.local_in, dtype)
        self.bias = nn.Parameter(torch.zeros(sum(self.local_sizes), dtype=dtype)) if bias else None

    @property
    def out_features(self) -> int:
        return sum(self.output_sizes)

    def extra_repr(self) -> str:
        parts = f", parts={self.output_sizes}" if len(self.output_sizes) > 1 else ""
        tp = f", {self.parallel}-parallel {self.tp.rank}/{self.tp.size}" if self.parallel != "none" else ""
        bias = self.bias is not None
        return f"in={self.in_features}, out={self.out_features}{parts}, bias={bias}{tp}, {type(self.method).__name__}"

    def _local(self, tensor: torch.Tensor, shard: int, name: str) -> tuple[torch.Tensor, slice]:
        """The slice of checkpoint part ``shard`` this process keeps, and its local rows."""
        if not 0 <= shard < len(self.output_sizes):
            raise ValueError(f"shard must be in [0, {len(self.output_sizes)}), got {shard}")
        full = (self.output_sizes[shard], self.in_features) if name == "weight" else (self.output_sizes[shard],)
        if tuple(tensor.shape) != full:
            raise ValueError(f"{name} of part {shard} must have shape {full}, got {tuple(tensor.shape)}")
        n, r = self.local_sizes[shard], self.tp.rank
        if self.parallel == "column":
            tensor = tensor[r * n : (r + 1) * n]
        elif self.parallel == "row" and name == "weight":
            tensor = tensor[:, r * self.local_in : (r + 1) * self.local_in]
        start = sum(self.local_sizes[:shard])
        return tensor, slice(start, start + n)

    def load(self, name: str, tensor: torch.Tensor, shard: int = 0) -> None:
        """Load checkpoint tensor ``name`` (``"weight"`` or ``"bias"``) of part ``shard``:
        sliced for this rank, then stored by the method (which may quantize it)."""
        if name == "bias" and self.bias is None:
            raise ValueError("this layer has no bias")
        if name not in ("weight", "bias"):
            raise ValueError(f"name must be 'weight' or 'bias', got {name!r}")
        local, rows = self._local(tensor, shard, name)
        if name == "weight":
            self.method.load_rows(self, local, rows)
        else:
            with torch.no_grad():
                self.bias[rows].copy_(local)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parallel != "row" or self.tp.size == 1:
            return self.method.apply(self, x, self.bias)
        y = self.method.apply(self, x, None)  # a partial sum over this rank's input slice
        torch.distributed.all_reduce(y, group=self.tp.group)
        return y if self.bias is None else y + self.bias

    def split(self, y: torch.Tensor) -> list[torch.Tensor]:
        """A merged output ``(..., sum(local_sizes))`` cut into its parts (views)."""
        return list(y.split(self.local_sizes, dim=-1))
