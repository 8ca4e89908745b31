"""trtllm-dasc: Decay-Aware State Compression for prefix caching in hybrid linear-attention LLMs."""
__version__ = "0.1.0"
