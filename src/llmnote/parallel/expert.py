"""Expert parallelism: the experts of a mixture-of-experts layer spread over processes, tokens
sent to their experts and back with two all-to-alls.

Process ``r`` of ``N`` holds experts ``r E/N .. (r+1) E/N - 1`` and its own share of the tokens
(the attention before the layer runs data-parallel). For the layer, each process

1. routes its tokens (top-k experts and gate weights, :func:`llmnote.ref.moe.moe_route`);
2. **dispatch**: sorts its token-expert assignments by the process that owns the expert and
   exchanges them with one all-to-all (first the counts, so every process knows how many rows
   it receives from each other, then the rows and their expert ids);
3. runs each received row through its local expert (SwiGLU);
4. **combine**: sends the results back with the reverse all-to-all, where each returns to its
   token's place and is weighted by its gate weight.

As in GShard (Lepikhin et al., 2021) and Switch Transformer (Fedus et al., 2021), minus the
capacity limit: here no assignment is dropped, so the result equals the whole layer's on the
same tokens. Each process sends about ``(N - 1)/N`` of its ``T k`` assignment rows each way.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..ref.moe import moe_route
from ..ref.ops import silu_mul

__all__ = ["expert_parallel_moe"]


def _exchange(rows: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
    out = rows.new_empty((sum(recv_counts), *rows.shape[1:]))
    dist.all_to_all_single(out, rows.contiguous(), recv_counts, send_counts)
    return out


@torch.no_grad()
def expert_parallel_moe(rank: int, world_size: int, x: torch.Tensor, router: torch.Tensor, w_gate: torch.Tensor,
                        w_up: torch.Tensor, w_down: torch.Tensor, top_k: int = 2) -> dict:  # fmt: skip
    """Run in each process of a group (e.g. through :func:`llmnote.parallel.launch.spawn`) with the
    whole layer's arguments of :func:`llmnote.ref.moe.moe_layer` (no capacity limit): this
    process keeps its slice of the tokens ``x`` ``(T, d)`` (``tensor_split`` over the group) and
    of the experts, and returns its tokens' outputs ``(T_r, d)`` (float32), with the rows it
    sent to and received from each process."""
    num_experts, d = router.shape
    if num_experts % world_size:
        raise ValueError(f"{num_experts} experts cannot be split evenly over {world_size} processes")
    per = num_experts // world_size
    mine = slice(rank * per, (rank + 1) * per)
    w_gate, w_up, w_down = w_gate[mine].float(), w_up[mine].float(), w_down[mine].float()
    tokens = x.reshape(-1, d).tensor_split(world_size)[rank].float()

    _, experts, weights = moe_route(tokens, router, top_k)
    flat = experts.reshape(-1)  # assignment a: token a // top_k
    order = torch.argsort(flat // per, stable=True)  # grouped by the process that owns the expert
    send_counts = torch.bincount(flat // per, minlength=world_size)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send, recv = send_counts.tolist(), recv_counts.tolist()

    rows = _exchange(tokens[order // top_k], send, recv)  # dispatch
    which = _exchange(flat[order], send, recv) - rank * per  # local expert of each received row
    done = torch.empty_like(rows)
    for e in range(per):
        at = (which == e).nonzero().squeeze(-1)
        if at.numel():
            h = silu_mul(rows[at] @ w_gate[e].T, rows[at] @ w_up[e].T)
            done[at] = h @ w_down[e].T
    back = _exchange(done, recv, send)  # combine: in the order the rows were sent
    out = torch.zeros_like(tokens)
    out.index_add_(0, order // top_k, back * weights.reshape(-1)[order, None])
    return {"out": out, "sent": send, "received": recv}
