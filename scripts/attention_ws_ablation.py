"""What each idea of the warp-specialised Gluon kernel (``llmnote.kernels.attention.flash_ws``) buys,
at B=4, H=32, D=128, bf16, full and causal:

* ``ws``: producer warp + two consumer warpgroups, one CTA per tile, each key block's score
  product, softmax and P V one after the other (no intra-warpgroup overlap);
* ``ws+overlap``: block j's scores and block j-1's P V in flight together, the softmax
  between them;
* ``ws+persistent``, ``ws+overlap+persistent``: one CTA per SM looping over tiles (what
  ``flash_attention`` uses for full attention; causal uses one CTA per tile);
* ``+pingpong``: the two consumers take turns issuing their ``wgmma`` batches (FlashAttention-3's
  ping-pong, through a pair of mbarriers), so one's GEMMs queue while the other runs its softmax;

beside the Triton TMA kernel (``flash_attention_triton``, autotuned) and cuDNN. Every provider
is checked against cuDNN first, then the providers take turns over ``ROUNDS`` rounds, each
timed call by call and as CUDA-graph replays; a row is the faster of the two medians (as in
``python -m llmnote.bench attention``). Writes a benchmark record (kernel
``flash_attention-ws-ablation``):

    python scripts/attention_ws_ablation.py assets/benchmarks/attention_ws_ablation.json
"""

from __future__ import annotations

import statistics
import sys
from functools import partial

import torch
from tqdm.auto import tqdm

import llmnote  # noqa: F401  (device setup)
from llmnote.bench.attention import SDPA_BACKENDS, attention_pairs, sdpa_with
from llmnote.bench.timing import cuda_time_ms
from llmnote.kernels import attention
from llmnote.kernels.attention import flash_ws
from llmnote.records import Record

ROUNDS = 3
VARIANTS = {  # name: (overlap, persistent, pingpong)
    "ws": (False, False, False),
    "ws+overlap": (True, False, False),
    "ws+persistent": (False, True, False),
    "ws+overlap+persistent": (True, True, False),
    "ws+overlap+pingpong": (True, False, True),
    "ws+overlap+persistent+pingpong": (True, True, True),
}


def ws_variant(q, k, v, causal: bool, overlap: bool, persistent: bool, pingpong: bool) -> torch.Tensor:
    scale = q.shape[-1] ** -0.5 * attention.LOG2E
    return flash_ws.flash_attention_ws(q, k, v, torch.empty_like(q), causal, scale, persistent, overlap, pingpong)


def main(path: str) -> None:
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (Hopper)")
    rec = Record(command=f"python scripts/attention_ws_ablation.py {path}")
    for s, causal in tqdm([(4096, False), (4096, True), (2048, True), (8192, False), (8192, True)], desc="cases"):
        case = f"B=4,H=32,S={s},D=128,causal={causal}"
        g = torch.Generator(device="cuda").manual_seed(s)
        q, k, v = (torch.randn(4, 32, s, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        providers = {
            name: partial(ws_variant, causal=causal, overlap=o, persistent=p, pingpong=pp)
            for name, (o, p, pp) in VARIANTS.items()
        }
        providers["llmnote-triton"] = partial(attention.flash_attention_triton, causal=causal)
        providers["sdpa-cudnn"] = sdpa_with(SDPA_BACKENDS["sdpa-cudnn"], causal)
        expected = providers["sdpa-cudnn"](q, k, v).float()
        for name, fn in providers.items():
            err = ((fn(q, k, v).float() - expected).norm() / expected.norm()).item()
            if not err < 1e-2:
                raise AssertionError(f"{name} {case}: relative error {err:.2e} against cuDNN")
        graph = 10 if s <= 2048 else 2
        times = {(name, calls): [] for name in providers for calls in (0, graph)}
        for _ in range(ROUNDS):
            for (name, calls), ms in times.items():
                ms.append(cuda_time_ms(providers[name], [(q, k, v)], warmup=5, rep=20, graph_calls=calls))
        flops = 4 * 4 * 32 * attention_pairs(s, s, causal) * 128
        for name in providers:
            best = min(statistics.median(times[name, calls]) for calls in (0, graph))
            rec.add("flash_attention-ws-ablation", case, "bf16", name, best, flops)
    rec.save(path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "attention_ws_ablation.json")
