"""The tensor-parallel demo: over two CPU processes the tiny model's local weights halve, every
layer's hidden state and the logits match the whole model, and the forward pass calls exactly
the collectives the Megatron-LM split predicts (one all-reduce after the embedding, two per
layer, one all-gather of the logits), with the predicted bytes."""

import json

import pytest
import torch
import torch.distributed as dist

from llmnote.models import load_model
from llmnote.models.config import ModelConfig
from llmnote.parallel.demo import Collective, count_collectives, expected_collectives, layer_states, local_shapes, split_forward
from llmnote.parallel.launch import spawn
from llmnote.paths import models_dir

TINY = models_dir() / "llmnote-tiny"
CONFIG = ModelConfig.from_hf(json.loads((TINY / "config.json").read_text()))


@pytest.fixture(scope="module")
def whole():
    return load_model(TINY, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, CONFIG.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def split(ids):
    return spawn(split_forward, 2, ids)


def test_each_process_holds_half_of_every_split_weight(whole, split):
    full = local_shapes(whole)
    halved = {"embed_tokens": 0, "lm_head": 0, "qkv_proj": 0, "gate_up_proj": 0, "o_proj": 1, "down_proj": 1}
    for result in split:
        shapes = result["shapes"]
        for name, dim in halved.items():
            want = list(full[name])
            want[dim] //= 2
            assert shapes[name] == tuple(want), name
        assert shapes["query heads"] == (CONFIG.num_heads // 2,) and shapes["KV heads"] == (CONFIG.num_kv_heads // 2,)


def test_split_states_and_logits_equal_the_whole_model(whole, ids, split):
    states, logits = layer_states(whole, ids)
    assert len(states) == CONFIG.num_layers and states[0].shape == (ids.numel(), CONFIG.hidden_size)
    for result in split:
        for a, b in zip(result["states"], states, strict=True):
            torch.testing.assert_close(torch.from_numpy(a), b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.from_numpy(result["logits"]), logits, rtol=1e-5, atol=1e-4)
    assert (split[0]["logits"] == split[1]["logits"]).all()  # every rank holds the same logits, bit for bit


def test_collectives_per_forward_match_the_formula(ids, split):
    tokens = ids.numel()
    want = expected_collectives(CONFIG, tokens, 2, dtype_bytes=4)
    assert len(want) == 2 * CONFIG.num_layers + 2
    assert want[0] == Collective("all_reduce", tokens * CONFIG.hidden_size * 4)
    assert want[-1] == Collective("all_gather", tokens * CONFIG.vocab_size // 2 * 4)
    for result in split:
        assert result["collectives"] == want


def test_expected_collectives_without_a_group_and_bad_arguments():
    assert expected_collectives(CONFIG, 5, 1, 2) == []
    with pytest.raises(ValueError, match="world_size"):
        expected_collectives(CONFIG, 0, 2, 2)


def test_count_collectives_restores_the_functions_after_an_error():
    before = dist.all_reduce, dist.all_gather
    with pytest.raises(ZeroDivisionError):
        with count_collectives() as log:
            assert dist.all_reduce is not before[0]
            1 / 0  # noqa: B018
    assert (dist.all_reduce, dist.all_gather) == before and log.calls == []


def test_split_forward_checks_its_ids():
    with pytest.raises(ValueError, match="ids must be"):
        split_forward(0, 1, torch.zeros(3, dtype=torch.long))
