"""Prefix cache bookkeeping: radix tree of KV blocks and checkpoint slots (token ids and ints only)."""
from trtllm_dasc.cache.allocators import BlockAllocator, SlotFreeList
from trtllm_dasc.cache.radix import MatchResult, Node, RadixCache

__all__ = ["BlockAllocator", "SlotFreeList", "MatchResult", "Node", "RadixCache"]
