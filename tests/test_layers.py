"""The layers library and the model's caches: merged and sharded Linears, paged and
contiguous KV caches on batches of different lengths, packed prefill, device-planned decode,
and streaming checkpoint loading."""

import json
import random
import subprocess
import sys
import textwrap

import pytest
import torch

from llmnote import kernels, ref
from llmnote.layers import Dense, KVCache, Linear, TensorParallel
from llmnote.models import ModelConfig, random_model

CONFIG = ModelConfig(
    model_type="llama", vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
    head_dim=8, max_position_embeddings=64,
)
QWEN3 = ModelConfig(
    model_type="qwen3", vocab_size=53, hidden_size=32, intermediate_size=40, num_layers=2, num_heads=4, num_kv_heads=1,
    head_dim=16, qk_norm=True, qkv_bias=False, tie_word_embeddings=True, max_position_embeddings=64,
)


def model_for(config):
    torch.manual_seed(0)
    model = random_model(config, device="cpu", dtype=torch.float32, seed=0)
    with torch.no_grad():  # larger weights than N(0, 0.02), so attention is far from uniform
        for p in model.parameters():
            p.mul_(10.0) if p.dim() >= 2 else p.add_(torch.randn_like(p) * 0.2)
    return model


# -- Linear ----------------------------------------------------------------------------------


def test_merged_linear_places_each_part_in_its_rows():
    torch.manual_seed(0)
    parts = [torch.randn(6, 5), torch.randn(2, 5), torch.randn(2, 5)]
    layer = Linear(5, [6, 2, 2], bias=False)
    for i, w in enumerate(parts):
        layer.load("weight", w, shard=i)
    x = torch.randn(3, 5)
    outs = layer.split(layer(x))
    for out, w in zip(outs, parts):
        torch.testing.assert_close(out, x @ w.T)
    with pytest.raises(ValueError, match=r"part 1 must have shape \(2, 5\)"):
        layer.load("weight", torch.randn(3, 5), shard=1)
    with pytest.raises(ValueError, match="no bias"):
        layer.load("bias", torch.randn(2), shard=1)


def test_column_and_row_parallel_slices_recompose_the_full_product():
    torch.manual_seed(0)
    w, b, x = torch.randn(8, 6), torch.randn(8), torch.randn(4, 6)
    full = x @ w.T + b
    # Column-parallel: each of 2 ranks holds half the outputs (of each part); concatenated, they are the product.
    cols = []
    for rank in range(2):
        layer = Linear(6, [4, 4], bias=True, parallel="column", tp=TensorParallel(rank, 2))
        layer.load("weight", w[:4], 0), layer.load("weight", w[4:], 1)
        layer.load("bias", b[:4], 0), layer.load("bias", b[4:], 1)
        cols.append(layer.split(layer(x)))
    torch.testing.assert_close(torch.cat([cols[0][0], cols[1][0], cols[0][1], cols[1][1]], dim=-1), full)
    # Row-parallel: each rank multiplies its slice of the inputs; the partial products sum to it.
    partial = []
    for rank in range(2):
        layer = Linear(6, 8, bias=True, parallel="row", tp=TensorParallel(rank, 2))
        layer.load("weight", w)
        partial.append(layer.method.apply(layer, x[:, rank * 3 : (rank + 1) * 3], None))
    torch.testing.assert_close(partial[0] + partial[1] + b, full)
    with pytest.raises(ValueError, match="multiples of the tensor-parallel size"):
        Linear(6, [3, 4], parallel="column", tp=TensorParallel(0, 2))


def test_a_linear_method_decides_how_weights_are_stored_and_applied():
    class Rounded(Dense):  # a stand-in for a quantized method: it changes the weights as they load
        def load_rows(self, layer, weight, rows):
            super().load_rows(layer, weight.round(), rows)

    w, x = torch.randn(4, 3) * 3, torch.randn(2, 3)
    layer = Linear(3, 4, method=Rounded())
    layer.load("weight", w)
    torch.testing.assert_close(layer(x), x @ w.round().T)


# -- the model's fused ops: kernel (interpreter) against reference ------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_layer_kernels_match_references(dtype):
    torch.manual_seed(0)
    x, r, w = (torch.randn(5, 40, dtype=dtype) for _ in range(2)), None, torch.randn(40, dtype=dtype)
    x, r = x
    for got, want in zip(kernels.add_rms_norm(x, r, w, 1e-5), ref.add_rms_norm(x, r, w, 1e-5)):
        torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
    qkv = torch.randn(7, (4 + 2 + 2) * 16, dtype=dtype)  # column slices of a merged projection
    q, k = qkv[:, :64].view(7, 4, 16), qkv[:, 64:96].view(7, 2, 16)
    positions = torch.tensor([0, 3, 1, 9, 2, 2, 5])
    cos, sin = ref.rope_cos_sin(12, 16)
    for got, want in zip(kernels.rotary_embedding(q, k, positions, cos, sin), ref.rotary_embedding(q, k, positions, cos, sin)):
        torch.testing.assert_close(got, want)
    # rotary_embedding at positions p equals apply_rope with the tables of those positions
    c, s = ref.rope_cos_sin(7, 16, positions=positions)
    rotated = ref.apply_rope(q.transpose(0, 1), c, s).transpose(0, 1)
    torch.testing.assert_close(ref.rotary_embedding(q, k, positions, cos, sin)[0], rotated)
    caches = [torch.zeros(4, 3, 2, 16, dtype=dtype) for _ in range(4)]
    slots = torch.tensor([5, 0, -1, 11, 7, 2, 3])
    kernels.store_kv(k, 2 * k, caches[0], caches[1], slots)
    ref.store_kv(k, 2 * k, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert torch.equal(caches[0].view(-1, 2, 16)[11], k[3]) and caches[0].view(-1, 2, 16)[[1, 4, 6]].abs().sum() == 0


def test_fused_layer_ops_reject_bad_input():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="residual"):
        ref.add_rms_norm(x, torch.randn(3, 9), torch.ones(8))
    cos, sin = ref.rope_cos_sin(4, 8)
    with pytest.raises(TypeError, match="positions"):
        ref.rotary_embedding(torch.randn(2, 1, 8), torch.randn(2, 1, 8), torch.zeros(2), cos, sin)
    with pytest.raises(ValueError, match="agree"):
        ref.rotary_embedding(torch.randn(2, 1, 8), torch.randn(3, 1, 8), torch.zeros(2, dtype=torch.long), cos, sin)
    cache = torch.zeros(2, 4, 1, 8)
    with pytest.raises(TypeError, match="slot_mapping"):
        ref.store_kv(torch.randn(2, 1, 8), torch.randn(2, 1, 8), cache, cache.clone(), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="outside a cache of 8 slots"):
        ref.store_kv(torch.randn(1, 1, 8), torch.randn(1, 1, 8), cache, cache.clone(), torch.tensor([8]))


# -- caches: paged, contiguous and none agree ----------------------------------------------------


def expected_logits(model, seqs):
    """Each sequence alone through the model without a cache: logits (len, vocab)."""
    with torch.no_grad():
        return [model(s[None])[0] for s in seqs]


def new_cache(model, kind, batch, max_len):
    if kind == "contiguous":
        return model.new_cache(batch, max_len)
    cache = model.new_cache(batch, max_len, block_size=4)
    random.Random(0).shuffle(cache.free)  # blocks come from anywhere in the pool
    return cache


@pytest.mark.parametrize("config", [CONFIG, QWEN3], ids=["llama-gqa", "qwen3-mqa-tied"])
@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_caches_give_the_logits_of_the_whole_sequence_for_different_lengths(config, kind):
    model = model_for(config)
    torch.manual_seed(1)
    lens, steps = [5, 11, 3], 6
    seqs = [torch.randint(0, config.vocab_size, (n + steps,)) for n in lens]
    want = expected_logits(model, seqs)
    cache = new_cache(model, kind, len(lens), 24)
    with torch.no_grad():
        # packed prefill of prompts of three lengths, in a different order than the cache's
        last = model.prefill([seqs[2][:3], seqs[0][:5], seqs[1][:11]], cache, seqs=[2, 0, 1])
        for i, j in enumerate([2, 0, 1]):
            torch.testing.assert_close(last[i], want[j][lens[j] - 1], atol=1e-4, rtol=1e-4)
        for step in range(steps):
            tokens = torch.stack([s[n + step] for s, n in zip(seqs, lens)])
            if step % 2:  # planned on the device (as a CUDA graph replays it)...
                cache.reserve_decode(len(lens))
                logits = model.decode(tokens, cache)
                cache.advance(len(lens))
            else:  # ...or by the host
                logits = model(tokens[:, None], cache)[:, 0]
            for b, n in enumerate(lens):
                torch.testing.assert_close(logits[b], want[b][n + step], atol=1e-4, rtol=1e-4)
    assert cache.lens == [n + steps for n in lens] and cache.seq_lens.tolist() == cache.lens
    if kind == "paged":
        used = [blk for t in cache.tables for blk in t]
        assert len(used) == sum(-(-(n + steps) // 4) for n in lens) == len(set(used))  # blocks owned once
        assert sorted(used) != used  # and scattered through the pool


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_a_chunk_after_cached_tokens_attends_to_them(kind):
    model = model_for(CONFIG)
    torch.manual_seed(2)
    seqs = [torch.randint(0, CONFIG.vocab_size, (n,)) for n in (9, 14)]
    want = expected_logits(model, seqs)
    cache = new_cache(model, kind, 2, 16)
    with torch.no_grad():
        model.prefill([seqs[0][:4], seqs[1][:6]], cache)
        last = model.prefill([seqs[0][4:], seqs[1][6:]], cache)  # chunks of 5 and 8 after the cached tokens
    torch.testing.assert_close(last, torch.stack([want[0][-1], want[1][-1]]), atol=1e-4, rtol=1e-4)


def test_cache_bookkeeping_errors_and_rewind():
    model = model_for(CONFIG)
    cache = model.new_cache(2, 8, block_size=4, num_blocks=3)
    with torch.no_grad():
        model.prefill([torch.arange(8), torch.arange(3)], cache)
        with pytest.raises(ValueError, match="out of KV blocks"):
            model.prefill([torch.arange(2)], cache, seqs=[1])
        with pytest.raises(ValueError, match="at most 8 per sequence"):
            model(torch.zeros(2, 1, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="different numbers of tokens"):
        _ = cache.length
    free = len(cache.free)
    cache.truncate(0, 3)  # gives back the second block of sequence 0
    assert len(cache.free) == free + 1 and cache.lens == [3, 3] and cache.length == 3
    with pytest.raises(ValueError, match="exceeds the model's 64 positions"):
        KVCache(CONFIG, 1, 65)


# -- checkpoints -------------------------------------------------------------------------------


def test_checkpoint_state_round_trips_through_load_weights():
    model = model_for(QWEN3)
    state = model.checkpoint_state()
    assert "model.layers.0.self_attn.k_proj.weight" in state and "lm_head.weight" not in state  # tied
    assert state["model.layers.1.mlp.up_proj.weight"].shape == (40, 32)
    other = random_model(QWEN3, device="cpu", dtype=torch.float32, seed=1)
    assert set(other.load_weights(state.items())) == set(state)
    ids = torch.randint(0, QWEN3.vocab_size, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(other(ids), model(ids))
    with pytest.raises(ValueError, match="not part of the qwen3 model"):
        other.load_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(40, 32))])


def test_loading_streams_a_sharded_checkpoint_without_holding_it(tmp_path):
    """The whole checkpoint never sits in host memory besides the model: the process's peak
    anonymous memory grows by the model's size and about one tensor, not twice the model."""
    from safetensors.torch import save_file

    config = ModelConfig(
        model_type="llama", vocab_size=512, hidden_size=512, intermediate_size=1536, num_layers=6, num_heads=8,
        num_kv_heads=2, head_dim=64, max_position_embeddings=64,
    )
    model = random_model(config, device="cpu", dtype=torch.float32, seed=0)
    state = {k: v.contiguous() for k, v in model.checkpoint_state().items()}
    del model
    names, shards = sorted(state), 4
    weight_map = {}
    for i in range(shards):
        part = {n: state[n] for n in names[i::shards]}
        save_file(part, tmp_path / f"model-{i}.safetensors")
        weight_map |= {n: f"model-{i}.safetensors" for n in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 512, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6,
        "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 64, "torch_dtype": "float32",
    }))
    model_bytes = sum(t.numel() * 4 for t in state.values())
    largest = max(t.numel() * 4 for t in state.values())
    del state
    script = textwrap.dedent(f"""
        import threading, time
        def anon():
            for line in open("/proc/self/status"):
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
        import torch
        from llmnote.models import ModelConfig, load_model, random_model
        tiny = ModelConfig(model_type="llama", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
                           num_kv_heads=1, head_dim=8, max_position_embeddings=8)
        random_model(tiny, device="cpu", dtype=torch.float32)  # one-time costs of building any model
        base, peak, done = anon(), [0], False
        def watch():
            while not done:
                peak[0] = max(peak[0], anon())
                time.sleep(0.0005)
        t = threading.Thread(target=watch); t.start()
        model = load_model({str(tmp_path)!r}, device="cpu")
        done = True; t.join()
        print(max(peak[0], anon()) - base)
    """)
    grew = int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()[-1])
    assert grew < model_bytes + 3 * largest + 24 * 2**20, (grew, model_bytes, largest)
    assert model_bytes > 3 * largest + 24 * 2**20  # so that holding the checkpoint as well would fail the check


def test_the_kernel_path_runs_the_model_like_the_reference_path(monkeypatch):
    """What a GPU runs (the Triton kernels: varlen prefill, paged decode, the fused norm,
    rotary and cache-write kernels), here in Triton's interpreter, against the references."""
    import llmnote.layers.attention
    import llmnote.layers.norm
    import llmnote.layers.rotary
    import llmnote.models.transformer

    model = model_for(CONFIG)
    torch.manual_seed(1)
    lens = [5, 11, 3]
    seqs = [torch.randint(0, CONFIG.vocab_size, (n + 2,)) for n in lens]
    want = expected_logits(model, seqs)
    for module in (llmnote.layers.attention, llmnote.layers.norm, llmnote.layers.rotary, llmnote.models.transformer):
        monkeypatch.setattr(module, "ops_for", lambda t: kernels)
    cache = model.new_cache(3, 24, block_size=4)
    with torch.no_grad():
        model.prefill([s[:2] for s in seqs], cache)
        got = [model.prefill([s[2:n] for s, n in zip(seqs, lens)], cache)]  # chunks after cached tokens
        for step in range(2):
            cache.reserve_decode(3)
            got.append(model.decode(torch.stack([s[n + step] for s, n in zip(seqs, lens)]), cache))
            cache.advance(3)
    for step, logits in enumerate(got):
        torch.testing.assert_close(logits, torch.stack([w[n - 1 + step] for w, n in zip(want, lens)]), atol=1e-4, rtol=1e-4)


def test_the_model_runs_under_autocast_as_training_and_evaluation_do():
    """bf16 autocast leaves the weights and the residual stream in float32 and makes the matrix
    products' outputs bfloat16: the norms must take both (on a GPU, ``train`` runs this way)."""
    model = model_for(QWEN3)  # Qwen3 also normalises each head's q and k
    ids = torch.randint(0, QWEN3.vocab_size, (2, 9))
    with torch.no_grad():
        exact = model(ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = model(ids)
    assert (mixed.float() - exact).norm() / exact.norm() < 0.05


def _tensor_parallel_mlp(rank: int, world: int, port: int, results) -> None:
    """One process of a 2-way tensor-parallel MLP: column-parallel up, row-parallel down."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # every rank draws the same full weights and input
        w_up, w_down, b_down, x = torch.randn(8, 6), torch.randn(6, 8), torch.randn(6), torch.randn(3, 6)
        tp = TensorParallel(rank, world)
        up = Linear(6, 8, parallel="column", tp=tp)
        down = Linear(8, 6, bias=True, parallel="row", tp=tp)
        up.load("weight", w_up)
        down.load("weight", w_down)
        down.load("bias", b_down)
        with torch.no_grad():
            results[rank] = down(torch.relu(up(x)))  # the all-reduce inside makes every rank's output whole
    finally:
        dist.destroy_process_group()


def test_a_column_then_row_parallel_pair_computes_the_full_product_across_processes():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_tensor_parallel_mlp, args=(2, port, results), nprocs=2, join=True)
    torch.manual_seed(0)
    w_up, w_down, b_down, x = torch.randn(8, 6), torch.randn(6, 8), torch.randn(6), torch.randn(3, 6)
    expected = torch.relu(x @ w_up.T) @ w_down.T + b_down
    for rank in range(2):
        torch.testing.assert_close(results[rank], expected)
