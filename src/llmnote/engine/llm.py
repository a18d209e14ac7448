"""The engine: requests in, a step at a time, text out.

:class:`LLMEngine` ties the parts together. ``add_request`` tokenizes and queues a request;
each ``step`` asks the :class:`~llmnote.engine.scheduler.Scheduler` for a batch, runs it on the
:class:`~llmnote.engine.model_runner.ModelRunner`, hands the sampled tokens back to the
scheduler, and turns them into text deltas. :class:`LLM` is the offline front end with the
interface of vLLM's class of the same name: ``generate`` a list of prompts to completion.

With ``tensor_parallel_size=N`` the model is split over ``N`` processes, and the engine over
two roles (:mod:`llmnote.engine.workers`). Rank 0 is the whole engine above: requests,
tokenizer, scheduler, block manager, sampling, metrics; its runner holds one shard of the
model. Ranks 1 to ``N - 1`` are workers, each a runner over its shard and nothing else. At every
step rank 0 sends them one small message on a CPU channel (the token ids the step consumes,
the block tables, the positions) and they run the same forward pass with it, joining its
all-reduces; rank 0 alone samples, and broadcasts the sampled tokens on the model's group for a
step launched ahead. In a plain process the engine starts the workers itself and
:meth:`LLMEngine.close` stops them; under ``torchrun`` the other ranks' engines are the workers,
and ``LLM.generate`` on them follows rank 0's call and returns its outputs.
"""

from __future__ import annotations

import json
import time
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import runtime
from ..models import load_model, load_tokenizer, resolve_checkpoint
from .block_manager import BlockManager
from .metrics import EngineMetrics
from .model_runner import Launched, ModelRunner, Work
from .outputs import Detokenizer, RequestOutput
from .scheduler import Batch, Scheduler, SchedulerConfig
from .sequence import SamplingParams, Sequence
from .speculative import Round, SpeculativeDecoder
from .workers import Channel, Driver, Worker, join_group, stop_on_error

__all__ = ["LLM", "LLMEngine"]

_CPU_KV_BYTES = 1 << 30  # the default KV pool on a CPU
_GPU_MEMORY_FRACTION = 0.9  # of the memory left after the weights, on a GPU


def _eos_token_id(path: Path, tokenizer) -> int | None:
    for name in ("generation_config.json", "config.json"):
        file = path / name
        if file.exists():
            eos = json.loads(file.read_text()).get("eos_token_id")
            if eos is not None:
                return eos[0] if isinstance(eos, list) else int(eos)
    return None


@dataclass
class _Request:
    request_id: str
    seq: Sequence
    detok: Detokenizer
    generator: torch.Generator | None
    stream: bool = True  # text deltas at every step; else the text once, when it finishes


class LLMEngine:
    """A model, its tokenizer, a KV pool, a scheduler; ``step()`` advances every request."""

    def __init__(self, model, *, device=None, dtype=None, block_size: int = 16, num_kv_blocks: int | None = None,
                 max_num_seqs: int = 256, max_num_batched_tokens: int | None = None, max_model_len: int | None = None,
                 enable_prefix_caching: bool = True, enable_chunked_prefill: bool = True, enforce_eager: bool = False,
                 kv_dtype: torch.dtype | None = None, speculative_model=None, num_speculative_tokens: int = 0,
                 tensor_parallel_size: int = 1):  # fmt: skip
        path = resolve_checkpoint(model)
        if tensor_parallel_size > 1 and speculative_model is not None:
            raise ValueError("speculative decoding with tensor parallelism is not supported")
        self.worker: Worker | None = None  # on ranks other than 0: follows rank 0's steps
        self.driver: Driver | None = None  # on rank 0 of a tensor-parallel group: sends them
        shard_args = dict(dtype=dtype, block_size=block_size, num_kv_blocks=num_kv_blocks, max_num_seqs=max_num_seqs,
                          max_model_len=max_model_len, enforce_eager=enforce_eager, kv_dtype=kv_dtype)  # fmt: skip
        self.tp, device, procs = join_group(tensor_parallel_size, device, path, shard_args)  # procs: workers started here
        with stop_on_error(procs):
            channel = Channel(self.tp.rank) if self.tp.size > 1 else None
            self.model = load_model(path, device=device, dtype=dtype, tp=self.tp)
            self.draft = None
            if speculative_model is not None:
                if num_speculative_tokens < 1:
                    raise ValueError("a speculative model needs num_speculative_tokens >= 1")
                p = self.model.lm_head.weight
                self.draft = load_model(resolve_checkpoint(speculative_model), device=p.device, dtype=p.dtype)
                if self.draft.config.vocab_size != self.model.config.vocab_size:
                    raise ValueError(f"the draft's vocabulary ({self.draft.config.vocab_size}) differs from the target's "
                                     f"({self.model.config.vocab_size})")  # fmt: skip
            elif num_speculative_tokens:
                raise ValueError("num_speculative_tokens needs a speculative_model")
            longest = min(m.config.max_position_embeddings for m in (self.model, self.draft) if m is not None)
            max_model_len = max_model_len or longest
            if not 0 < max_model_len <= longest:
                raise ValueError(f"max_model_len must be in 1..{longest}, got {max_model_len}")
            if num_kv_blocks is None:
                num_kv_blocks = self._default_blocks(block_size, kv_dtype, max_num_seqs, max_model_len)
            if num_kv_blocks < 1:
                raise ValueError(f"num_kv_blocks must be >= 1, got {num_kv_blocks}")
            if channel is not None:  # one pool size on every rank: the fewest blocks any rank has room for
                num_kv_blocks = channel.smallest(num_kv_blocks)
            # A verifying pass scores k + 1 one-token rows per sequence (the draft's first pass of a
            # round up to two): the runners' CUDA graphs must hold that many rows, or those passes run eagerly.
            k = num_speculative_tokens if self.draft is not None else 0
            runner_args = (num_kv_blocks, block_size, max_num_seqs * (k + 1), max_model_len, enforce_eager, kv_dtype)
            self.runner = ModelRunner(self.model, *runner_args)
        if self.tp.rank > 0:  # a worker: a runner over its shard, nothing else
            self.worker = Worker(self.tp, channel, self.runner)
            return
        if channel is not None:
            self.driver = Driver(self.tp, channel, procs)
            if procs is not None:  # stop the workers on close(), when the engine is collected, or at exit
                weakref.finalize(self, self.driver.close)
        self.tokenizer = load_tokenizer(path)
        self.eos_token_id = _eos_token_id(path, self.tokenizer)
        self.model_name, self.model_path = str(model), path
        self.blocks = BlockManager(num_kv_blocks, block_size, enable_prefix_caching)
        budget = max_num_batched_tokens or max(8192, 0 if enable_chunked_prefill else max_model_len)
        self.scheduler = Scheduler(self.blocks, SchedulerConfig(max_num_seqs, budget, max_model_len, enable_chunked_prefill, k))
        self.spec = None
        if self.draft is not None:
            draft_args = (num_kv_blocks, block_size, 2 * max_num_seqs, max_model_len, enforce_eager, kv_dtype)
            self.spec = SpeculativeDecoder(ModelRunner(self.draft, *draft_args), k)
            self.spec.prepare(self.runner, max_num_seqs)  # greedy rounds on the device
        self.requests: dict[str, _Request] = {}
        self._next_id = 0
        self.metrics = EngineMetrics(self.model_name)
        # per step: start, end of scheduling, end of the model and sampling, end; sequences, tokens
        # (host clocks: on a GPU the step's one copy of the sampled tokens waits for the device)
        self.step_log: deque[dict] = deque(maxlen=100_000)
        self._ahead: tuple[Batch, Launched | Round] | None = None  # a step launched ahead (see _look_ahead)

    def close(self) -> None:
        """Stop the worker processes this engine started (``tensor_parallel_size > 1`` in a plain
        process) and leave their process group; nothing to do otherwise. Also runs when the engine
        is garbage-collected or the interpreter exits."""
        if self.driver is not None:
            self.driver.close()

    def failure(self) -> str | None:
        """Why this engine cannot run another step, or ``None``: with tensor parallelism, a worker
        that died or a step that failed across the group (the ranks are then out of step for good)."""
        if self.driver is None:
            return None
        return self.driver.failure or self.driver.dead_workers()

    def _engine_only(self) -> None:
        if self.worker is not None:
            raise RuntimeError(f"rank {self.tp.rank} of the tensor-parallel group follows rank 0, which runs the engine: "
                               "call LLM.generate on every rank, or drive the engine on rank 0 alone")  # fmt: skip

    def _default_blocks(self, block_size: int, kv_dtype, max_num_seqs: int, max_model_len: int) -> int:
        """The KV pool when none is given: what memory allows (on a GPU, a fraction of what is free
        now), but no more than twice what a full batch of the longest sequences can fill, since
        blocks beyond that could only cache prefixes. The cap matters to small engines sharing a
        GPU (several notebooks at once): a pool sized by free memory alone would take it all."""
        p = self.model.lm_head.weight
        elem = torch.empty((), dtype=kv_dtype or p.dtype).element_size()
        per_block = sum(2 * m.config.num_layers * block_size * m.cache_config().num_kv_heads * m.config.head_dim * elem
                        for m in (self.model, self.draft) if m is not None)  # fmt: skip
        if p.is_cuda:
            free, _ = torch.cuda.mem_get_info(p.device)
            budget, where = int(free * _GPU_MEMORY_FRACTION) - (1 << 30), f"{free / 2**30:.1f} GiB free on {p.device}"
        else:
            budget, where = _CPU_KV_BYTES, f"the CPU pool of {_CPU_KV_BYTES / 2**30:.0f} GiB"
        per_seq = -(-max_model_len // block_size)
        blocks = min(budget // per_block, 2 * max_num_seqs * per_seq)
        if blocks < per_seq:
            raise RuntimeError(f"{where} leave room for {max(blocks, 0)} KV blocks of {block_size} tokens, fewer than one "
                               f"sequence of max_model_len={max_model_len} needs ({per_seq}): free memory, lower "
                               "max_model_len or pass num_kv_blocks")  # fmt: skip
        return blocks

    # -- requests ---------------------------------------------------------------------------

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        self._engine_only()
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt).ids
        elif isinstance(prompt, list | tuple) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        else:
            raise TypeError(f"a prompt is a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.model.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"token ids must lie in [0, {vocab})")
        return ids

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, stream: bool = True) -> str:  # fmt: skip
        """Queue a request; ``ValueError`` if it is malformed or could never fit. ``stream=False``:
        no text deltas while it runs (unless stop strings need them); its text comes whole at the end."""
        self._engine_only()
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        seq = Sequence(self.tokenize(prompt), params, eos_token_id=self.eos_token_id)
        self.scheduler.add(seq)
        request_id = request_id or f"req-{self._next_id}"
        self._next_id += 1
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.runner.device).manual_seed(params.seed)
        self.requests[request_id] = _Request(request_id, seq, Detokenizer(self.tokenizer, params.stop), generator,
                                             stream or bool(params.stop))  # fmt: skip
        return request_id

    def abort(self, request_id: str) -> None:
        """Drop a request (a client went away): its blocks return at once."""
        self._engine_only()
        req = self.requests.pop(request_id, None)
        if req is not None:
            self.scheduler.finish(req.seq, "abort")
            if self.spec:
                self.spec.forget(req.seq)
            self.metrics.finished.labels(self.model_name, "abort").inc()
            self.metrics.refresh(self)

    def has_unfinished(self) -> bool:
        self._engine_only()
        return self.scheduler.has_unfinished()

    def kv_blocks_in_use(self) -> int:
        self._engine_only()
        return self.blocks.blocks_in_use()

    # -- a step -----------------------------------------------------------------------------

    def _output(self, req: _Request, delta: str, output_ids: list[int]) -> tuple[RequestOutput, str]:
        """The request's state after this step. While it runs (a stream reads its delta) the
        prompt list is the sequence's own, never changed, and ``metrics`` stays empty: copying a
        request's history at every step would cost time quadratic in its length."""
        s = req.seq
        if not s.finished:
            return RequestOutput(req.request_id, s.prompt_token_ids, output_ids, req.detok.text, None,
                                 s.num_cached_tokens), delta  # fmt: skip
        metrics = {"arrival_time": s.arrival_time, "first_scheduled_time": s.first_scheduled_time,
                   "first_token_time": s.first_token_time, "token_times": list(s.token_times),
                   "num_preemptions": s.num_preemptions}  # fmt: skip
        out = RequestOutput(req.request_id, list(s.prompt_token_ids), output_ids, req.detok.text,
                            s.finish_reason, s.num_cached_tokens, metrics)  # fmt: skip
        return out, delta

    def _look_ahead(self, batch: Batch, launched: Launched, params: list, generators: list) -> tuple[Batch, Launched] | None:
        """Launch the next decode step before this one's tokens reach the host, feeding it the
        tokens this one sampled straight from the device, so that the GPU never waits for the
        host's bookkeeping between two steps. Only where the next step is certain to be this
        batch again: decodes only, every running sequence in it, nobody waiting, no sequence
        at its last token by length, and room in the pool for one more token each (grown
        here, as scheduling would). A sequence that ends on EOS or a stop string meanwhile has
        computed one token too many, whose result is dropped (the scheduler skips finished
        sequences); its slot lies past its last token, in a block never cached."""
        if self.spec is not None:
            return None
        following = self._following(batch, 1, 1)
        if following is None:
            return None
        work = [Work(s.token_ids, s.table.blocks, len(s.token_ids), 1) for s in batch.seqs]
        return following, self._launch(work, params, generators, ids=launched.device)

    def _following(self, batch: Batch, emitted: int, slots: int) -> Batch | None:
        """The batch of the step after this one if it is certain to be this batch again, with
        the pool grown for it: decodes only, every running sequence in it, nobody waiting, each
        sequence short of its last token by more than the ``emitted`` tokens this step may add,
        and room for ``slots`` more tokens each (grown here, as scheduling would); else ``None``."""
        sched, blocks = self.scheduler, self.blocks
        if not batch.is_decode_only or not all(batch.samples) or sched.waiting or len(sched.running) != len(batch):
            return None
        if any(len(s.token_ids) + emitted >= s.max_len for s in batch.seqs):
            return None
        if sum(max(0, blocks.blocks_for(len(s.token_ids) + slots) - len(s.table)) for s in batch.seqs) > blocks.num_free_blocks:
            return None
        following = Batch()
        for seq in batch.seqs:
            blocks.grow(seq.table, len(seq.token_ids) + slots)
            following.seqs.append(seq)
            following.num_tokens.append(1)
            following.samples.append(True)
        return following

    def _spec_look_ahead(self, batch: Batch) -> tuple[Batch, Round] | None:
        """Launch the next greedy round of speculation before this one's tokens reach the host
        (as :meth:`_look_ahead` does for plain steps), from the state this round leaves on the
        device. This round emits up to ``k + 1`` tokens and the next as many again: every
        sequence needs room for both (in blocks, and short of its last token), and the pool
        grows to hold the next round's drafts, positions up to ``L + 2k``."""
        k = self.spec.k
        following = self._following(batch, 2 * k + 1, 2 * k + 1)
        if following is None:
            return None
        return following, self.spec.launch(following, fresh=False)

    def _launch(self, work: list[Work], params: list, generators: list, ids: torch.Tensor | None = None) -> Launched:
        """Run a step on the runner; with tensor parallelism, on every rank (the driver sends it)."""
        if self.driver is None:
            return self.runner.launch(work, params, generators, ids)
        return self.driver.launch(self.runner, work, params, generators, ids)

    def step(self) -> list[tuple[RequestOutput, str]]:
        """Run one batch. Returns ``(output so far, new text)`` for every streamed request that
        got a token this step and for every request that finished (a request added with
        ``stream=False`` reports only then); finished requests leave the engine."""
        self._engine_only()
        start = time.perf_counter()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and any(not s.finished for s in ahead[0].seqs):
            batch, launched = ahead  # launched during the last step (see _look_ahead)
        else:
            if ahead is not None:  # every sequence in it finished: its tokens are dropped
                ahead[1].tokens()
            batch, launched = self.scheduler.schedule(), None
        if not batch.seqs:
            return []
        scheduled = time.perf_counter()
        context = sum(s.num_computed + n for s, n in zip(batch.seqs, batch.num_tokens))  # keys each step attends to
        by_seq = {req.seq: req for req in self.requests.values()}
        # (a step launched ahead may hold sequences that have finished since: they get nothing)
        sampling = [by_seq[s] for s, sample in zip(batch.seqs, batch.samples) if sample and s in by_seq]
        params, generators = [r.seq.params for r in sampling], [r.generator for r in sampling]
        k = self.spec.rounds(batch) if self.spec and batch.is_decode_only and all(batch.samples) else 0
        if launched is None and k and self.spec.can_launch(batch):
            launched = self.spec.launch(batch)  # a greedy round on the device
        if isinstance(launched, Round):
            self._ahead = self._spec_look_ahead(batch)
            tokens = launched.tokens()
        elif k:
            tokens = self.spec.step(batch, self.runner, params, generators, k)
        else:
            launched = launched or self._launch(Work.of(batch), params, generators)
            self._ahead = self._look_ahead(batch, launched, params, generators)
            tokens = launched.tokens()
            if self.spec:
                self.spec.follow(batch)
        ran = time.perf_counter()
        self.scheduler.update(batch, tokens, ran)
        results = []
        for seq, sample in zip(batch.seqs, batch.samples):
            req = by_seq.get(seq)
            if not sample or req is None:
                continue
            if not (req.stream or seq.finished):
                continue  # its output comes once, when it finishes
            output_ids = seq.output_token_ids
            delta = req.detok.update(output_ids, final=seq.finished)
            if req.detok.stopped and not seq.finished:
                self.scheduler.finish(seq, "stop")
            out = self._output(req, delta, output_ids)
            results.append(out)
            if seq.finished:
                del self.requests[req.request_id]
                self.metrics.observe_finished(out[0], ran)
                if self.spec:
                    self.spec.forget(seq)
        end = time.perf_counter()
        self.step_log.append({"start": start, "scheduled": scheduled, "ran": ran, "end": end, "seqs": len(batch),
                              "tokens": batch.total_tokens, "context_tokens": context, "decode_only": batch.is_decode_only,
                              "ahead": ahead is not None and launched is ahead[1]})  # fmt: skip
        self.metrics.observe_step(self, len(batch), batch.total_tokens, end - start, len(batch.preempted))
        return results


class LLM:
    """Offline generation with the interface of vLLM's ``LLM``: ``LLM(model).generate(prompts, params)``.
    With ``tensor_parallel_size=N`` in a plain process it starts ``N - 1`` worker processes:
    :meth:`close` (or leaving a ``with LLM(...) as llm:`` block) stops them."""

    def __init__(self, model, *, device=None, dtype=None, block_size: int = 16, num_kv_blocks: int | None = None,
                 max_num_seqs: int = 256, max_num_batched_tokens: int | None = None, max_model_len: int | None = None,
                 enable_prefix_caching: bool = True, enforce_eager: bool = False, speculative_model=None,
                 num_speculative_tokens: int = 0, **engine_args):  # fmt: skip
        device = device if device is not None else runtime.device()
        self.engine = LLMEngine(model, device=device, dtype=dtype, block_size=block_size, num_kv_blocks=num_kv_blocks,
                                max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                max_model_len=max_model_len, enable_prefix_caching=enable_prefix_caching,
                                enforce_eager=enforce_eager, speculative_model=speculative_model,
                                num_speculative_tokens=num_speculative_tokens, **engine_args)  # fmt: skip

    @property
    def tokenizer(self):
        self.engine._engine_only()
        return self.engine.tokenizer

    def kv_blocks_in_use(self) -> int:
        """Blocks held by unfinished requests (0 when idle; evictable cached blocks do not count)."""
        return self.engine.kv_blocks_in_use()

    def close(self) -> None:
        """Stop the tensor-parallel worker processes the engine started (nothing to do otherwise)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:  # fmt: skip
        """Complete every prompt (strings or lists of token ids); outputs in prompt order.
        Every request is checked before any runs: one that could never fit raises ``ValueError``.
        Under ``torchrun`` with tensor parallelism, every rank calls this with the same arguments:
        rank 0 runs the engine, the others run the steps it sends them, and every rank returns
        rank 0's outputs (or raises its exception)."""
        driver, worker = self.engine.driver, self.engine.worker
        if worker is not None:
            return worker.follow()
        try:
            outputs = self._generate(prompts, sampling_params, use_tqdm)
        except Exception as err:
            if driver is not None:
                driver.share(False, err)
            raise
        if driver is not None:
            driver.share(True, outputs)
        return outputs

    def _generate(self, prompts, sampling_params, use_tqdm: bool) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        engine, sched = self.engine, self.engine.scheduler
        for p, sp in zip(prompts, params):  # refuse up front, before anything is queued
            seq = Sequence(engine.tokenize(p), sp or SamplingParams())
            sched.check(seq)
        ids = [engine.add_request(p, sp, stream=False) for p, sp in zip(prompts, params)]
        done: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="generating", disable=not use_tqdm, unit="req") as bar:
            while engine.has_unfinished():
                for out, _ in engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
        return [done[i] for i in ids]
