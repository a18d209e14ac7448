"""The layout calculator: what fits, what it costs, and which layout wins."""

from __future__ import annotations

import pytest

from llmnote.hw import NETWORK_GBPS, get_gpu
from llmnote.models.zoo import MODEL_ZOO
from llmnote.parallel.layout import LLAMA_31_405B, Cluster, Workload, enumerate_layouts

H200 = get_gpu("H200")


def cluster(servers: int = 1, gpus_per_server: int = 8) -> Cluster:
    return Cluster(H200, gpus_per_server, servers, H200.nvlink_gbps / 2, NETWORK_GBPS["InfiniBand NDR (400 Gb/s)"])


WORK = Workload(batch=16, context=4096, prompt=1024, target_ms=50)


def test_8b_fits_one_h200_and_tp1_wins_when_the_target_allows() -> None:
    one = enumerate_layouts(MODEL_ZOO["Llama-3-8B"], cluster(1, 1), WORK)
    assert len(one) == 1 and one.loc[0, "fits"] and one.loc[0, "meets target"]
    best = enumerate_layouts(MODEL_ZOO["Llama-3-8B"], cluster(), WORK).iloc[0]
    assert (best.TP, best.PP, best.DP) == (1, 1, 8)


def test_a_tight_target_needs_tensor_parallelism() -> None:
    tight = Workload(batch=16, context=4096, prompt=1024, target_ms=2.5)
    best = enumerate_layouts(MODEL_ZOO["Llama-3-8B"], cluster(), tight).iloc[0]
    assert best["meets target"] and best.TP > 1


def test_405b_does_not_fit_on_one_gpu() -> None:
    assert enumerate_layouts(LLAMA_31_405B, cluster(1, 1), WORK).empty
    unfit = enumerate_layouts(LLAMA_31_405B, cluster(1, 1), WORK, include_unfit=True)
    assert not unfit.loc[0, "fits"] and unfit.loc[0, "weights / GPU (GB)"] > H200.memory_gb


def test_layouts_that_do_not_fit_are_excluded() -> None:
    everything = enumerate_layouts(MODEL_ZOO["Llama-3-70B"], cluster(), WORK, include_unfit=True)
    fitting = enumerate_layouts(MODEL_ZOO["Llama-3-70B"], cluster(), WORK)
    assert (~everything.fits).any() and fitting.fits.all()
    assert len(fitting) == everything.fits.sum()
    assert not ((fitting.TP == 1) & (fitting.PP == 1)).any()  # 141 GB of weights leave no room on one GPU
    usable = H200.memory_gb * 0.9
    assert (fitting["memory / GPU (GB)"] <= usable).all()


def test_memory_per_gpu_divides_by_tp_times_pp() -> None:
    t = enumerate_layouts(MODEL_ZOO["Llama-3-8B"], cluster(), WORK).set_index(["TP", "PP"])
    whole = t.loc[(1, 1), "weights / GPU (GB)"]
    for (tp, pp), row in t.iterrows():
        assert row["weights / GPU (GB)"] == pytest.approx(whole / (tp * pp))
    assert t.loc[(8, 1), "KV / GPU (GB)"] == pytest.approx(t.loc[(1, 1), "KV / GPU (GB)"] / 8)


def test_tensor_parallel_time_grows_with_tp() -> None:
    t = enumerate_layouts(MODEL_ZOO["Llama-3-70B"], cluster(2), WORK).query("PP == 1").set_index("TP")
    comm = t["TP all-reduce (ms)"].sort_index()
    assert comm.is_monotonic_increasing and comm.iloc[0] < comm.iloc[-1]
    assert t.loc[16, "TP all-reduce (ms)"] > 5 * t.loc[8, "TP all-reduce (ms)"]  # TP=16 crosses InfiniBand


def test_pipeline_stages_do_not_cut_the_weight_time() -> None:
    t = enumerate_layouts(LLAMA_31_405B, cluster(2), WORK).set_index(["TP", "PP"])
    assert t.loc[(8, 2), "weights (ms)"] == pytest.approx(t.loc[(8, 1), "weights (ms)"])
    assert t.loc[(8, 2), "PP send (ms)"] > 0 and t.loc[(8, 1), "PP send (ms)"] == 0


def test_experts_only_for_a_mixture_of_experts() -> None:
    dense = enumerate_layouts(MODEL_ZOO["Llama-3-70B"], cluster(), WORK)
    moe = enumerate_layouts(MODEL_ZOO["DeepSeek-V3"], cluster(), WORK, weight_dtype="fp8")
    assert (dense.EP == 1).all() and (moe.EP > 1).any()
    assert (moe.query("EP > 1")["EP all-to-all (ms)"] > 0).all()


def test_bad_workload_is_an_error() -> None:
    with pytest.raises(ValueError, match="prompt"):
        enumerate_layouts(MODEL_ZOO["Llama-3-8B"], cluster(), Workload(batch=1, context=100, prompt=200, target_ms=10))
