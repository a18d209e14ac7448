"""The multi-GPU benchmark's harness at toy sizes on CPU processes (gloo): one smoke run through
the command line gives a valid record whose case keys follow the suite's patterns; the bus
bandwidth and the alpha-beta fit on synthetic times; the prediction's arithmetic; NVLink
multicast off in the processes started; the engine split in two gives one process's outputs."""

import json
import os
import re

import pytest

from llmnote.bench import comm, parallel
from llmnote.bench.__main__ import main, merged
from llmnote.bench.decode import SHAPES, kv_bytes
from llmnote.parallel.collectives import fit_alpha_beta
from llmnote.parallel.launch import MULTICAST_OFF, spawn
from llmnote.records import Record, load_record, validate_record


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """``python -m llmnote.bench parallel --smoke --out FILE``: every part, two gloo processes."""
    out = tmp_path_factory.mktemp("parallel") / "parallel.json"
    assert main(["parallel", "--smoke", "--out", str(out)]) == 0
    return load_record(out.stem, out.parent)


def test_smoke_record_is_valid_and_its_cases_follow_the_patterns(smoke):
    validate_record(smoke)
    rows = smoke["rows"]
    collectives = [r for r in rows if r["kernel"] in comm.COLLECTIVES]
    assert {r["kernel"] for r in collectives} == set(comm.COLLECTIVES)
    for r in collectives:
        op, p, nbytes = re.fullmatch(r"(\w+),gpus=(\d+),bytes=(\d+)", r["case"]).groups()
        assert op == r["kernel"] and p == "2" and r["provider"] == "gloo"
        # the row's rate is the bus bandwidth of its time
        assert r["tbps"] * 1e12 == pytest.approx(comm.bus_bandwidth(op, int(nbytes), 2, r["median_ms"] * 1e-3))
    fits = smoke["meta"]["alpha_beta"]
    assert {f"{op},gpus=2" for op in comm.COLLECTIVES} <= set(fits)
    assert {"allreduce,gpus=2,decode", "allgather,gpus=2,decode"} <= set(fits)
    for r in (r for r in rows if r["kernel"] == "alpha-beta"):
        assert r["case"] in fits and r["provider"] == "fit"
        assert r["median_ms"] == pytest.approx(fits[r["case"]]["alpha_s"] * 1e3)
    decode = [r for r in rows if r["kernel"] == "tp-decode"]
    assert {re.fullmatch(r"tiny,batch=(\d+),tp=(\d+)", r["case"]).groups() for r in decode} == {
        (b, t) for b in ("1", "4") for t in ("1", "2")}  # fmt: skip
    providers = {t: {r["provider"] for r in decode if r["case"].endswith(f"tp={t}")} for t in (1, 2)}
    assert {"llmnote", "predicted", "predicted-memory", "predicted-compute"} <= providers[1]
    assert not {p for p in providers[1] if "communication" in p}  # one process: nothing to send
    assert {"llmnote-communication", "predicted-communication"} <= providers[2]
    assert {r["kernel"] for r in rows} >= {"copy", "matmul", "serving-tp"}
    assert sorted(r["case"] for r in rows if r["kernel"] == "serving-tp") == ["6 requests,tp=1", "6 requests,tp=2"]
    meta = smoke["meta"]
    assert meta["gpus"] == 2 and meta["group_sizes"] == [1, 2]
    assert meta["multicast_off"] == MULTICAST_OFF  # checked in every process the run started


def test_engine_split_in_two_gives_the_greedy_outputs_of_one_process(smoke):
    same = smoke["meta"]["serving_tp_identical"]
    assert same == {"tp": 2, "identical": 6, "requests": 6}


def test_bus_bandwidth_convention():
    gib = 1 << 30
    assert comm.bus_bandwidth("allreduce", gib, 8, 0.01) == pytest.approx(gib / 0.01 * 2 * 7 / 8)
    for op in ("allgather", "reducescatter", "alltoall"):
        assert comm.bus_bandwidth(op, gib, 4, 0.01) == pytest.approx(gib / 0.01 * 3 / 4)
    assert comm.bus_factor("allreduce", 1) == 0  # one process moves nothing
    with pytest.raises(ValueError, match="op must be"):
        comm.bus_factor("broadcast", 2)
    with pytest.raises(ValueError, match="positive"):
        comm.bus_bandwidth("allreduce", gib, 2, 0)


def test_alpha_beta_fit_recovers_known_latency_and_bandwidth():
    alpha, beta = 12e-6, 1 / 350e9
    sizes = comm.SIZES
    got_alpha, got_beta = fit_alpha_beta(sizes, [alpha + beta * n for n in sizes])
    assert got_alpha == pytest.approx(alpha, rel=1e-6) and got_beta == pytest.approx(beta, rel=1e-6)
    rec = Record(command="test")
    times = {("allreduce", n): (alpha + beta * n) * 1e3 for n in sizes}  # milliseconds, as the ranks report
    fits = comm.fit_lines(rec, times, ["allreduce"], 8, "bf16")
    assert fits["allreduce"] == (pytest.approx(alpha, rel=1e-6), pytest.approx(beta, rel=1e-6))
    [row] = rec.rows
    assert row["case"] == "allreduce,gpus=8" and row["median_ms"] == pytest.approx(alpha * 1e3)
    assert row["tbps"] * 1e12 == pytest.approx(2 * 7 / 8 / beta)  # the line's bus bandwidth
    assert rec.extra_meta["alpha_beta"]["allreduce,gpus=8"]["bytes"] == [1 << 10, 1 << 30]


def test_prediction_of_a_tensor_parallel_decode_step():
    llama = SHAPES["llama-3-8b"]
    one = parallel.predict_decode_ms(llama, 1, 1024, 1, copy_tbps=4.0, matmul_tflops=700.0)
    weights = 2 * llama.num_matmul_params
    assert one["memory"] == pytest.approx((weights + kv_bytes(llama, 1, 1025)) / 4e12 * 1e3)
    assert one["communication"] == 0 and one["step"] == pytest.approx(max(one["memory"], one["compute"]))
    alpha, beta = 10e-6, 1e-11
    two = parallel.predict_decode_ms(llama, 64, 1024, 2, 4.0, 700.0, allreduce=(alpha, beta), allgather=(2 * alpha, beta))
    sixty_four = parallel.predict_decode_ms(llama, 64, 1024, 1, 4.0, 700.0)
    assert two["memory"] == pytest.approx(sixty_four["memory"] / 2) and two["compute"] == pytest.approx(sixty_four["compute"] / 2)
    comm = 65 * (alpha + beta * 64 * 4096 * 2) + 2 * alpha + beta * 64 * 128256 * 2  # 2 L + 1 all-reduces, one all-gather
    assert two["communication"] == pytest.approx(comm * 1e3)
    assert two["step"] == pytest.approx(max(two["memory"], two["compute"]) + two["communication"])
    with pytest.raises(ValueError, match="fits"):
        parallel.predict_decode_ms(llama, 1, 1024, 2, 4.0, 700.0)
    with pytest.raises(ValueError, match="KV heads"):
        parallel.predict_decode_ms(llama, 1, 1024, 16, 4.0, 700.0, (alpha, beta), (alpha, beta))


def _environment(rank: int, world_size: int) -> dict:
    return {name: os.environ.get(name) for name in MULTICAST_OFF}


def test_processes_started_have_nvlink_multicast_off(monkeypatch):
    for name in MULTICAST_OFF:
        monkeypatch.delenv(name, raising=False)
    assert spawn(_environment, 2) == [MULTICAST_OFF, MULTICAST_OFF]
    assert {name: os.environ[name] for name in MULTICAST_OFF} == MULTICAST_OFF  # the parent too: later children inherit


def test_cli_refuses_without_two_gpus_and_smoke_writes_only_where_told(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["parallel", "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "at least 2 GPUs" in err and "2, 4 and 8" in err and "torch sees 1" in err
    assert not (tmp_path / "p.json").exists()
    monkeypatch.setattr(parallel, "run_parallel", lambda **options: Record(command="x", rows=[], extra_meta=options))
    default = load_record("parallel")
    assert main(["parallel", "--smoke", "--parts", "engine"]) == 0
    assert "nothing written" in capsys.readouterr().out and load_record("parallel") == default
    with pytest.raises(SystemExit):
        main(["decode", "--gpus", "2"])


def test_extra_meta_is_optional_kept_on_merge_and_cannot_replace_the_required_keys():
    old = Record(command="first", rows=[], extra_meta={"gpus": 8, "group_sizes": [2, 8], "alpha_beta": {"a": 1}})
    old.add("allreduce", "allreduce,gpus=8,bytes=1024", "bf16", "nccl", 0.01)
    new = Record(command="second", rows=[], extra_meta={"gpus": 2, "group_sizes": [1, 2], "alpha_beta": {"b": 2}})
    new.add("tp-decode", "llama3-8b,batch=1,tp=2", "bf16", "llmnote", 5.0)
    both = merged(old.to_dict(), new)
    meta = both.to_dict()["meta"]
    assert meta["gpus"] == 8 and meta["group_sizes"] == [1, 2, 8] and meta["alpha_beta"] == {"a": 1, "b": 2}
    assert {r["kernel"] for r in both.rows} == {"allreduce", "tp-decode"} and meta["command"] == "first && second"
    two = Record(command="on two GPUs")  # another machine: other cases of the same kernel
    two.add("allreduce", "allreduce,gpus=2,bytes=1024", "bf16", "nccl", 0.02)
    cases = {r["case"] for r in merged(old.to_dict(), two, by_case=True).rows}
    assert cases == {f"allreduce,gpus={p},bytes=1024" for p in (2, 8)}
    assert [r["case"] for r in merged(old.to_dict(), two).rows] == ["allreduce,gpus=2,bytes=1024"]
    plain = Record(command="plain")
    plain.add("copy", "bytes=1 MiB", "bf16", "torch", 1.0)
    assert set(validate_record(json.loads(json.dumps(plain.to_dict())))["meta"]) <= {"gpu", "torch", "triton", "date",
                                                                                    "command", "device"}  # fmt: skip
    with pytest.raises(ValueError, match="extra_meta"):
        Record(command="x", rows=plain.rows, extra_meta={"gpu": "mine"}).to_dict()
