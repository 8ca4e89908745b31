"""The transient tensors of one engine step, bounded from the model's shapes and the engine's caps.

The engine's memory check (model/footprint.py, engine/loading.py) counts them as the footprint's `workspace`
beside the weights, KV cache, state rows and checkpoint pool, so a memory limit that leaves no room for the
largest step is refused before loading instead of dying of CUDA out-of-memory in warm-up. What no shape
bounds (the CUDA context, cuBLAS workspaces, kernel modules) is not counted here: clients/kv_sizing.py's
headroom is for that.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepShape:
    tokens: int     # tokens of the step's forward, all sequences
    seqs: int       # sequences in it that sample (one logits row each)
    captures: int   # checkpoints it captures
    context: int    # the longest context one sequence attends to
    replay_spans: int = 0   # dasc-wr replays beside them: sequences of the forward that sample nothing


def natural_captures(tokens: int, seqs: int, interval: int, prompt_only: bool) -> int:
    """The most checkpoints the scheduler's spans can capture in one step of `tokens` tokens over `seqs`
    prefill spans: each capture is a distinct position of a span, so at most one a token; prompt ends only:
    one a span; else a span of c tokens meets at most (c - 1) // interval + 1 grid points, its branch point
    and its prompt end, (c - 1) // interval + 3 in all, and the spans' c add up to at most `tokens`."""
    if prompt_only:
        return min(seqs, tokens)
    return min(tokens, tokens // interval + 3 * seqs)


def step_shape(*, max_num_tokens: int | None, max_batch: int, prefill_chunk: int, max_context: int,
               interval: int, prompt_only: bool, max_step_captures: int | None = None,
               replay_window: int = 0) -> StepShape:
    """An engine's largest step from its config's fields: max_num_tokens tokens (uncapped: every running
    request's prefill chunk), max_batch sequences, the captures the scheduler can take in one step (its
    max_step_captures cap when set: the scheduler defers a chunk's capture past it to the next step), a
    context of max_context. Clients that size an engine pass the fields they build it with.

    replay_window (dasc-wr's W, engine/runner.replay_window; 0 for nr and dense): a hit's replay runs whole in
    its admission step as a span of its own beside the request's first chunk (engine/scheduler.py). Uncapped,
    every running request may carry one: max_batch more spans of W more tokens (a bound that left them out was
    below the step an uncapped wr engine runs). Capped, replays count against max_num_tokens, except one
    admitted alone with a window past the cap: W tokens and one prefill token. Replays capture nothing."""
    chunks = max_num_tokens or max_batch * min(prefill_chunk, max_context)
    captures = natural_captures(chunks, max_batch, interval, prompt_only)
    if max_num_tokens:
        tokens = max(max_num_tokens, replay_window + 1) if replay_window else max_num_tokens
    else:
        tokens = chunks + max_batch * replay_window
    return StepShape(tokens=tokens, seqs=max_batch,
                     captures=captures if max_step_captures is None else min(max_step_captures, captures),
                     context=max_context, replay_spans=max_batch if replay_window else 0)


def largest_step(cfg, replay_window: int = 0) -> StepShape:
    """step_shape of an EngineConfig (replay_window: the runner's, engine/runner.replay_window)."""
    return step_shape(max_num_tokens=cfg.max_num_tokens, max_batch=cfg.max_batch, prefill_chunk=cfg.prefill_chunk,
                      max_context=cfg.max_context, interval=cfg.interval, prompt_only=cfg.prompt_only,
                      max_step_captures=cfg.max_step_captures, replay_window=replay_window)


def workspace_of(schema, step: StepShape, dtype_bytes: int, tp: int = 1) -> dict:
    """step_workspace_bytes of a StepShape."""
    return step_workspace_bytes(schema, tokens=step.tokens, seqs=step.seqs, captures=step.captures,
                                context=step.context, dtype_bytes=dtype_bytes, tp=tp, replay_spans=step.replay_spans)


def step_workspace_bytes(schema, *, tokens: int, seqs: int, captures: int, context: int, dtype_bytes: int,
                         tp: int = 1, replay_spans: int = 0) -> dict:
    """The largest transient tensors of one step of `tokens` tokens over `seqs` sequences, `captures` of them
    taking a checkpoint, each attending to at most `context` tokens (one rank at TP `tp`; schema: a
    ModelSchema). The footprint's `workspace` (model/footprint.py, at the engine's largest_step): the largest
    layer's working tensors, plus what lives through the whole step. A bound from the shapes, not a measurement:
      resident   the hidden state and the residual [T, D]; the captured states of every linear layer (fp32
                 [captures, L_lin, HV, K, V], twice: the per-layer list and its stack); the head's logits of
                 the sampled rows (one a sequence: [N, V] in the dtype, then fp32)
      linear     a KDA / GDN layer: q, k, v, the gate projection, the output, fla's w, u, qg, kg and v_new
                 (ten [T, H*K] in the dtype), the log decay and its cumsum (fp32 [T, HV*K]), the two
                 intra-chunk matrices (fp32 [T, HV, 64]), the fp32 state at every chunk start
                 ([T/64 + N', HV, K, V]) and the final states ([N', HV, K, V]); N' = N + `replay_spans`
                 (a replay is a sequence of the forward, but samples no logits row)
      moe        the router logits (fp32 [T, E]), the grouped GEMMs' h [T*k, I] and y [T*k, D] (moe/kernel.py),
                 the combined output [T, D], the shared expert's gate_up, activation and output
      dense_mlp  gate_up [T, 2I] and the activation [T, I]
      attention  MLA: q [T, H, nope+rope], the latent twice [T, lora+rope], the output [T, H, v], one
                 sequence's expanded keys, values (padded to the key width) and kv_b output over its context;
                 GQA: q (with its gate), k, v, the output, and one sequence's keys and values over its context
    Returns {'total', and the parts}: total = resident + the largest of the layer parts."""
    n, b, T, N = schema.network, dtype_bytes, tokens, seqs
    D = n.hidden_size
    HV, Hk = max(1, schema.num_value_heads // tp), max(1, schema.num_key_heads // tp)
    K, V = schema.key_head_dim, schema.value_head_dim
    n_linear = schema.layer_types.count("linear_attention")
    state = HV * K * V * 4
    resident = 2 * T * D * b + 2 * captures * n_linear * state + N * n.vocab_size * (b + 4)
    spans = N + replay_spans
    linear = (10 * T * max(Hk * K, HV * V) * b + 2 * T * HV * K * 4 + 2 * T * HV * 64 * 4
              + (-(-T // 64) + spans) * state + spans * state)
    parts = {"resident": resident, "linear": linear}
    if "moe" in n.mlp_types:
        I, Ish = n.moe_intermediate_size // tp, n.shared_intermediate_size // tp
        parts["moe"] = T * n.num_experts * 4 + T * n.top_k * (I + D) * b + T * D * b + T * (3 * Ish + D) * b
    if "dense" in n.mlp_types:
        parts["dense_mlp"] = 3 * T * (n.intermediate_size // tp) * b
    if "full_attention" in schema.layer_types:
        H = max(1, n.num_attention_heads // tp)
        if n.kv_lora_rank:
            nope, rope, lora, vd = n.qk_nope_head_dim, n.qk_rope_head_dim, n.kv_lora_rank, n.v_head_dim
            parts["attention"] = (T * H * (nope + rope) * b + 2 * T * (lora + rope) * b + T * H * vd * b
                                  + context * H * ((nope + vd) + 2 * (nope + rope)) * b)
        else:
            hd, Hkv = n.head_dim, max(1, n.num_key_value_heads // tp)
            parts["attention"] = (2 * T * H * hd * b + 2 * T * Hkv * hd * b + T * H * hd * b
                                  + 2 * context * H * hd * b)
    layer = max(v for k, v in parts.items() if k != "resident")
    return {"total": resident + layer, **parts}
