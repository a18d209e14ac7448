"""The model configuration, read from a Hugging Face ``config.json``.

One dataclass covers the Llama family (Llama 2, 3, 3.x with ``llama3`` RoPE scaling),
Qwen2/2.5 (bias on the q, k, v projections) and Qwen3 (RMSNorm on q and k per head,
explicit ``head_dim``). Both the older layout (``rope_theta`` + ``rope_scaling``) and
transformers 5's ``rope_parameters`` are understood.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hw import DTYPE_BYTES

__all__ = ["ModelConfig", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # llama3: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    dtype: str | None = None  # the checkpoint's declared dtype, e.g. "bfloat16"
    # Accounting (the model zoo): who the shape is, and what its parameter count cannot show.
    name: str | None = None  # e.g. "Llama-3-8B"
    hub_id: str | None = None  # e.g. "meta-llama/Meta-Llama-3-8B"
    kv_lora_rank: int = 0  # MLA (DeepSeek-V2/V3): width of the cached key-value latent; 0 otherwise
    rope_head_dim: int = 0  # MLA: width of the one RoPE key cached beside the latent
    card_params_b: float | None = None  # the model card's total (billions) where the shape cannot give it
    card_active_params_b: float | None = None  # the card's parameters per token, for mixture-of-experts models

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads ({self.num_kv_heads})"
            )

    @property
    def num_params(self) -> int:
        """Parameters, counted from the shapes (embedding and head counted once if tied)."""
        h, d = self.hidden_size, self.head_dim
        small = (self.num_heads + 2 * self.num_kv_heads) * d * self.qkv_bias + h * self.o_bias + 2 * d * self.qk_norm
        small += (2 * self.intermediate_size + h) * self.mlp_bias + 2 * h  # biases and the two RMSNorm weights
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (self._layer_matrices + small) + embed + h

    @property
    def num_matmul_params(self) -> int:
        """Weights that multiply every token's activations: each layer's projections and the
        LM head (the embedding lookup is no matrix product); a forward pass costs about twice
        this many FLOPs per token, plus attention's."""
        return self.num_layers * self._layer_matrices + self.vocab_size * self.hidden_size

    @property
    def _layer_matrices(self) -> int:
        h, d = self.hidden_size, self.head_dim
        attn = h * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * h
        return attn + 3 * h * self.intermediate_size

    @property
    def params_per_layer(self) -> int:
        """Weights of one decoder layer's projections: q, k, v, o and the SwiGLU MLP's three
        matrices (the norms' and biases' few parameters left out)."""
        return self._layer_matrices

    @property
    def attention(self) -> str:
        """``"mla"`` (a cached latent, ``kv_lora_rank > 0``), ``"mha"`` (a key-value head per
        query head), ``"mqa"`` (one key-value head) or ``"gqa"`` (groups of query heads)."""
        if self.kv_lora_rank:
            return "mla"
        if self.num_kv_heads == self.num_heads:
            return "mha"
        return "mqa" if self.num_kv_heads == 1 else "gqa"

    @property
    def params_b(self) -> float:
        """Total parameters in billions: the model card's figure if given, else counted from the
        shape and rounded to a tenth of a billion, as model cards quote it."""
        return self.card_params_b if self.card_params_b is not None else round(self.num_params / 1e9, 1)

    @property
    def active_params_b(self) -> float:
        """Parameters in billions that one token passes through (fewer than ``params_b`` only
        for a mixture of experts)."""
        return self.card_active_params_b if self.card_active_params_b is not None else self.params_b

    def kv_numbers_per_token(self) -> int:
        """Numbers one token adds to the KV cache over all layers: a key and a value per
        key-value head, or (MLA) one latent and one RoPE key."""
        if self.kv_lora_rank:
            return self.num_layers * (self.kv_lora_rank + self.rope_head_dim)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype: str = "bf16") -> float:
        """KV-cache bytes one token adds over all layers, in ``dtype`` (a key of ``hw.DTYPE_BYTES``)."""
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
        return self.kv_numbers_per_token() * DTYPE_BYTES[dtype]

    @classmethod
    def from_hf(cls, hf: dict) -> ModelConfig:
        """Translate a Hugging Face config dict; unsupported features raise ``ValueError``."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"unsupported architecture model_type={model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        if hf.get("use_sliding_window"):
            raise ValueError("sliding-window attention (use_sliding_window=true) is not supported")
        rope = dict(hf.get("rope_parameters") or {})
        if not rope:
            rope = {"rope_theta": hf.get("rope_theta", 10000.0), **(hf.get("rope_scaling") or {})}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"unsupported rope scaling type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
        heads = hf["num_attention_heads"]
        attention_bias = bool(hf.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_scaling={k: v for k, v in rope.items() if k not in ("rope_theta", "rope_type", "type")}
            if rope_type == "llama3"
            else None,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=False if model_type == "qwen2" else attention_bias,
            mlp_bias=bool(hf.get("mlp_bias", False)) if model_type == "llama" else False,
            qk_norm=model_type == "qwen3",
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            dtype=hf.get("dtype") or hf.get("torch_dtype"),
        )
