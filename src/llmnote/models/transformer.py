"""A readable decoder-only transformer for the Llama and Qwen families, built from
:mod:`llmnote.layers`.

The model works on *packed* tokens: the new tokens of every sequence in a batch, one after
the other, with an :class:`~llmnote.layers.AttentionContext` saying where each sequence
starts and where its keys and values live. ``forward(input_ids)`` wraps that for the usual
``(batch, seq)`` call; :meth:`Transformer.prefill` and :meth:`Transformer.decode` serve
sequences of different lengths together.

Module names follow the Hugging Face checkpoints (``model.layers.0.self_attn...``), except
the merged projections: the query, key and value projections are one ``qkv_proj`` and the
gate and up projections one ``gate_up_proj``, which read each token's activations once.
:meth:`Transformer.load_weights` takes the checkpoint's own names (``q_proj``, ``up_proj``
...) and places each tensor in its part; :meth:`Transformer.checkpoint_state` gives them back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch
import torch.nn as nn

from ..layers import (
    Attention,
    AttentionContext,
    Embedding,
    KVCache,
    Linear,
    LMHead,
    RMSNorm,
    RotaryEmbedding,
    TensorParallel,
    ops_for,
)
from ..layers.linear import SINGLE
from .config import ModelConfig
from .rope_scaling import rope_frequencies

__all__ = ["Transformer", "random_model", "rope_inv_freq", "PACKED_MODULES"]

# checkpoint module name -> (the merged module that holds it, its part)
PACKED_MODULES = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """RoPE's inverse frequencies for this model, with Llama 3's long-context rescaling if set."""
    s = config.rope_scaling
    if s is None:
        return rope_frequencies(config.head_dim, config.rope_theta)
    return rope_frequencies(
        config.head_dim,
        config.rope_theta,
        "llama3",
        s["factor"],
        s["original_max_position_embeddings"],
        low_freq_factor=s["low_freq_factor"],
        high_freq_factor=s["high_freq_factor"],
    )


class SelfAttention(nn.Module):
    def __init__(self, c: ModelConfig, layer: int, rotary: RotaryEmbedding, tp: TensorParallel):
        super().__init__()
        par = "none" if tp.size == 1 else "column"
        if c.num_heads % tp.size or c.num_kv_heads % tp.size:
            raise ValueError(f"{c.num_heads} query and {c.num_kv_heads} KV heads cannot be split over {tp.size} processes")
        self.heads, self.kv_heads, self.head_dim = c.num_heads // tp.size, c.num_kv_heads // tp.size, c.head_dim
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.qkv_proj = Linear(c.hidden_size, [q, kv, kv], bias=c.qkv_bias, parallel=par, tp=tp)
        self.o_proj = Linear(q, c.hidden_size, bias=c.o_bias, parallel="none" if tp.size == 1 else "row", tp=tp)
        if c.qk_norm:  # Qwen3: RMSNorm over each head's vector, before RoPE
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.rotary_emb = rotary
        self.attn = Attention(self.heads, self.kv_heads, c.head_dim, layer)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q = q.view(t, self.heads, self.head_dim)
        k, v = k.view(t, self.kv_heads, self.head_dim), v.view(t, self.kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(q, k, ctx.positions)
        return self.o_proj(self.attn(q, k, v, ctx).reshape(t, self.heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU (Shazeer, 2020): ``down(silu(gate(x)) * up(x))``, gate and up merged."""

    def __init__(self, c: ModelConfig, tp: TensorParallel):
        super().__init__()
        col, row = ("none", "none") if tp.size == 1 else ("column", "row")
        self.gate_up_proj = Linear(c.hidden_size, [c.intermediate_size] * 2, bias=c.mlp_bias, parallel=col, tp=tp)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias, parallel=row, tp=tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))
        return self.down_proj(ops_for(x).silu_mul(gate, up))


class DecoderLayer(nn.Module):
    """Pre-norm residual block. ``forward(x, residual, ctx)`` returns ``(out, residual)``,
    the layer's output kept apart from the residual stream: the hidden state after the layer
    is ``out + residual``, an add that the next norm performs in the same pass."""

    def __init__(self, c: ModelConfig, layer: int, rotary: RotaryEmbedding, tp: TensorParallel):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = SelfAttention(c, layer, rotary, tp)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c, tp)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, ctx: AttentionContext):
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm(x, residual)
        h, residual = self.post_attention_layernorm(self.self_attn(h, ctx), residual)
        return self.mlp(h), residual


class Backbone(nn.Module):
    def __init__(self, c: ModelConfig, rotary: RotaryEmbedding, tp: TensorParallel):
        super().__init__()
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size, tp=tp)
        self.layers = nn.ModuleList(DecoderLayer(c, i, rotary, tp) for i in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Transformer(nn.Module):
    """``forward(input_ids)`` -> logits ``(batch, seq, vocab)``; pass a :class:`KVCache` to
    prefill it and then decode token by token."""

    def __init__(self, config: ModelConfig, tp: TensorParallel = SINGLE):
        super().__init__()
        self.config, self.tp = config, tp
        self.rotary = RotaryEmbedding(config.head_dim, rope_inv_freq(config), config.max_position_embeddings)
        self.model = Backbone(config, self.rotary, tp)
        tied = self.model.embed_tokens if config.tie_word_embeddings else None
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, tied, tp=tp)

    # -- building and loading -------------------------------------------------------------

    def tie_weights(self) -> None:
        """Share the embedding with the LM head again (a move to another device unties them)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_buffers(self, device: torch.device | str) -> None:
        """Recompute the RoPE tables on ``device`` (after building on the meta device)."""
        self.rotary.build(device, rope_inv_freq(self.config))

    def _target(self, name: str) -> tuple[nn.Module, str, int | None]:
        """The module, parameter name and merged part that checkpoint tensor ``name`` loads into."""
        path, _, param = name.rpartition(".")
        parent, _, leaf = path.rpartition(".")
        if leaf in PACKED_MODULES:
            merged, shard = PACKED_MODULES[leaf]
            path = f"{parent}.{merged}"
        else:
            shard = 0
        module = self.get_submodule(path)
        if not isinstance(module, Linear) and not isinstance(getattr(module, param, None), nn.Parameter):
            raise AttributeError(name)
        return module, param, shard

    def checkpoint_names(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint of this model holds, with its (full) shape."""
        names = {}
        for path, module in self.named_modules():
            if isinstance(module, Linear):
                parent, _, leaf = path.rpartition(".")
                parts = [k for k, (m, _) in PACKED_MODULES.items() if m == leaf] or [leaf]
                for part, size in zip(parts, module.output_sizes):
                    names[f"{parent}.{part}.weight"] = (size, module.in_features)
                    if module.bias is not None:
                        names[f"{parent}.{part}.bias"] = (size,)
            elif isinstance(module, (Embedding, RMSNorm)) or (isinstance(module, LMHead) and not self.config.tie_word_embeddings):
                names[f"{path}.weight"] = tuple(getattr(module, "full_shape", module.weight.shape))
        return names

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load ``(checkpoint name, tensor)`` pairs, one at a time, through each layer's
        loader (a merged projection places the part, a parallel one keeps its slice, a
        quantized one quantizes). Returns the names loaded."""
        expected = self.checkpoint_names()
        loaded = set()
        for name, tensor in tensors:
            if name not in expected:
                raise ValueError(f"checkpoint tensor {name} is not part of the {self.config.model_type} model")
            if tuple(tensor.shape) != expected[name]:
                raise ValueError(f"tensor {name} has shape {tuple(tensor.shape)}, the config implies {expected[name]}")
            module, param, shard = self._target(name)
            if isinstance(module, Linear):
                module.load(param, tensor, shard)
            elif isinstance(module, (Embedding, LMHead)):  # this process's rows of the vocabulary
                module.load_weight(tensor)
            else:
                with torch.no_grad():
                    getattr(module, param).copy_(tensor)
            loaded.add(name)
        return loaded

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """The weights under the checkpoint's names, merged projections split into their parts
        (the inverse of :meth:`load_weights`, for a model that is not split across processes)."""
        state = {}
        for name, shape in self.checkpoint_names().items():
            module, param, shard = self._target(name)
            if isinstance(module, Linear):
                full = module.method.dense_weight(module) if param == "weight" else module.bias
                start = sum(module.output_sizes[:shard])
                state[name] = full[start : start + shape[0]]
            else:
                state[name] = getattr(module, param)
        return state

    # -- running ----------------------------------------------------------------------------

    def forward_tokens(self, input_ids: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """Packed token ids ``(T,)`` -> final hidden states ``(T, hidden)`` (after the last norm)."""
        return self.final_norm(*self.forward_layers(self.model.embed_tokens(input_ids), None, ctx))

    def forward_layers(self, x: torch.Tensor, residual: torch.Tensor | None, ctx: AttentionContext, start: int = 0,
                       stop: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Decoder layers ``start .. stop-1`` on the hidden states ``x`` and the residual stream
        (``None`` before the first layer): a pipeline stage's share of the model."""
        for layer in self.model.layers[start:stop]:
            x, residual = layer(x, residual, ctx)
        return x, residual

    def final_norm(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The last norm, on the residual stream after the last layer (the add and the norm fused)."""
        return self.model.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def _check_ids(self, ids: torch.Tensor, host_check: bool) -> None:
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64):
            raise ValueError("token ids must be an integer tensor")
        # Checking the range reads the ids back to the CPU: harmless once per prompt, but a
        # decode step (and a CUDA graph capture) must not wait for the GPU, so it skips it.
        if host_check and ids.numel() and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size})")

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """``(batch, seq)`` token ids -> logits ``(batch, seq, vocab)``. With a cache, every
        sequence ``b`` appends ``seq`` tokens after the ones sequence ``b`` holds."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError("input_ids must be an integer tensor of shape (batch, seq)")
        b, s = input_ids.shape
        skip = input_ids.is_cuda and ((cache is not None and s == 1) or torch.cuda.is_current_stream_capturing())
        self._check_ids(input_ids, host_check=not skip)
        ctx = cache.context([s] * b) if cache is not None else AttentionContext.without_cache([s] * b, input_ids.device)
        return self.compute_logits(self.forward_tokens(input_ids.reshape(-1), ctx)).view(b, s, -1)

    def prefill(self, prompts: list[torch.Tensor], cache: KVCache, seqs: list[int] | None = None) -> torch.Tensor:
        """Prefill sequences of different lengths together (packed, no padding): prompt ``i``
        (1-D token ids) is appended to cache sequence ``seqs[i]`` (default ``i``). Returns the
        logits of each prompt's last token, ``(len(prompts), vocab)``."""
        lens = [int(p.numel()) for p in prompts]
        ids = torch.cat([p.reshape(-1) for p in prompts]).to(cache.k.device)
        self._check_ids(ids, host_check=True)
        ctx = cache.context(lens, seqs)
        last = ctx.cu_seqlens_q[1:].long() - 1
        return self.compute_logits(self.forward_tokens(ids, ctx)[last])

    def decode(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One new token for each of sequences ``0 .. B-1`` (``tokens`` (B,)), planned on the
        device so that the call can be captured in a CUDA graph and replayed for every step.
        The host's lengths (``cache.lens``) are the caller's to advance. Returns ``(B, vocab)``."""
        self._check_ids(tokens, host_check=False)
        ctx = cache.decode_context(tokens.shape[0])
        logits = self.compute_logits(self.forward_tokens(tokens, ctx))
        cache.finish_decode(ctx)
        return logits

    def cache_config(self) -> ModelConfig:
        """The config a KV cache of this process is shaped by: with tensor parallelism, its share
        of the KV heads."""
        if self.tp.size == 1:
            return self.config
        return dataclasses.replace(self.config, num_kv_heads=self.config.num_kv_heads // self.tp.size)

    def new_cache(
        self, batch: int, max_len: int, block_size: int | None = None, num_blocks: int | None = None,
        kv_dtype: torch.dtype | None = None,
    ) -> KVCache:
        """A cache for ``batch`` sequences of up to ``max_len`` tokens on the model's device and
        dtype: paged in blocks of ``block_size`` tokens, or contiguous (one block of ``max_len``
        per sequence) when ``block_size`` is None; ``kv_dtype`` int8 or float8_e4m3fn quantizes it."""
        p, config = self.lm_head.weight, self.cache_config()
        if block_size is None:
            return KVCache.contiguous(config, batch, max_len, device=p.device, dtype=p.dtype, kv_dtype=kv_dtype)
        return KVCache(config, batch, max_len, block_size, num_blocks, device=p.device, dtype=p.dtype, kv_dtype=kv_dtype)


def random_model(config: ModelConfig, device="cuda", dtype=torch.bfloat16, seed: int | None = None,
                 tp: TensorParallel = SINGLE) -> Transformer:  # fmt: skip
    """A model of this shape with N(0, 0.02) matrices and unit norms, built directly on
    ``device`` (random weights time exactly like trained ones). With a tensor-parallel ``tp``,
    this process's shard only (every shard drawn from the same ``seed``: a model to time, not
    one whole model split)."""
    with torch.device("meta"):
        model = Transformer(config, tp)
    model.to_empty(device=device).to(dtype)
    model.tie_weights()
    model.init_buffers(device)
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=generator) if p.dim() >= 2 else p.fill_(1.0)
    return model.eval()
