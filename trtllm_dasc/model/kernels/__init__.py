"""The model's per-op Triton kernels, one module per op with its torch reference beside it (conv.py: the
prefill's short conv and a decode step's conv; swiglu.py: the MLP's activation; gemv.py: a decode step's
few-row GEMMs; decode_attention.py: paged attention of decode steps and short chunks; tuning.py: the tiles
the decode's streaming kernels time per shape at warm-up on a GPU). The layers import
them lazily, on a GPU only, so triton loads when a kernel runs; CPU tests run each kernel in Triton's
interpreter (TRITON_INTERPRET=1) against its reference.
"""
