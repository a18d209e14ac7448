"""The roofline model and the byte/FLOP accounting of LLM work."""

import numpy as np
import pytest

from llmnote import roofline as rl
from llmnote.hw import get_gpu
from llmnote.models import MODEL_ZOO, ModelConfig


def test_roofs_meet_at_the_ridge_point():
    spec = get_gpu("H200")
    ridge = rl.ridge_point(spec, "bf16")
    assert rl.attainable_tflops(ridge, spec) == pytest.approx(spec.peak_tflops("bf16"))
    assert rl.attainable_tflops(ridge / 10, spec) == pytest.approx(spec.peak_tflops("bf16") / 10)
    assert rl.attainable_tflops(ridge * 10, spec) == pytest.approx(spec.peak_tflops("bf16"))
    curve = rl.attainable_tflops(np.logspace(-1, 4, 50), spec)
    assert np.all(np.diff(curve) >= 0)
    with pytest.raises(ValueError, match="positive"):
        rl.attainable_tflops(0.0)


def test_overrides_use_measured_ceilings():
    assert rl.attainable_tflops(1.0, "H200", bandwidth_tbps=4.0) == pytest.approx(4.0)
    assert rl.attainable_tflops(1e6, "H200", peak_tflops=700.0) == pytest.approx(700.0)


def test_matmul_accounting():
    w = rl.matmul_workload(4096, 4096, 4096, "bf16")
    assert w.flops == 2 * 4096**3
    assert w.bytes == 3 * 4096 * 4096 * 2
    assert w.intensity == pytest.approx(4096 / 3)
    assert w.bound("H200") == "compute"
    gemv = rl.matmul_workload(1, 4096, 4096, "bf16")
    assert gemv.intensity == pytest.approx(1.0, rel=1e-3)  # one multiply-add per weight read
    assert gemv.bound("H200") == "memory"
    assert gemv.min_time_s("H200") == pytest.approx(gemv.bytes / 4.8e12)
    with pytest.raises(ValueError, match="m must be a positive integer"):
        rl.matmul_workload(0, 2, 2)
    with pytest.raises(ValueError, match="dtype"):
        rl.matmul_workload(2, 2, 2, "fp12")


def test_small_batch_intensity_is_about_the_batch():
    for m in (1, 2, 8, 32):
        w = rl.matmul_workload(m, 14336, 4096, "bf16")
        assert w.intensity == pytest.approx(m, rel=0.02)


def test_elementwise_workload():
    w = rl.elementwise_workload(1 << 20, reads=2, writes=1, flops_per_element=1, dtype="fp32")
    assert w.bytes == 3 * 4 * (1 << 20)
    assert w.intensity == pytest.approx(1 / 12)
    with pytest.raises(ValueError):
        rl.elementwise_workload(10, reads=0, writes=0)


def test_llama_shapes_match_published_parameter_counts():
    s = rl.LLAMA3_8B
    assert s is MODEL_ZOO["Llama-3-8B"]
    total = s.params_per_layer * s.num_layers + 2 * s.vocab_size * s.hidden_size  # untied embedding and head
    assert total == pytest.approx(8.03e9, rel=0.01)
    s70 = rl.LLAMA3_70B
    assert s70.params_per_layer * s70.num_layers + 2 * s70.vocab_size * s70.hidden_size == pytest.approx(70.6e9, rel=0.01)
    assert s.kv_bytes_per_token("bf16") == 2 * 32 * 8 * 128 * 2  # 128 KiB per token
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        ModelConfig("llama", 10, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=6, num_kv_heads=4, head_dim=16)


def test_prefill_is_compute_bound_and_decode_is_memory_bound():
    s = rl.LLAMA3_8B
    assert rl.layer_workload(s, 1, "prefill", seq_len=2048).bound("H200") == "compute"
    assert rl.layer_workload(s, 1, "decode").bound("H200") == "memory"
    # Batching raises the intensity of decode's matmuls but not of its attention: each
    # sequence reads its own KV cache.
    by_name = {b: {w.name: w for w in rl.layer_workloads(s, b, "decode")} for b in (1, 64)}
    assert by_name[64]["attention"].intensity == pytest.approx(by_name[1]["attention"].intensity)
    assert by_name[64]["down_proj"].intensity > 50 * by_name[1]["down_proj"].intensity
    with pytest.raises(ValueError, match="phase"):
        rl.layer_workloads(s, 1, "train")
    with pytest.raises(ValueError, match="MLA"):  # a latent cache is not a Llama layer's K and V
        rl.layer_workloads(MODEL_ZOO["DeepSeek-V3"], 1, "decode")


def test_layer_workload_sums_its_ops():
    ops = rl.layer_workloads(rl.LLAMA3_8B, 4, "prefill", seq_len=128)
    total = rl.layer_workload(rl.LLAMA3_8B, 4, "prefill", seq_len=128)
    assert total.flops == pytest.approx(sum(o.flops for o in ops))
    assert total.bytes == pytest.approx(sum(o.bytes for o in ops))
    # Weights dominate the matmul FLOPs: 2 FLOPs per parameter per token.
    matmul_flops = sum(o.flops for o in ops if o.name != "attention")
    assert matmul_flops == pytest.approx(2 * rl.LLAMA3_8B.params_per_layer * 4 * 128)


def test_crossing_batch_is_where_a_decode_gemm_reaches_the_ridge():
    m = rl.crossing_batch(14336 * 2, 4096, "H200", "bf16")
    assert rl.matmul_workload(m, 28672, 4096).bound("H200") == "compute"
    assert rl.matmul_workload(m - 1, 28672, 4096).bound("H200") == "memory"
    assert rl.crossing_batch(28672, 4096, "H100 SXM") > m  # less bandwidth, higher ridge
    with pytest.raises(ValueError, match="no M below"):
        rl.crossing_batch(28672, 4096, limit=10)


def test_wave_quantization():
    assert rl.wave_quantization(3072, 3072, 132, 128, 256) == (288, 3, 288 / 396)
    assert rl.wave_quantization(1408, 1408, 132) == (121, 1, 121 / 132)
    assert rl.wave_quantization(1536, 1536, 132)[1] == 2
