"""Where a decode step of the Llama-3.2-1B-shaped model spends its time: the kernels of one
step (batch 1, 1K context, paged cache) under torch.profiler, grouped by name."""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from llmnote.bench.decode import SHAPES, filled_cache
from llmnote.models import random_model


def main(batch: int = 1, context: int = 1024) -> None:
    model = random_model(SHAPES["llama-3.2-1b"])
    cache = filled_cache(model, batch, context)
    token = torch.randint(0, 1000, (batch,), device="cuda")
    with torch.no_grad():
        for _ in range(5):
            model.decode(token, cache)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            model.decode(token, cache)
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                graph.replay()
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
