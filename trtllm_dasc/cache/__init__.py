"""Prefix cache bookkeeping: radix tree of KV blocks and checkpoint slots, and the id allocators (ints only)."""
from trtllm_dasc.cache.allocators import AllocatorError, BlockPool, IdPool, fresh_blocks, reserve_table
from trtllm_dasc.cache.radix import MatchResult, Node, RadixCache

__all__ = ["AllocatorError", "BlockPool", "IdPool", "fresh_blocks", "reserve_table", "MatchResult", "Node",
           "RadixCache"]
