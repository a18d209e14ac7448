"""Load a Hugging Face checkpoint directory (config.json + *.safetensors) into :class:`Transformer`."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from .. import runtime
from ..layers import TensorParallel
from ..layers.linear import SINGLE
from .config import ModelConfig
from .transformer import Transformer

__all__ = ["load_model", "load_tokenizer", "resolve_checkpoint", "checkpoint_files", "iter_checkpoint"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_checkpoint(path_or_id: str | Path) -> Path:
    """A local directory as it is, or a hub id (``"Qwen/Qwen3-0.6B"``) downloaded into the
    Hugging Face cache (needs internet; raises a clear error without it)."""
    path = Path(path_or_id)
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{path} is a file; load_model needs a checkpoint directory")
    name = str(path_or_id)
    if name.count("/") != 1 or name.startswith(("/", ".")):
        raise FileNotFoundError(f"no checkpoint directory at {name!r} (and it is not a hub id like 'org/model')")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))
    except Exception as err:  # offline, unknown repo, gated model...
        raise FileNotFoundError(f"could not fetch {name!r} from the Hugging Face hub: {err}") from err


def checkpoint_files(path: Path) -> list[Path]:
    """The ``*.safetensors`` files of a checkpoint directory (as its index lists them, if sharded)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    return [path / name for name in files]


def iter_checkpoint(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a checkpoint, one at a time: each file is memory-mapped, and a tensor
    is read from the mapping only when it is asked for, so the host holds about one tensor."""
    from safetensors import safe_open

    for file in checkpoint_files(path):
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_model(
    path: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | None = None, linear_method=None,
    tp: TensorParallel = SINGLE,
) -> Transformer:
    """Build the model described by ``path/config.json`` and load its weights.

    ``path`` is a directory (or a hub id, fetched when online). ``dtype`` defaults to the
    checkpoint's declared dtype (float32 if none), except that a bfloat16 checkpoint loads in
    float16, with a warning, on a GPU whose tensor cores lack bfloat16 (a T4); ``device``
    defaults to :func:`llmnote.runtime.device`.
    The model is created without memory (on the meta device), then allocated on ``device``,
    and each checkpoint tensor is streamed into its layer. A missing, unexpected or
    mis-shaped tensor raises ``ValueError`` naming it.

    ``linear_method(name, layer)``, if given, picks each projection's
    :class:`~llmnote.layers.LinearMethod` (e.g. ``lambda name, layer: WeightOnly(4, 128)`` from
    :mod:`llmnote.quant.apply`); each weight is then quantized as it streams in.

    ``tp``: this process's place in a tensor-parallel group (:mod:`llmnote.parallel`); each
    projection then keeps and loads only its slice of the checkpoint's tensors.
    """
    path = resolve_checkpoint(path)
    config_file = path / "config.json"
    if not config_file.exists():
        raise FileNotFoundError(f"no config.json in {path}")
    config = ModelConfig.from_hf(json.loads(config_file.read_text()))
    device = torch.device(device) if device is not None else runtime.device()
    if dtype is None:
        dtype = _DTYPES.get(str(config.dtype).removeprefix("torch."), torch.float32)
        if dtype == torch.bfloat16 and device.type == "cuda" and runtime.half_dtype() != torch.bfloat16:
            msg = f"{path.name} is a bfloat16 checkpoint and this GPU cannot compute in bfloat16: loading it in float16"
            warnings.warn(msg, stacklevel=2)
            dtype = torch.float16
    if dtype not in _DTYPES.values():
        raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype}")

    with torch.device("meta"):
        model = Transformer(config, tp)
        if linear_method is not None:
            from ..quant.apply import swap_methods

            swap_methods(model, linear_method, load=False)
    model.to_empty(device=device).to(dtype)
    model.tie_weights()
    model.init_buffers(device)

    def tensors():
        for name, tensor in iter_checkpoint(path):
            if name.endswith("rotary_emb.inv_freq"):  # older checkpoints store RoPE's frequencies
                continue
            if name == "lm_head.weight" and config.tie_word_embeddings:  # some tied checkpoints store it anyway
                continue
            yield name, tensor

    loaded = model.load_weights(tensors())
    missing = sorted(set(model.checkpoint_names()) - loaded)
    if missing:
        raise ValueError(f"checkpoint {path} lacks tensors: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    return model.eval()


def load_tokenizer(path: str | Path):
    """The ``tokenizers.Tokenizer`` saved in a checkpoint directory's ``tokenizer.json``."""
    from tokenizers import Tokenizer

    path = resolve_checkpoint(path)
    file = path / "tokenizer.json"
    if not file.exists():
        raise FileNotFoundError(f"no tokenizer.json in {path}")
    return Tokenizer.from_file(str(file))
