"""The engine that starts its own tensor-parallel workers, on CPU processes (gloo): one process's
greedy outputs under preemption, chunked prefill and steps launched ahead; a step message
carries only what the step consumes; the workers stop on close(); a worker that dies makes
rank 0 raise instead of hang. (Under torchrun's way of starting: tests/test_parallel.py; the
server with --tensor-parallel: tests/test_server.py.)"""

import subprocess
import sys
import threading
import time

import pytest
import torch

from llmnote.engine import LLM, SamplingParams
from llmnote.engine.model_runner import Work
from llmnote.engine.workers import Driver, step_message
from llmnote.paths import models_dir

TINY = models_dir() / "llmnote-tiny"
ENGINE = dict(device="cpu", dtype=torch.float32, block_size=4, num_kv_blocks=14, max_num_batched_tokens=16, max_num_seqs=3)
LONG = "Once upon a time there was a king who had three daughters, and the youngest was the fairest of them all"
PROMPTS = ["The king said", LONG, "ROMEO.", "In the beginning"]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def same(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a is b or a == b


def test_a_step_message_carries_the_ids_the_step_consumes_not_the_history():
    history = list(range(100, 140))  # 40 tokens, 4 to a block
    decode, chunk = Work(history, list(range(10)), 39, 1), Work(history, [20, 21, 22, 23], 8, 8, sample=False)
    kind, on_device, items = step_message([decode, chunk], ids_on_device=False)
    assert kind == "step" and not on_device
    assert items == [([139], list(range(10)), 39, 1, True), (list(range(108, 116)), [20, 21, 22, 23], 8, 8, False)]
    assert step_message([decode], ids_on_device=True)[2] == [(None, list(range(10)), 39, 1, True)]
    # a worker rebuilds each item from the message alone (offset = start): the same step, planned
    rebuilt = [Work(ids, blocks, start, n, sample, offset=start) for ids, blocks, start, n, sample in items]
    runner = LLM(TINY, **{**ENGINE, "num_kv_blocks": 32}).engine.runner
    (ids, ctx, rows, order), (want_ids, want_ctx, want_rows, want_order) = runner.plan(rebuilt), runner.plan([decode, chunk])
    assert torch.equal(ids, want_ids) and torch.equal(rows, want_rows) and order == want_order
    assert all(same(getattr(ctx, f), getattr(want_ctx, f)) for f in vars(want_ctx))
    meta, lens, tables = runner.decode_inputs(rebuilt[:1], 2)
    want_meta, want_lens, want_tables = runner.decode_inputs([decode], 2)
    assert (meta == want_meta).all() and (lens == want_lens).all() and (tables == want_tables).all() and meta[0, 0] == 139


def test_engine_started_in_process_gives_the_greedy_outputs_of_one_process():
    want = [o.token_ids for o in LLM(TINY, **ENGINE).generate(PROMPTS, GREEDY, use_tqdm=False)]
    with LLM(TINY, tensor_parallel_size=2, **ENGINE) as llm:
        engine = llm.engine
        [worker] = engine.driver.procs
        assert worker.is_alive() and engine.runner.cache.k.shape[3] == 1  # one of the two KV heads
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert [o.token_ids for o in outs] == want
        assert len(outs[1].prompt_token_ids) > ENGINE["max_num_batched_tokens"]  # so its prefill ran in chunks
        assert engine.scheduler.num_preemptions > 0  # the small pool forced preemption
        ahead = [s for s in engine.step_log if s["ahead"]]
        assert len(ahead) > 5  # steps launched ahead: the worker took their input ids from the broadcast tokens
        assert llm.kv_blocks_in_use() == 0
        messages = engine.driver.messages
        assert len(messages) == len(engine.step_log)  # one message a step (no sequence ended early)
        assert sum(m["ids_on_device"] for m in messages) == len(ahead)
        assert max(m["bytes"] for m in messages) < 400  # a few ids, block tables and positions
    assert not worker.is_alive() and worker.exitcode == 0  # close() stopped it
    assert llm.engine.driver.closed


def test_a_worker_that_dies_inside_a_step_makes_rank_0_raise_not_hang(monkeypatch):
    """The worker is killed while generate runs; rank 0's next collective fails as its socket
    closes (the check for a dead process before each step is switched off, so that the collective
    is what notices)."""
    monkeypatch.setattr(Driver, "_check", lambda self: None)
    llm = LLM(TINY, tensor_parallel_size=2, **{**ENGINE, "num_kv_blocks": 200})
    [worker] = llm.engine.driver.procs
    killed = []

    def kill_after_a_few_steps():
        deadline = time.monotonic() + 120
        while len(llm.engine.step_log) < 5 and time.monotonic() < deadline:
            time.sleep(0.005)
        worker.kill()
        killed.append(time.monotonic())

    threading.Thread(target=kill_after_a_few_steps, daemon=True).start()
    with pytest.raises(RuntimeError, match="worker 1 exited with code -9") as raised:
        llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=400, ignore_eos=True), use_tqdm=False)
    assert killed and time.monotonic() - killed[0] < 30  # raised soon after the worker died
    assert "Connection" in str(raised.value.__cause__)  # gloo's error, from inside the step
    with pytest.raises(RuntimeError, match="worker 1 exited"):  # and the engine goes on refusing, at once
        llm.generate(["The king said"], GREEDY, use_tqdm=False)
    llm.close()


def test_a_dead_worker_is_seen_before_the_next_step():
    llm = LLM(TINY, tensor_parallel_size=2, **ENGINE)
    engine, [worker] = llm.engine, llm.engine.driver.procs
    engine.add_request("The king said", GREEDY)
    for _ in range(3):
        engine.step()
    worker.kill()
    worker.join()
    with pytest.raises(RuntimeError, match="worker 1 exited with code -9") as raised:
        engine.step()
    assert raised.value.__cause__ is None  # no collective was tried
    llm.close()


def test_a_worker_that_dies_while_starting_makes_rank_0_raise(tmp_path):
    """A script that builds the engine without an ``if __name__ == "__main__"`` guard: the worker,
    a fresh interpreter, runs the script again and fails before it joins the group."""
    script = tmp_path / "unguarded.py"
    script.write_text(f"from llmnote.engine import LLM\nLLM({str(TINY)!r}, device='cpu', tensor_parallel_size=2)\n")
    start = time.monotonic()
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and time.monotonic() - start < 60
    assert "RuntimeError: tensor-parallel worker 1 exited with code 1 while starting" in run.stderr
    assert "bootstrapping phase" in run.stderr  # the worker's own error, on the same stderr
