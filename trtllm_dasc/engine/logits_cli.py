"""`dasc logits`: prefill token ids through the model runtime and write float32 logits [T, vocab] (.npy).

With --split K the first K tokens are prefilled, the recurrent state and KV cache of the request are
exported, imported into fresh state/KV objects, and the remaining tokens continue from there; the result
equals the unsplit run (the check that continuation from a stored prefix is exact).
"""
from __future__ import annotations

import os

from trtllm_dasc.errors import UserError


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    p.add_argument("--ids", required=True, help="comma-separated token ids, e.g. 1,5,9")
    p.add_argument("--out", required=True, help="output .npy file: float32 [T, vocab]")
    p.add_argument("--split", type=int, default=None, help="prefill K tokens, export/import state + KV, continue")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "fla"], help="recurrence backend")
    p.add_argument("--block-size", type=int, default=16, help="KV cache block size (tokens)")


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise UserError(f"--ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise UserError("--ids is empty")
    return ids


def run(args) -> int:
    import numpy as np
    import torch

    from trtllm_dasc.model import HybridModel, SeqInput

    ids = parse_ids(args.ids)
    T = len(ids)
    if args.split is not None and not 0 < args.split < T:
        raise UserError(f"--split must be in 1..{T - 1} for {T} tokens, got {args.split}")
    if args.block_size < 1:
        raise UserError(f"--block-size must be positive, got {args.block_size}")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise UserError(f"--out directory {out_dir!r} does not exist")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {args.device} requested but CUDA is not available")
    model = HybridModel.from_pretrained(args.model, dtype=args.dtype, device=args.device, backend=args.backend)
    bad = [t for t in ids if not 0 <= t < model.spec.vocab_size]
    if bad:
        raise UserError(f"token id(s) {bad[:5]} outside the vocabulary 0..{model.spec.vocab_size - 1}")
    blocks = -(-T // args.block_size)
    state, kv = model.new_state(1), model.new_kv_cache(blocks, args.block_size)
    if args.split is None:
        logits = model.forward([SeqInput(ids, 0)], state, kv).logits
    else:
        K = args.split
        first = model.forward([SeqInput(ids[:K], 0)], state, kv).logits
        rows, cached = state.export_rows([0]), kv.export_sequence(0)
        # fresh objects: nothing but the exported rows carries over
        state, kv = model.new_state(1), model.new_kv_cache(blocks, args.block_size)
        state.import_rows([0], rows)
        kv.import_sequence(0, cached)
        rest = model.forward([SeqInput(ids[K:], 0)], state, kv).logits
        logits = torch.cat([first, rest])
    np.save(args.out, logits.float().cpu().numpy())
    print(f"wrote {args.out}: float32 [{T}, {model.spec.vocab_size}]"
          + (f" (split at {args.split})" if args.split is not None else ""))
    return 0
