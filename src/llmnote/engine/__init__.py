"""A serving engine in the style of vLLM: block manager, scheduler, model runner, server.

- :mod:`.block_manager`: the paged KV cache's bookkeeping (blocks, reference counts, the
  prefix cache);
- :mod:`.sequence`: requests (:class:`SamplingParams`, :class:`Sequence`);
- :mod:`.scheduler`: continuous batching with chunked prefill and preemption;
- :mod:`.model_runner`, :mod:`.sampler`, :mod:`.speculative`: running steps on the model;
- :mod:`.llm` (:class:`LLM`, :class:`LLMEngine`), :mod:`.server`, :mod:`.metrics`: the front ends.
- :mod:`.workers`: tensor parallelism, the engine on rank 0 and the other ranks following its steps.

The first three are plain Python and import nothing from torch.
"""

from .block_manager import BlockManager, BlockTable, NoFreeBlocksError, block_hash
from .llm import LLM, LLMEngine
from .outputs import RequestOutput
from .scheduler import Batch, Scheduler, SchedulerConfig
from .sequence import SamplingParams, Sequence, Status

__all__ = ["BlockManager", "BlockTable", "NoFreeBlocksError", "block_hash", "Batch", "Scheduler", "SchedulerConfig"]
__all__ += ["SamplingParams", "Sequence", "Status", "LLM", "LLMEngine", "RequestOutput"]
