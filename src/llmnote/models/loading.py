"""Load a Hugging Face checkpoint directory (config.json + *.safetensors) into :class:`Transformer`."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .. import runtime
from .config import ModelConfig
from .transformer import Transformer, rope_inv_freq

__all__ = ["load_model", "load_tokenizer", "resolve_checkpoint"]

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


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(path / name))
    return state


def load_model(path: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> Transformer:
    """Build the model described by ``path/config.json`` and load its weights.

    ``path`` is a directory (or a hub id, fetched when online). ``dtype`` defaults to the
    checkpoint's declared dtype (float32 if none); ``device`` to :func:`llmnote.runtime.device`.
    A missing, unexpected or mis-shaped tensor raises ``ValueError`` naming it.
    """
    path = resolve_checkpoint(path)
    config_file = path / "config.json"
    if not config_file.exists():
        raise FileNotFoundError(f"no config.json in {path}")
    config = ModelConfig.from_hf(json.loads(config_file.read_text()))
    if dtype is None:
        dtype = _DTYPES.get(str(config.dtype).removeprefix("torch."), torch.float32)
    if dtype not in _DTYPES.values():
        raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    device = torch.device(device) if device is not None else runtime.device()

    with torch.device("meta"):
        model = Transformer(config)
    state = _read_state_dict(path)
    expected = {name: p.shape for name, p in model.named_parameters(remove_duplicate=False)}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
        state.pop("lm_head.weight", None)  # some tied checkpoints store it anyway
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(k for k in set(state) - set(expected) if not k.endswith("rotary_emb.inv_freq"))
    if missing:
        raise ValueError(f"checkpoint {path} lacks tensors: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        raise ValueError(f"checkpoint {path} has tensors the {config.model_type} model does not use: {', '.join(unexpected[:8])}")
    for name, shape in expected.items():
        if state[name].shape != shape:
            raise ValueError(f"tensor {name} has shape {tuple(state[name].shape)}, the config implies {tuple(shape)}")
    model.load_state_dict({k: state[k].to(device=device, dtype=dtype) for k in expected}, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(config).to(device)  # the buffer was built on the meta device
    return model.eval()


def load_tokenizer(path: str | Path):
    """The ``tokenizers.Tokenizer`` saved in a checkpoint directory's ``tokenizer.json``."""
    from tokenizers import Tokenizer

    path = resolve_checkpoint(path)
    file = path / "tokenizer.json"
    if not file.exists():
        raise FileNotFoundError(f"no tokenizer.json in {path}")
    return Tokenizer.from_file(str(file))
