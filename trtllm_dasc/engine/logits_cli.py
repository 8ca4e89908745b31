"""`dasc logits`: prefill token ids through the model runtime and write float32 logits [T, vocab] (.npy).

With --split K the first K tokens are prefilled and their recurrent state is stored as a checkpoint
through the real checkpoint pool (--wmax/--codec decide what it keeps), loaded back into a fresh state
row (omitted units zero-filled; --policy wr also replays the last W cached tokens and merges them), and
the remaining tokens continue on the shared KV blocks. With --wmax 0 --codec native the result equals the
unsplit run; other settings show what compression does to the logits.
"""
from __future__ import annotations

import os

from trtllm_dasc.errors import UserError


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    p.add_argument("--ids", required=True, help="comma-separated token ids, e.g. 1,5,9")
    p.add_argument("--out", required=True, help="output .npy file: float32 [T, vocab]")
    p.add_argument("--split", type=int, default=None,
                   help="prefill K tokens, store the state at K in the checkpoint pool, load it back, continue")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "fla"], help="recurrence backend")
    p.add_argument("--block-size", type=int, default=16, help="KV cache block size (tokens)")
    p.add_argument("--wmax", type=int, default=0, help="dasc W_max for the --split checkpoint (0: dense)")
    p.add_argument("--policy", default="nr", choices=["nr", "wr"], help="checkpoint load policy")
    p.add_argument("--codec", default="native", choices=["native", "int8"], help="checkpoint temporal codec")
    p.add_argument("--replay-window", type=int, default=None, help="wr replay length override (tokens)")


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
    if args.block_size < 1:
        raise UserError(f"--block-size must be positive, got {args.block_size}")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise UserError(f"--out directory {out_dir!r} does not exist")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {args.device} requested but CUDA is not available")
    if args.split is None:
        model = HybridModel.from_pretrained(args.model, dtype=args.dtype, device=args.device,
                                            backend=args.backend)
        _check_vocab(ids, model.spec.vocab_size)
        blocks = -(-T // args.block_size)
        logits = model.forward([SeqInput(ids, 0)], model.new_state(1), model.new_kv_cache(blocks, args.block_size)).logits
    else:
        from trtllm_dasc.engine.config import EngineConfig
        from trtllm_dasc.engine.split import split_prefill_logits
        cfg = EngineConfig(model=args.model, wmax=args.wmax, policy=args.policy, codec=args.codec, dtype=args.dtype,
                           device=args.device, backend=args.backend, block_size=args.block_size, max_batch=2,
                           num_kv_blocks=2 * (-(-T // args.block_size)) + 4, max_context=T + 1,
                           replay_window=args.replay_window)
        logits = split_prefill_logits(cfg, ids, args.split, _check_vocab)
    np.save(args.out, logits.float().cpu().numpy())
    print(f"wrote {args.out}: float32 [{T}, {logits.shape[1]}]"
          + (f" (split at {args.split}, W_max {args.wmax}, {args.policy}, {args.codec})"
             if args.split is not None else ""))
    return 0


def _check_vocab(ids, vocab_size):
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise UserError(f"token id(s) {bad[:5]} outside the vocabulary 0..{vocab_size - 1}")
