"""Grader of Lab 5 (``labs/05_kv_cache_decode.ipynb``): one decode step of attention with a KV
cache, ``decode_step(x, cache, layer)``, in plain PyTorch.

The check prefills a cache with the keys and values of a random prompt, then runs several
decode steps and compares each step's output with the same row of full causal attention over
the whole sequence (:func:`llmnote.ref.flash_attention`). It also checks that each step grows
the cache by exactly one position, leaves the past untouched, and projects only the new token
(the projections it hands over count the rows they see).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import ref, runtime
from .harness import Draw, LabCheckError, LabReport, compare, dtype_name, first_index, new_seed, not_written, report

__all__ = ["LayerCache", "DecodeLayer", "check_decode_step"]


@dataclass
class LayerCache:
    """One attention layer's KV cache for a batch of sequences: preallocated buffers ``k`` and
    ``v`` of shape (B, Hkv, capacity, D), whose positions ``[0, length)`` hold the keys and
    values of the tokens seen so far (the same number for every sequence)."""

    k: torch.Tensor
    v: torch.Tensor
    length: int = 0

    @classmethod
    def empty(cls, batch: int, kv_heads: int, capacity: int, head_dim: int, dtype=torch.float32, device=None) -> LayerCache:
        """A cache with room for ``capacity`` tokens per sequence, none stored yet."""
        shape = (batch, kv_heads, capacity, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @property
    def capacity(self) -> int:
        return self.k.shape[2]


@dataclass
class DecodeLayer:
    """What a decode step needs of one attention layer: ``q_proj`` maps hidden states
    (..., hidden) to queries (..., heads * head_dim); ``k_proj`` and ``v_proj`` map them to keys
    and values (..., kv_heads * head_dim). Query head ``h`` attends with key/value head
    ``h // (heads // kv_heads)`` (grouped-query attention). No RoPE, no output projection."""

    q_proj: Callable[[torch.Tensor], torch.Tensor]
    k_proj: Callable[[torch.Tensor], torch.Tensor]
    v_proj: Callable[[torch.Tensor], torch.Tensor]
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def random(
        cls, hidden: int, heads: int, kv_heads: int, head_dim: int, dtype=torch.float32, device=None, generator=None
    ) -> DecodeLayer:
        """Bias-free linear projections with random weights of scale ``1/sqrt(hidden)``."""
        if heads % kv_heads:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")

        def linear(width: int) -> torch.nn.Linear:
            proj = torch.nn.Linear(hidden, width, bias=False, device=device, dtype=dtype).requires_grad_(False)
            proj.weight.copy_(torch.randn(width, hidden, generator=generator) / math.sqrt(hidden))
            return proj

        return cls(linear(heads * head_dim), linear(kv_heads * head_dim), linear(kv_heads * head_dim), heads, kv_heads, head_dim)


class _Counted:
    """A projection that counts the token rows it is applied to."""

    def __init__(self, proj: Callable):
        self.proj, self.rows = proj, 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += x.numel() // max(x.shape[-1], 1)
        return self.proj(x)


_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 5e-3), torch.bfloat16: (1e-2, 2e-2)}


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads_of: torch.Tensor, scale: float) -> torch.Tensor:
    """One query per sequence: q (B, H, D) over k, v (B, Hkv, T, D), head h reading kv head heads_of[h]."""
    heads_of = heads_of.to(k.device)
    k, v = k.float()[:, heads_of], v.float()[:, heads_of]
    probs = torch.softmax((q.float()[:, :, None] @ k.transpose(-1, -2)) * scale, dim=-1)
    return (probs @ v)[:, :, 0]


def _misreading(out, q, keys, values, t, group, tol) -> str:
    """A hint naming the mistake ``out`` looks like, among the usual ones."""
    heads, kv_heads, d = q.shape[1], keys.shape[1], q.shape[2]
    right, modulo = torch.arange(heads) // group, torch.arange(heads) % kv_heads
    now, first = (keys[:, :, : t + 1], values[:, :, : t + 1]), (keys[:, :, :1], values[:, :, :1])
    candidates = {
        "The new token attends to itself too: append its key and value first, then attend over all length + 1 positions.": (
            keys[:, :, :t],
            values[:, :, :t],
            right,
            d**-0.5,
        )
        if t
        else None,
        "Query head h reads key/value head h // (heads // kv_heads), as k.repeat_interleave(group, dim=1) or a view of "
        "q as (B, kv_heads, group, D) gives; k.repeat(1, group, 1, 1) gives h % kv_heads.": (
            (*now, modulo, d**-0.5) if group > 1 and kv_heads > 1 else None
        ),
        "Scale the scores by 1 / sqrt(head_dim).": (*now, right, 1.0),
        "With one query, SDPA's is_causal=True (and tril on a 1 x T mask) is top-left aligned: the query would see only "
        "position 0. The new token sees every cached position: a decode step needs no mask.": (*first, right, d**-0.5),
    }
    for hint, alternative in candidates.items():
        if alternative is not None and compare(out, _attend(q, *alternative).to(out.dtype), *tol, "") is None:
            return hint
    return "softmax(q k^T / sqrt(D)) v over positions 0..length of the cache, the new one included, per query head."


def _step_problem(out, x, x_before, cache, buffers, layer, counts, want, expected_k, expected_v, t, tol, q, keys, values):
    """``(what is wrong, hint)`` after one step at position ``t``, or ``None``."""
    B, H, Hkv, D = x.shape[0], layer.heads, layer.kv_heads, layer.head_dim
    if out is None or not isinstance(out, torch.Tensor):
        return f"`decode_step` returned {type(out).__name__}, not a tensor", "Return the attention output, (B, heads, head_dim)."
    if not torch.equal(x, x_before):
        return "`decode_step` changed its input x", "Compute new tensors; never write into x."
    if cache.k is not buffers[0] or cache.v is not buffers[1]:
        return (
            "cache.k or cache.v is a new tensor",
            "Write into the preallocated buffers (cache.k[:, :, t] = ...). Building a new cache each step "
            "(torch.cat) copies every cached token again: O(length) bytes for each new token.",
        )
    if cache.length != t + 1:
        still = " (it was not advanced)" if cache.length == t else ""
        return (
            f"cache.length is {cache.length} after the step, expected {t + 1}{still}",
            "Each decode step stores exactly one new position per sequence: set cache.length = t + 1 after writing "
            "position t = cache.length.",
        )
    for name, rows in counts.items():
        if rows != B:
            return (
                f"layer.{name} was applied to {rows} token rows in this step, for {B} sequence(s)",
                "A decode step projects only the new token, once: the keys and values of earlier tokens are in the "
                "cache, which is its whole point.",
            )
    for name, buffer, expected in (("k", cache.k, expected_k), ("v", cache.v, expected_v)):
        if not torch.equal(buffer[:, :, :t], buffers[2 if name == "k" else 3]):
            changed = (buffer[:, :, :t] != buffers[2 if name == "k" else 3]) & ~torch.isnan(buffer[:, :, :t])
            at = first_index(changed | torch.isnan(buffer[:, :, :t]))
            return (
                f"cache.{name} changed at a past position (index {at} of cache.{name}[:, :, :{t}])",
                "The step must only append: write at position t = cache.length and leave positions 0..t-1 as they are.",
            )
        if compare(buffer[:, :, t], expected, *tol, "") is not None:
            return (
                f"cache.{name}[:, :, {t}] does not hold the new token's {'keys' if name == 'k' else 'values'}",
                f"Store layer.{name}_proj(x).view(B, kv_heads, head_dim) at position t = cache.length (before advancing it).",
            )
        if not torch.isnan(buffer[:, :, t + 1 :]).all():
            return f"cache.{name} was written past position {t}", "Write only position t = cache.length."
    if out.shape != (B, H, D) or out.dtype != x.dtype:
        return (
            f"the output has shape {tuple(out.shape)} and dtype {dtype_name(out.dtype)}, expected ({B}, {H}, {D}) and "
            f"{dtype_name(x.dtype)}",
            "Return one output vector per sequence and query head, (B, heads, head_dim), in x's dtype.",
        )
    if torch.isnan(out).any():
        return (
            f"{int(torch.isnan(out).sum())} outputs are NaN",
            "The check fills the unused part of the cache (positions length and beyond) with NaN: attend only over "
            "cache.k[:, :, :length] and cache.v[:, :, :length].",
        )
    problem = compare(out, want, *tol, "")
    if problem is not None:
        return problem[0], _misreading(out, q, keys, values, t, H // Hkv, tol)
    return None


def check_decode_step(decode_step: Callable, *, seed: int | None = None, verbose: bool = True) -> LabReport:
    """Grade ``decode_step(x, cache, layer) -> (B, heads, head_dim)``: ``x`` (B, hidden) is the new
    token's hidden state, ``cache`` a :class:`LayerCache` holding ``cache.length`` earlier tokens,
    ``layer`` a :class:`DecodeLayer`. The step appends the new token's key and value at position
    ``cache.length``, advances ``cache.length`` by one, and returns the attention of its query
    over every cached position. 9 cases (prompts of 0 to 40 tokens, then 1 to 5 steps each;
    multi-head, grouped-query and multi-query heads; a cache filled to capacity) in float32,
    and ``runtime.half_dtype()`` too on a GPU. Each output must match that row of full causal
    attention over the whole sequence. Raises :class:`~llmnote.labs.LabCheckError`."""
    __tracebackhide__ = True
    if not callable(decode_step):
        raise TypeError(f"check_decode_step takes your function decode_step(x, cache, layer), got {type(decode_step).__name__}")
    seed = new_seed(seed)
    draw = Draw(seed, [torch.float32] + ([runtime.half_dtype()] if runtime.has_gpu() else []))
    rng, gen, device = draw.rng, draw.gen, draw.device
    configs = [  # label, batch, hidden, heads, kv_heads, head_dim, prompt, steps, spare positions
        ("one sequence, two heads", 1, 32, 2, 2, 8, 5, 3, 2),
        ("an empty cache: the first token sees only itself", 2, 24, 2, 2, 8, 0, 3, 1),
        ("grouped-query heads: 4 query heads share 2 key/value heads", 2, 48, 4, 2, 16, 7, 4, 3),
        ("multi-query: 6 query heads share 1 key/value head", 3, 32, 6, 1, 8, 3, 3, 2),
        ("the last step fills the cache to capacity", 2, 32, 4, 2, 8, 6, 2, 0),
        ("a 40-token prompt, 8 query heads on 2 key/value heads", 2, 64, 8, 2, 16, 40, 2, 4),
    ]
    for _ in range(3):
        heads, kv_heads = rng.choice([(1, 1), (2, 2), (4, 1), (4, 2), (8, 4), (6, 2)])
        configs.append(("random", rng.randint(1, 4), rng.choice([16, 32, 48]), heads, kv_heads, rng.choice([8, 16, 32]),
                        rng.randint(0, 20), rng.randint(1, 5), rng.randint(0, 4)))  # fmt: skip
    rerun = f"Rerun this draw with check_decode_step(decode_step, seed={seed})."
    labels, dtypes = [], []
    for number, (label, B, hidden, H, Hkv, D, prompt, steps, spare) in enumerate(configs, 1):
        dtype = draw.dtype()
        tol = _TOL[dtype]
        label = f"B={B}, heads={H}, kv_heads={Hkv}, head_dim={D}, a {prompt}-token prompt then {steps} step(s), {label}"
        total = prompt + steps
        xs = (torch.randn(B, total, hidden, generator=gen)).to(device, dtype)
        layer = DecodeLayer.random(hidden, H, Hkv, D, dtype, device, gen)
        q_all = layer.q_proj(xs).view(B, total, H, D).transpose(1, 2)
        k_all = layer.k_proj(xs).view(B, total, Hkv, D).transpose(1, 2)
        v_all = layer.v_proj(xs).view(B, total, Hkv, D).transpose(1, 2)
        want_all = ref.flash_attention(q_all, k_all, v_all, causal=True)  # (B, H, total, D)
        cache = LayerCache.empty(B, Hkv, total + spare, D, dtype, device)
        cache.k.fill_(math.nan), cache.v.fill_(math.nan)
        cache.k[:, :, :prompt], cache.v[:, :, :prompt] = k_all[:, :, :prompt], v_all[:, :, :prompt]
        cache.length = prompt
        for step in range(steps):
            t = prompt + step
            where = (
                f"decode_step failed on case {number} of {len(configs)}, step {step + 1} of {steps} (position {t}): "
                f"{label}, {dtype_name(dtype)}"
            )
            x = xs[:, t].clone()
            counted = {name: _Counted(getattr(layer, name)) for name in ("q_proj", "k_proj", "v_proj")}
            watched = DecodeLayer(counted["q_proj"], counted["k_proj"], counted["v_proj"], H, Hkv, D)
            buffers = (cache.k, cache.v, cache.k[:, :, :t].clone(), cache.v[:, :, :t].clone())
            try:
                out = decode_step(x, cache, watched)
            except NotImplementedError:
                raise not_written("decode_step", "decode_step") from None
            except Exception as err:
                raise LabCheckError(f"{where}\n  `decode_step` raised {type(err).__name__}: {err}\n  {rerun}") from err
            counts = {name: c.rows for name, c in counted.items()}
            problem = _step_problem(out, x, xs[:, t], cache, buffers, watched, counts, want_all[:, :, t], k_all[:, :, t],
                                    v_all[:, :, t], t, tol, q_all[:, :, t], k_all, v_all)  # fmt: skip
            if problem is not None:
                what, hint = problem
                raise LabCheckError(f"{where}\n  {what}.\n  Hint: {hint}\n  {rerun}")
            if cache.length != t + 1:  # a step that passed left the cache consistent; keep it so for the next
                raise LabCheckError(f"{where}\n  cache.length changed after the step.\n  {rerun}")
        labels.append(f"{label}, {dtype_name(dtype)}")
        dtypes.append(dtype)
    return report("decode_step", labels, dtypes, seed, verbose)
