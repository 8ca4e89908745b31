"""dasc-build: Hugging Face checkpoint -> self-contained engine directory (like trtllm-build)."""
