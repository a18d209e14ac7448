"""A mixture-of-experts feed-forward layer: a router picks ``top_k`` SwiGLU experts per
token (Shazeer et al. 2017; Mixtral 2024 renormalises the chosen probabilities), an
optional capacity limit drops the overflow of popular experts (Switch Transformer, Fedus
et al. 2021), and the auxiliary load-balancing loss of Switch measures the imbalance."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._checks import check_tensor
from .ops import silu_mul

__all__ = ["MoEOutput", "moe_route", "moe_layer"]


@dataclass
class MoEOutput:
    out: torch.Tensor  # like x
    experts: torch.Tensor  # (tokens, top_k) chosen expert ids
    weights: torch.Tensor  # (tokens, top_k) gate weights, rows sum to 1
    tokens_per_expert: torch.Tensor  # (num_experts,) assignments routed to each expert
    dropped: int  # assignments beyond an expert's capacity
    aux_loss: torch.Tensor  # Switch load-balancing loss; 1.0 when perfectly balanced


def moe_route(x: torch.Tensor, router: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router probabilities ``(T, E)`` and each token's ``top_k`` experts and renormalised weights."""
    if not 1 <= top_k <= router.shape[0]:
        raise ValueError(f"top_k must be in [1, {router.shape[0]}], got {top_k}")
    probs = torch.softmax(x.float() @ router.float().T, dim=-1)
    weights, experts = probs.topk(top_k, dim=-1)
    return probs, experts, weights / weights.sum(-1, keepdim=True)


def moe_layer(
    x: torch.Tensor,
    router: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k: int = 2,
    capacity_factor: float | None = None,
) -> MoEOutput:
    """``x`` ``(..., d)``; ``router`` ``(E, d)``; experts' ``w_gate``/``w_up`` ``(E, I, d)`` and
    ``w_down`` ``(E, d, I)``. With ``capacity_factor`` each expert takes at most
    ``ceil(capacity_factor * T * top_k / E)`` assignments, first come first served."""
    check_tensor("x", x)
    check_tensor("router", router, ndim=2)
    num_experts, d = router.shape
    if x.shape[-1] != d:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) must match the router's ({d})")
    if (
        w_gate.shape != w_up.shape
        or w_gate.shape[0] != num_experts
        or w_gate.shape[2] != d
        or w_down.shape != (num_experts, d, w_gate.shape[1])
    ):
        raise ValueError("expert weights must be w_gate/w_up (E, I, d) and w_down (E, d, I) for the router's E and d")
    tokens = x.reshape(-1, d)
    probs, experts, weights = moe_route(tokens, router, top_k)
    flat_experts = experts.reshape(-1)  # assignment a = token a // top_k, slot a % top_k
    keep = torch.ones_like(flat_experts, dtype=torch.bool)
    if capacity_factor is not None:
        capacity = math.ceil(capacity_factor * tokens.shape[0] * top_k / num_experts)
        one_hot = torch.nn.functional.one_hot(flat_experts, num_experts)
        rank = (one_hot.cumsum(0) * one_hot).sum(-1)  # 1-based arrival order at the expert
        keep = rank <= capacity
    out = torch.zeros(tokens.shape, dtype=torch.float32, device=x.device)
    flat_weights = weights.reshape(-1)
    for e in range(num_experts):
        assigned = ((flat_experts == e) & keep).nonzero().squeeze(-1)
        if assigned.numel() == 0:
            continue
        rows = tokens[assigned // top_k].float()
        hidden = silu_mul(rows @ w_gate[e].float().T, rows @ w_up[e].float().T)
        out.index_add_(0, assigned // top_k, (hidden @ w_down[e].float().T) * flat_weights[assigned, None])
    counts = torch.bincount(flat_experts, minlength=num_experts)
    fraction = counts.float() / flat_experts.numel()
    aux = num_experts * (fraction * probs.mean(0)).sum()
    return MoEOutput(out.to(x.dtype).reshape(x.shape), experts, weights, counts, int((~keep).sum()), aux)
