"""Context parallelism: one sequence's attention split across processes by the token dimension.

Every other part of a transformer layer works on each token alone (projections, norms, the MLP),
so a sequence cut into ``N`` pieces, one per process, runs those parts with no communication.
Attention is the exception: a query needs the keys and values of every earlier token. Ring
attention (Liu, Zaharia and Abbeel, 2023, *Ring Attention with Blockwise Transformers for
Near-Infinite Context*; the ring of key/value blocks goes back to the sequence parallelism of
Li et al., 2021) solves it with the online softmax's merge rule:

* process ``r`` keeps the queries of its piece and starts with the keys and values of its piece;
* for ``N`` steps it computes attention of its queries against the key/value block it holds,
  folds the result into a running ``(m, l, o)`` state (running maximum, running sum,
  unnormalised output), and meanwhile sends that block to process ``r + 1`` and receives the
  next one from process ``r - 1``;
* after ``N`` steps it has seen every block exactly once, in its own order, and ``o / l`` is
  exactly the attention output of its queries, because the merge is commutative and associative.

Only keys and values travel: one block per step, which a GPU can send while it computes on the
previous one. With a causal mask the blocks in a query's future are skipped, which leaves the
processes that hold early tokens idle; the *zigzag* layout cuts the sequence into ``2N`` chunks
and gives process ``r`` chunks ``r`` and ``2N - 1 - r``, one early and one late, so that every
process does the same work.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["LAYOUTS", "rank_chunks", "rank_positions", "merge_states", "ring_attention", "ring_attention_runs", "ring_schedule"]

LAYOUTS = ("contiguous", "zigzag")


def _check_layout(world_size: int, layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")


def rank_chunks(world_size: int, layout: str = "contiguous") -> list[tuple[int, int]]:
    """Which of ``2N`` equal chunks of the sequence each process holds, as ``(first, second)``.

    ``contiguous``: process ``r`` holds chunks ``2r`` and ``2r + 1``, one block of ``S / N``
    tokens. ``zigzag``: process ``r`` holds chunks ``r`` and ``2N - 1 - r``.
    """
    _check_layout(world_size, layout)
    n = world_size
    if layout == "contiguous":
        return [(2 * r, 2 * r + 1) for r in range(n)]
    return [(r, 2 * n - 1 - r) for r in range(n)]


def rank_positions(seq: int, world_size: int, layout: str = "contiguous") -> list[torch.Tensor]:
    """The sequence positions each process holds (``S / N`` of them, increasing)."""
    _check_layout(world_size, layout)
    parts = world_size if layout == "contiguous" else 2 * world_size
    if seq % parts:
        raise ValueError(f"seq ({seq}) must be divisible by {parts} for layout={layout!r} with world_size={world_size}")
    chunk = seq // (2 * world_size) if layout == "zigzag" else None
    if layout == "contiguous":
        block = seq // world_size
        return [torch.arange(r * block, (r + 1) * block) for r in range(world_size)]
    return [torch.cat([torch.arange(c * chunk, (c + 1) * chunk) for c in pair]) for pair in rank_chunks(world_size, layout)]


def _pieces(positions: torch.Tensor) -> list[slice]:
    """Runs of consecutive positions (one for a contiguous block, two for a zigzag pair)."""
    breaks = [0] + [i for i in range(1, len(positions)) if positions[i] != positions[i - 1] + 1] + [len(positions)]
    return [slice(a, b) for a, b in zip(breaks, breaks[1:])]


def _block_state(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None):
    """``(m, l, o)`` of queries ``q (H, nq, D)`` against one block ``k, v (H, nk, D)``; ``mask``
    (nq, nk) is True where a key is visible. A row that sees no key gets the empty state."""
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(dim=-1)
    p = torch.exp(s - torch.where(m == float("-inf"), 0.0, m)[..., None])
    return m, p.sum(-1), p @ v


def merge_states(a: tuple, b: tuple) -> tuple:
    """The online softmax's merge: the ``(m, l, o)`` of the union of two disjoint key sets.

    ``m = max(m_a, m_b)``; ``l`` and ``o`` are the two sums, each rescaled from its own maximum
    to ``m`` by ``exp(m_x - m)``. Where both maxima are ``-inf`` (no key seen yet) the reference
    is taken as 0, so the weights are ``exp(-inf) = 0`` rather than NaN.
    """
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m = torch.maximum(m_a, m_b)
    ref = torch.where(m == float("-inf"), 0.0, m)
    w_a, w_b = torch.exp(m_a - ref), torch.exp(m_b - ref)
    return m, l_a * w_a + l_b * w_b, o_a * w_a[..., None] + o_b * w_b[..., None]


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 3:
            raise ValueError(f"{name} must be a (heads, seq, dim) tensor, got {getattr(t, 'shape', type(t))}")
        if t.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"{name} must be float32 or float64, got {t.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[1:] != k.shape[1:]:
        raise ValueError(f"q (Hq, S, D) and k (Hkv, S, D) must share S and D, got {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[0] % k.shape[0]:
        raise ValueError(f"query heads ({q.shape[0]}) must be a multiple of key/value heads ({k.shape[0]})")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError("q, k and v must share a dtype")


@torch.no_grad()
def ring_attention(rank: int, world_size: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   layout: str = "contiguous", sm_scale: float | None = None) -> dict:  # fmt: skip
    """Run in each process of a group (e.g. through :func:`llmnote.parallel.launch.spawn`) with the
    whole ``q (Hq, S, D)``, ``k, v (Hkv, S, D)``; each process keeps only its own positions.

    Grouped-query attention: query head ``h`` uses key/value head ``h // (Hq // Hkv)``, and only
    the ``Hkv`` key/value heads travel. ``causal``: position ``i`` sees keys ``j <= i``.

    Returns ``{"positions", "out", "sources", "pairs", "sent_bytes"}``: the sequence positions
    of this process's rows, their attention output ``(Hq, S/N, D)``, and per ring step the
    process whose block was used, the number of (query, key) pairs computed (per head; masked
    pairs of a diagonal block are not counted, as a causal kernel skips them), and the bytes
    sent on to the next process.
    """
    _check_qkv(q, k, v)
    _check_layout(world_size, layout)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    positions = rank_positions(q.shape[1], world_size, layout)
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    group = q.shape[0] // k.shape[0]

    mine = positions[rank]
    q_local = q[:, mine]
    kv = torch.stack([k[:, mine], v[:, mine]]).contiguous()  # the block that travels: (2, Hkv, S/N, D)
    h, n, d = q_local.shape
    state = (torch.full((h, n), float("-inf"), dtype=q.dtype), torch.zeros(h, n, dtype=q.dtype),
             torch.zeros(h, n, d, dtype=q.dtype))  # fmt: skip
    sources, pairs, sent = [], [], []
    nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size

    for step in range(world_size):
        # Post the exchange first, so the block travels while this step computes on it.
        requests, incoming = [], None
        if step < world_size - 1:
            incoming = torch.empty_like(kv)
            requests = [dist.isend(kv, nxt), dist.irecv(incoming, prev)]
            sent.append(kv.numel() * kv.element_size())
        else:
            sent.append(0)

        source = (rank - step) % world_size
        key_pos = positions[source]
        k_blk = kv[0].repeat_interleave(group, dim=0)
        v_blk = kv[1].repeat_interleave(group, dim=0)
        work = 0
        for qs in _pieces(mine):
            for ks in _pieces(key_pos):
                q_lo, q_hi = int(mine[qs.start]), int(mine[qs.stop - 1])
                k_lo, k_hi = int(key_pos[ks.start]), int(key_pos[ks.stop - 1])
                mask = None
                if causal:
                    if k_lo > q_hi:  # every key in this piece is in every query's future: skip it
                        continue
                    if k_hi > q_lo:  # straddles the diagonal: mask the future keys
                        mask = key_pos[ks][None, :] <= mine[qs][:, None]
                work += (qs.stop - qs.start) * (ks.stop - ks.start) if mask is None else int(mask.sum())
                part = _block_state(q_local[:, qs], k_blk[:, ks], v_blk[:, ks], scale, mask)
                m, ell, o = state
                m_new, l_new, o_new = merge_states((m[:, qs], ell[:, qs], o[:, qs]), part)
                m[:, qs], ell[:, qs], o[:, qs] = m_new, l_new, o_new
        sources.append(source)
        pairs.append(work)

        for req in requests:
            req.wait()
        if incoming is not None:
            kv = incoming

    m, ell, o = state
    out = o / torch.where(ell == 0, 1.0, ell)[..., None]
    return {"positions": mine, "out": out, "sources": sources, "pairs": pairs, "sent_bytes": sent}


def ring_attention_runs(rank: int, world_size: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        runs: list[tuple[bool, str]]) -> list[dict]:  # fmt: skip
    """:func:`ring_attention` once per ``(causal, layout)`` in ``runs``, in the same group of
    processes: starting a process costs seconds, a ring of small blocks milliseconds."""
    return [ring_attention(rank, world_size, q, k, v, causal, layout) for causal, layout in runs]


def ring_schedule(world_size: int, layout: str = "contiguous", causal: bool = True) -> list[list[tuple[int, int, int]]]:
    """The tiles of the attention matrix, on a grid of ``2N x 2N`` chunks, that each ring step
    computes: ``schedule[step]`` lists ``(rank, query_chunk, key_chunk)``. A causal run skips
    tiles with ``key_chunk > query_chunk`` (diagonal tiles are computed, masked)."""
    chunks = rank_chunks(world_size, layout)
    schedule = []
    for step in range(world_size):
        tiles = []
        for rank in range(world_size):
            held = chunks[(rank - step) % world_size]
            tiles += [(rank, qc, kc) for qc in chunks[rank] for kc in held if not (causal and kc > qc)]
        schedule.append(tiles)
    return schedule
