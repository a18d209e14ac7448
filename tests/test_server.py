"""The OpenAI-compatible server, run for real (uvicorn in a subprocess) on a CPU with
llmnote-tiny: answers, streams, every kind of bad request, many concurrent clients, clients
that drop their streams, every KV block back when the server is idle; the same server split over
two processes (--tensor-parallel 2)."""

import asyncio
import json
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from llmnote.bench.serving_http import running_server
from llmnote.paths import models_dir

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


ARGS = [str(models_dir() / "llmnote-tiny"), "--dtype", "float32", "--api-key", KEY, "--served-model-name", "tiny",
        "--max-model-len", "128", "--block-size", "4", "--num-kv-blocks", "48", "--max-num-batched-tokens", "64",
        "--log-level", "warning"]  # fmt: skip


@pytest.fixture(scope="module")
def server():
    with running_server(ARGS, timeout=120, env={"OMP_NUM_THREADS": "1"}) as url:
        yield url


def post(url, path, body, headers=AUTH, **kw):
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60, **kw)


def metric(url, name, label="") -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{") and label in line]
    assert values, f"{name} not in /metrics"
    return sum(values)


def wait_idle(url):
    deadline = time.time() + 60
    while time.time() < deadline:
        if metric(url, "llmnote_kv_blocks_in_use") == 0 and metric(url, "llmnote_num_requests_running") == 0:
            return
        time.sleep(0.2)
    pytest.fail("KV blocks still in use long after every client finished")


def sse_events(response) -> list:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_open_routes_and_auth(server):
    assert httpx.get(f"{server}/health").status_code == 200
    assert httpx.get(f"{server}/metrics").status_code == 200
    r = httpx.get(f"{server}/v1/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert post(server, "/v1/completions", {"prompt": "hi"}, headers={"Authorization": "Bearer nope"}).status_code == 401
    models = httpx.get(f"{server}/v1/models", headers=AUTH).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


def test_completion_matches_the_offline_engine(server):
    from llmnote.engine import LLM, SamplingParams

    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200
    out = r.json()
    [offline] = LLM(models_dir() / "llmnote-tiny", device="cpu", dtype=__import__("torch").float32).generate(
        ["Once upon a time"], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)  # fmt: skip
    assert out["choices"][0]["text"] == offline.text
    assert out["usage"]["completion_tokens"] == 12 and out["choices"][0]["finish_reason"] == "length"
    assert out["model"] == "tiny" and post(server, "/v1/completions", {**body, "model": "tiny"}).status_code == 200


def test_streaming_equals_the_whole_answer(server):
    body = {"prompt": "The king said", "max_tokens": 20, "temperature": 0}
    whole = post(server, "/v1/completions", body).json()["choices"][0]["text"]
    with httpx.stream("POST", f"{server}/v1/completions", json={**body, "stream": True}, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == whole
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_chat_stream_and_whole(server):
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
            "max_completion_tokens": 8, "temperature": 0}  # fmt: skip
    whole = post(server, "/v1/chat/completions", body).json()
    assert whole["object"] == "chat.completion" and whole["usage"]["completion_tokens"] == 8
    with httpx.stream("POST", f"{server}/v1/chat/completions", json={**body, "stream": True}, headers=AUTH, timeout=60) as r:
        events = sse_events(r)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1])
    assert text == whole["choices"][0]["message"]["content"]


def test_stop_strings_and_extra_sampling_fields(server):
    base = {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0}
    text = post(server, "/v1/completions", base).json()["choices"][0]["text"]
    stop = text[10:13]
    cut = post(server, "/v1/completions", {**base, "stop": [stop], "top_k": 5, "min_p": 0.0, "seed": 1,
                                           "ignore_eos": True, "user": "someone"}).json()  # fmt: skip
    assert cut["choices"][0]["finish_reason"] == "stop" and cut["choices"][0]["text"] == text[: text.find(stop)]


@pytest.mark.parametrize("body,status", [
    ({"prompt": "x", "max_tokens": -3}, 400),
    ({"prompt": "x", "max_tokens": 10**12}, 400),
    ({"prompt": "word " * 200, "max_tokens": 4}, 400),  # past the context
    ({"prompt": 5}, 400),
    ({"prompt": "x", "temperature": "hot"}, 400),
    ({"prompt": "x", "top_p": 0}, 400),
    ({"prompt": [1, 99999]}, 400),
    ({"prompt": ""}, 400),
    ({"prompt": "x", "n": 2}, 400),
    ({"max_tokens": 3}, 400),
    ({"prompt": "x", "model": "gpt-4"}, 404),
])  # fmt: skip
def test_bad_requests_get_4xx_error_objects(server, body, status):
    r = post(server, "/v1/completions", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "code"} and err["message"]


def test_malformed_json_and_bad_chat(server):
    r = httpx.post(f"{server}/v1/completions", content=b'{"prompt": "x", ', headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]})
    assert r.status_code == 400
    assert post(server, "/v1/completions", {"prompt": "still up?", "max_tokens": 2}).status_code == 200


def test_many_clients_and_dropped_streams_return_every_block(server):
    async def whole(client, i):
        r = await client.post("/v1/completions", json={"prompt": f"Request {i} begins", "max_tokens": 6 + i % 7,
                                                        "temperature": 0.8, "seed": i}, headers=AUTH)  # fmt: skip
        assert r.status_code == 200
        return r.json()["usage"]["completion_tokens"]

    async def dropped(client, i):
        body = {"prompt": f"Stream {i} goes away", "max_tokens": 60, "stream": True, "ignore_eos": True}
        async with client.stream("POST", "/v1/completions", json=body, headers=AUTH) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break  # hang up after the first event
        return 0

    async def main():
        async with httpx.AsyncClient(base_url=server, timeout=120) as client:
            return await asyncio.gather(*(dropped(client, i) if i % 3 == 0 else whole(client, i) for i in range(24)))

    counts = asyncio.run(main())
    assert all(c == 6 + i % 7 for i, c in enumerate(counts) if i % 3)
    wait_idle(server)
    assert metric(server, "llmnote_request_success_total", 'finished_reason="abort"') == 8  # every dropped stream
    assert metric(server, "llmnote_request_success_total") >= 16
    assert post(server, "/v1/completions", {"prompt": "after the storm", "max_tokens": 3}).status_code == 200


def test_stream_usage_chunk(server):
    body = {"prompt": "usage please", "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, headers=AUTH, timeout=60) as r:
        events = sse_events(r)
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 5


def test_load_generator_against_the_server(server, tmp_path):
    out, png = tmp_path / "report.json", tmp_path / "latency.png"
    cmd = [sys.executable, "-m", "llmnote.bench", "load", "--url", server, "--api-key", KEY, "--num-prompts", "8",
           "--rate", "20", "--dataset", "shared-prefix", "--prefix-len", "12", "--input-len", "3-9", "--output-len", "4-7",
           "--out", str(out), "--plot", str(png)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    rep = json.loads(out.read_text())
    assert rep["completed"] == 8 and rep["failed"] == 0
    assert 8 * 4 <= rep["output_throughput"] * rep["duration_s"] <= 8 * 7 + 1e-6  # ignore_eos: every length as asked
    assert rep["ttft_ms"]["p50"] > 0 and rep["ttft_ms"]["p99"] >= rep["ttft_ms"]["p50"] and rep["itl_ms"]["p50"] > 0
    assert png.stat().st_size > 10_000
    bad = subprocess.run([sys.executable, "-m", "llmnote.bench", "load", "--url", server, "--rate", "0"], capture_output=True)
    assert bad.returncode == 2 and b"rate" in bad.stderr


def test_tensor_parallel_server_answers_as_one_process_and_its_workers_exit(server):
    """``serve --tensor-parallel 2`` on a CPU: the server process is rank 0 and starts one worker."""
    body = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}
    with running_server([*ARGS, "--tensor-parallel", "2"], timeout=180, env={"OMP_NUM_THREADS": "1"}) as url:
        port = url.rsplit(":", 1)[1]
        [parent] = [p for p in psutil.process_iter(["cmdline"]) if {"serve", port} <= set(p.info["cmdline"] or ())]
        workers = [c for c in parent.children() if "spawn_main" in " ".join(c.cmdline())]
        assert len(workers) == 1
        whole = post(url, "/v1/completions", body).json()["choices"][0]["text"]
        assert whole == post(server, "/v1/completions", body).json()["choices"][0]["text"]
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, headers=AUTH, timeout=60) as r:
            events = sse_events(r)
        assert events[-1] == "[DONE]" and "".join(e["choices"][0]["text"] for e in events[:-1]) == whole

        async def many():
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                bodies = [{"prompt": f"Request {i} begins", "max_tokens": 8 + i, "temperature": 0} for i in range(5)]
                return await asyncio.gather(*(client.post("/v1/completions", json=b, headers=AUTH) for b in bodies))

        answers = asyncio.run(many())
        assert [r.json()["usage"]["completion_tokens"] for r in answers] == [8 + i for i in range(5)]
        wait_idle(url)
        assert metric(url, "llmnote_kv_blocks_in_use") == 0
        workers[0].kill()  # a worker dies: requests fail with an error, the server stays up and says so
        deadline = time.time() + 30
        while httpx.get(f"{url}/health", timeout=10).status_code == 200 and time.time() < deadline:
            time.sleep(0.2)
        health = httpx.get(f"{url}/health", timeout=10)
        assert health.status_code == 503 and "worker 1 exited" in health.json()["error"]["message"]
        failed = post(url, "/v1/completions", body)
        assert failed.status_code >= 500 and "worker 1 exited" in failed.json()["error"]["message"]
        assert httpx.get(f"{url}/v1/models", headers=AUTH, timeout=10).status_code == 200
    deadline = time.time() + 30
    while any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)  # no worker outlives the server


def test_poisson_arrivals_and_datasets():
    from llmnote.bench.load import make_dataset, poisson_arrivals

    times = poisson_arrivals(4000, rate=50.0, seed=3)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert abs(sum(gaps) / len(gaps) - 1 / 50) < 0.002 and min(gaps) >= 0
    assert poisson_arrivals(3, float("inf")) == [0.0, 0.0, 0.0]
    specs = make_dataset("shared-prefix", 50, (5, 9), (2, 4), vocab=100, prefix_len=7)
    assert all(12 <= len(s.prompt) <= 16 and 2 <= s.max_tokens <= 4 for s in specs)
    assert len({tuple(s.prompt[:7]) for s in specs}) == 1 and len({tuple(s.prompt) for s in specs}) > 40
    with pytest.raises(ValueError):
        make_dataset("random", 3, (5, 2), (1, 1), vocab=10)
