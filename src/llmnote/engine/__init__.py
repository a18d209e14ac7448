"""A serving engine in the style of vLLM: block manager, scheduler, model runner, server.

:mod:`.block_manager` keeps the paged KV cache's bookkeeping (blocks, reference counts, the
prefix cache) in plain Python.
"""

from .block_manager import BlockManager, BlockTable, NoFreeBlocksError, block_hash

__all__ = ["BlockManager", "BlockTable", "NoFreeBlocksError", "block_hash"]
