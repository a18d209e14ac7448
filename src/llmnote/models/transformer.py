"""A readable decoder-only transformer for the Llama and Qwen families.

Parameter names follow the Hugging Face checkpoints (``model.layers.0.self_attn.q_proj.weight``
...), so a ``state_dict`` loads as it is stored. The math is built on ``llmnote.ref``
(RMSNorm, RoPE, SwiGLU); attention is PyTorch's ``scaled_dot_product_attention`` with
grouped-query heads and a bottom-right-aligned causal mask, which is what a prefill
followed by token-by-token decoding against a KV cache needs.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import ref
from .config import ModelConfig
from .rope_scaling import rope_frequencies

__all__ = ["Transformer", "KVCache", "rope_inv_freq"]


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


class KVCache:
    """Keys and values of every layer, preallocated for ``max_len`` tokens per sequence."""

    def __init__(self, config: ModelConfig, batch: int, max_len: int, device=None, dtype=torch.float32):
        if batch < 1 or max_len < 1:
            raise ValueError(f"batch and max_len must be >= 1, got {batch} and {max_len}")
        shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0  # tokens already stored (the same for every sequence)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's ``(B, Hkv, S, D)`` keys/values; return all keys/values so far."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} tokens; {end} requested")
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ref.rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig, layer: int):
        super().__init__()
        self.c, self.layer = c, layer
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        if c.qk_norm:  # Qwen3: RMSNorm over each head's vector, before RoPE
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        c = self.c
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, c.num_heads, c.head_dim)
        k = self.k_proj(x).view(b, s, c.num_kv_heads, c.head_dim)
        v = self.v_proj(x).view(b, s, c.num_kv_heads, c.head_dim).transpose(1, 2)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = ref.apply_rope(q.transpose(1, 2), cos, sin)  # (b, heads, s, head_dim)
        k = ref.apply_rope(k.transpose(1, 2), cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        t = k.shape[2]
        # Query i (absolute position t - s + i) sees keys j <= t - s + i: causal, bottom-right
        # aligned. With no earlier tokens (t == s) that is SDPA's own is_causal, which lets it
        # pick a fused kernel; a chunk after cached tokens needs the explicit mask.
        mask = None if s in (1, t) else torch.ones(s, t, dtype=torch.bool, device=x.device).tril(diagonal=t - s)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=1 < s == t, enable_gqa=c.num_kv_heads != c.num_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, s, c.num_heads * c.head_dim))


class MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ref.silu_mul(self.gate_proj(x), self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c, layer)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Transformer(nn.Module):
    """``forward(input_ids)`` -> logits ``(batch, seq, vocab)``; pass a :class:`KVCache` to
    prefill it and then decode token by token."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        p = self.lm_head.weight
        return KVCache(self.config, batch, max_len, device=p.device, dtype=p.dtype)

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError("input_ids must be an integer tensor of shape (batch, seq)")
        # The range check reads the ids back to the CPU: on a GPU that stalls the CPU until
        # the GPU has caught up, which is harmless once per prompt but would serialise every
        # decode step (and a CUDA-graph capture forbids it), so GPU decode steps skip it.
        decode_step = cache is not None and input_ids.shape[1] == 1
        skip = input_ids.is_cuda and (decode_step or torch.cuda.is_current_stream_capturing())
        if input_ids.numel() and not skip and (input_ids.min() < 0 or input_ids.max() >= self.config.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size})")
        start = 0 if cache is None else cache.length
        positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
        cos, sin = ref.rope_cos_sin(
            input_ids.shape[1], self.config.head_dim, device=input_ids.device, positions=positions, inv_freq=self.inv_freq
        )
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, cache)
        if cache is not None:
            cache.length += input_ids.shape[1]
        return self.lm_head(self.model.norm(x))
