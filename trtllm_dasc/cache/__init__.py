"""Prefix cache bookkeeping: radix tree of KV blocks and checkpoint slots, the id allocators (ints only), and
the cache manager that owns them all (the one API the scheduler uses)."""
from trtllm_dasc.cache.allocators import AllocatorError, BlockPool, IdPool, fresh_blocks, reserve_table
from trtllm_dasc.cache.manager import CacheManager, Lease, Replay
from trtllm_dasc.cache.radix import MatchResult, Node, RadixCache

__all__ = ["AllocatorError", "BlockPool", "IdPool", "fresh_blocks", "reserve_table", "CacheManager", "Lease",
           "Replay", "MatchResult", "Node", "RadixCache"]
