"""Choosing a layout: which split of a model over a cluster serves a workload best, by arithmetic.

A **layout** is four degrees whose product is the number of GPUs: tensor parallelism ``TP`` (every
matrix split, Megatron-LM style), pipeline parallelism ``PP`` (the layers cut into stages), expert
parallelism ``EP`` (a mixture of experts' experts spread out; ``1`` for a dense model) and data
parallelism ``DP`` (whole copies, *replicas*, of the ``TP x PP x EP`` unit). :func:`enumerate_layouts`
lists every layout that fits in memory and models one decode step of each:

    step = weight bytes read per GPU / HBM bandwidth          (every stage, one after another)
         + KV bytes read per GPU / HBM bandwidth
         + 2 all-reduces per layer x layers  (TP)
         + one send per stage boundary        (PP)
         + 2 all-to-alls per MoE layer        (EP: dispatch and combine)

Every sequence of a replica gets one token per step, so the replica's throughput is
``batch / step`` and the cluster's is ``DP`` times that. A pipeline keeps ``PP`` micro-batches in
flight, one per stage: a micro-batch of ``batch / PP`` sequences passes all stages in one step, so
each stage reads its weights once per micro-batch and the weight term is ``weights / TP``, the same
as without the pipeline: stages add memory, not speed. With ``EP > 1`` attention runs data-parallel
over the ``EP`` groups (each holds ``batch / EP`` sequences and their KV cache), and each token goes
to its ``k`` experts and back through two all-to-alls.

Collectives follow :mod:`llmnote.parallel.collectives`' alpha-beta model with the nominal link
figures passed in: a group that fits in one server talks over NVLink, a larger one over the
network, whose slower link and longer latency then set the whole collective's time. Kernel
efficiency, overlap of communication with computation, and prefill are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..hw import DTYPE_BYTES, GPUSpec
from ..models.config import ModelConfig
from .collectives import pairwise_alltoall_time, recursive_doubling_allreduce_time, ring_allreduce_time

__all__ = ["Cluster", "Workload", "MoE", "MOE", "LLAMA_31_405B", "enumerate_layouts"]

# Llama-3.1-405B's shape, from its published config.json (meta-llama/Llama-3.1-405B).
LLAMA_31_405B = ModelConfig(model_type="llama", vocab_size=128256, hidden_size=16384, intermediate_size=53248, num_layers=126,
                            num_heads=128, num_kv_heads=8, head_dim=128, name="Llama-3.1-405B",
                            hub_id="meta-llama/Llama-3.1-405B")  # fmt: skip


@dataclass(frozen=True)
class MoE:
    """What a mixture-of-experts model's config adds: ``routed`` experts per MoE layer of which each
    token uses ``top_k``, each a SwiGLU MLP of width ``expert_intermediate``, in ``moe_layers`` layers."""

    routed: int
    top_k: int
    expert_intermediate: int
    moe_layers: int

    def routed_params(self, model: ModelConfig) -> float:
        return self.moe_layers * self.routed * 3 * model.hidden_size * self.expert_intermediate


# DeepSeek-V3's config.json: 256 routed experts (8 per token) of width 2048 in 58 of its 61 layers.
MOE = {"DeepSeek-V3": MoE(routed=256, top_k=8, expert_intermediate=2048, moe_layers=58)}


@dataclass(frozen=True)
class Cluster:
    """``servers`` servers of ``gpus_per_server`` GPUs. Link rates are per GPU and per direction in
    GB/s; ``*_alpha_s`` is the latency of one step of a collective over that link, in seconds.
    ``hbm_tbps`` overrides the datasheet bandwidth (e.g. with a measured copy bandwidth)."""

    gpu: GPUSpec
    gpus_per_server: int
    servers: int
    nvlink_gbps: float
    network_gbps: float
    nvlink_alpha_s: float = 3e-6
    network_alpha_s: float = 10e-6
    hbm_tbps: float | None = None

    @property
    def gpus(self) -> int:
        return self.gpus_per_server * self.servers

    def link(self, group: int) -> tuple[float, float]:
        """``(alpha, beta)`` of a collective over ``group`` consecutive GPUs: NVLink inside a server."""
        if group <= self.gpus_per_server:
            return self.nvlink_alpha_s, 1 / (self.nvlink_gbps * 1e9)
        return self.network_alpha_s, 1 / (self.network_gbps * 1e9)


@dataclass(frozen=True)
class Workload:
    """``batch`` sequences decoded together by each replica, each of up to ``context`` tokens, started
    from ``prompt`` tokens; ``target_ms`` is the latency allowed per output token."""

    batch: int
    context: int
    prompt: int
    target_ms: float

    @property
    def mean_context(self) -> float:
        """Tokens in a sequence's KV cache on average while it generates: halfway from prompt to context."""
        return (self.prompt + self.context) / 2


def _allreduce_s(n_bytes: float, p: int, cluster: Cluster) -> float:
    """The faster of ring and recursive doubling (what NCCL's ring/tree choice approximates)."""
    if p == 1:
        return 0.0
    alpha, beta = cluster.link(p)
    return float(min(ring_allreduce_time(n_bytes, p, alpha, beta), recursive_doubling_allreduce_time(n_bytes, p, alpha, beta)))


def _boundaries_across_servers(pp: int, stage_gpus: int, gpus_per_server: int) -> int:
    """Stage boundaries whose two sides sit in different servers (stages laid out in GPU order)."""
    return sum(1 for s in range(1, pp) if stage_gpus >= gpus_per_server or (s * stage_gpus) % gpus_per_server == 0)


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(int(math.log2(limit)) + 1)]


def enumerate_layouts(model: ModelConfig, cluster: Cluster, workload: Workload, *, weight_dtype: str = "bf16",
                      kv_dtype: str = "bf16", overhead: float = 0.10, include_unfit: bool = False) -> pd.DataFrame:  # fmt: skip
    """Every ``TP x PP x EP x DP`` layout of ``model`` on ``cluster`` (all GPUs used, ``TP`` and ``EP``
    powers of two, ``TP`` dividing the attention heads, ``EP`` the experts), with memory and a modelled
    decode step per layout, one row each, every term in its own column. A layout fits when
    weights + KV cache for ``batch x context`` tokens stay within ``(1 - overhead)`` of a GPU's memory
    (the rest is kept for activations, CUDA graphs, fragmentation). Rows that do not fit are left out
    unless ``include_unfit``. Sorted: target met first, then tokens/s per GPU, highest first."""
    if workload.batch < 1 or workload.context < 1 or not 0 <= workload.prompt <= workload.context or workload.target_ms <= 0:
        raise ValueError(f"workload needs batch >= 1, 0 <= prompt <= context and target_ms > 0, got {workload}")
    if not 0 <= overhead < 1:
        raise ValueError(f"overhead must be a fraction in [0, 1), got {overhead}")
    moe = MOE.get(model.name)
    w_bytes, h = DTYPE_BYTES[weight_dtype], model.hidden_size
    total_params = model.params_b * 1e9 if model.card_params_b is not None else model.num_params
    routed = moe.routed_params(model) if moe else 0.0
    dense = total_params - routed  # attention, dense MLPs, shared experts, embedding and head: split by TP
    kv_token = model.kv_bytes_per_token(kv_dtype)  # all layers
    hbm = (cluster.hbm_tbps or cluster.gpu.memory_tbps) * 1e12
    usable = cluster.gpu.memory_gb * 1e9 * (1 - overhead)
    rows = []
    for tp in _powers_of_two(cluster.gpus):
        for ep in _powers_of_two(cluster.gpus // tp) if moe else [1]:
            for pp in range(1, min(model.num_layers, cluster.gpus // (tp * ep)) + 1):
                replica = tp * pp * ep
                if cluster.gpus % replica or model.num_heads % tp or (moe and moe.routed % ep):
                    continue
                # Memory per GPU. Weights: dense part over TP x PP, routed experts over TP x EP x PP. KV cache: a
                # stage's layers, of its EP group's sequences, split by KV heads (an MLA latent is not split by TP).
                kv_split = 1 if model.attention == "mla" else min(tp, model.num_kv_heads)
                weights_gb = (dense / (tp * pp) + routed / (tp * ep * pp)) * w_bytes / 1e9
                kv_gb = workload.batch * workload.context * kv_token / (kv_split * pp * ep) / 1e9
                fits = (weights_gb + kv_gb) * 1e9 <= usable
                if not (fits or include_unfit):
                    continue
                # Decode step: each stage per micro-batch, times PP stages.
                micro = workload.batch / pp  # sequences per micro-batch
                tokens = micro / ep  # tokens one GPU's attention handles per micro-batch
                touched = 1 - (1 - moe.top_k / moe.routed) ** micro if moe else 0.0  # share of experts hit
                weight_ms = (dense + touched * routed / ep) * w_bytes / tp / hbm * 1e3
                kv_ms = workload.batch * workload.mean_context * kv_token / (kv_split * pp * ep) / hbm * 1e3
                tp_ms = 2 * model.num_layers * _allreduce_s(tokens * h * w_bytes, tp, cluster) * 1e3
                crossings = _boundaries_across_servers(pp, tp * ep, cluster.gpus_per_server)
                send = tokens * h * w_bytes  # one micro-batch's hidden states, per GPU
                (net_a, net_b), (nv_a, nv_b) = cluster.link(cluster.gpus_per_server + 1), cluster.link(1)
                pp_ms = (crossings * (net_a + send * net_b) + (pp - 1 - crossings) * (nv_a + send * nv_b)) * 1e3
                ep_ms = 0.0
                if moe and ep > 1:
                    a, b = cluster.link(tp * ep)
                    ep_ms = 2 * moe.moe_layers * float(pairwise_alltoall_time(tokens * moe.top_k * h * w_bytes, ep, a, b)) * 1e3
                step_ms = weight_ms + kv_ms + tp_ms + pp_ms + ep_ms
                dp = cluster.gpus // replica
                rows.append({
                    "TP": tp, "PP": pp, "EP": ep, "DP": dp, "GPUs per replica": replica,
                    "weights / GPU (GB)": weights_gb, "KV / GPU (GB)": kv_gb, "memory / GPU (GB)": weights_gb + kv_gb,
                    "fits": fits, "weights (ms)": weight_ms, "KV (ms)": kv_ms, "TP all-reduce (ms)": tp_ms,
                    "PP send (ms)": pp_ms, "EP all-to-all (ms)": ep_ms, "step (ms)": step_ms,
                    "meets target": step_ms <= workload.target_ms,
                    "tokens/s": dp * workload.batch / step_ms * 1e3,
                    "tokens/s per GPU": workload.batch / step_ms * 1e3 / replica,
                })  # fmt: skip
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    return table.sort_values(["meets target", "tokens/s per GPU"], ascending=False, ignore_index=True)
