"""Train a tiny hybrid that genuinely uses long-range memory, on the RULER-like mixture (evals/mixture.py).

    python -m trtllm_dasc.evals.train --arch kda --out models/kda [--minutes 9] [--device cuda] [--seed 0]
                                      [--size tiny|large] [--decay-init paper|default] [--freeze-decay]
                                      [--lr 2e-3] [--tasks T1,T2]
                                      [--stage DIR] [--resume STAGE] [--restart-curriculum]
    python -m trtllm_dasc.evals.train --export STAGE/train_state.pt --out models/kda   # bf16 model of a stage

transformers' KimiLinearForCausalLM (KDA + MLA) / Qwen3NextForCausalLM (GDN + gated attention) are the
trainable definitions (on a GPU they run fla's kernels with autograd); linear and full-attention layers
in the released models' 3:1 ratio, dense MLPs, a few million parameters, so the bf16 weights stay under
8 MB. The decay parameters start from the paper's profile (plan/synthetic.py, --decay-init paper) or from
transformers' own init (--decay-init default, decays from 0.2 to 0.999); training moves them, unless
--freeze-decay holds them at the paper's profile (the operating point: `dasc plan` then compresses the
trained model as the profile does; --size large sets it). Saved with
save_pretrained (bf16; decay tensors fp32, as the released checkpoints), which our loader reads, plus train_meta.json (config, seed, steps, loss curve, command). A run that
needs more than one 10-minute device command stages its fp32 weights with --stage (Adam's moments too with
--stage-optimizer) and continues with --resume. On Hopper with Triton 3.4-3.7.0, fla refuses GDN's gated
backward (fla #640); GDN then trains through fla's KDA kernel (evals/train_kernels.py).
Loss: next-token cross-entropy on the answer tokens (what the tasks score; the answers of the set-scored
tasks vt, cwe and fwe in any order, as they are scored: --set-order), plus a small weight on all
tokens so the embeddings of the haystack words are trained too. --size large weights every example
alike (not every answer token) and draws more rows of the tasks whose loss is highest (TrainConfig's
answer_weighting and task_sampling say why). Context lengths follow a curriculum
from short to the target range (evals/curriculum.py): long-range retrieval is learned first on short
haystacks, and a stage is left when its answer loss says the model retrieves there. --row-lengths bucket
draws each row's example within 512 tokens of the batch length, so a step's tokens are examples, not a third
padding (mixture.TrainingMixture.row_spread).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from trtllm_dasc.evals.curriculum import LengthCurriculum
from trtllm_dasc.evals.prefetch import BatchPrefetcher
from trtllm_dasc.plan.synthetic import LEGACY_PROFILE, synthetic_decay
from trtllm_dasc.plan.synthetic import decay_tensors
from trtllm_dasc.evals.mixture import TrainingMixture, is_count, task_weights_from_losses
from trtllm_dasc.evals.qa_drill import QA_TASKS
from trtllm_dasc.evals.tasks import SCORING
from trtllm_dasc.evals.vocab import TaskVocab
from trtllm_dasc.evals.safe_gate import enable_gate_anchor, make_kda_gates_gradient_safe
from trtllm_dasc.evals.train_kernels import choose_conv, choose_gdn_recurrence

DEFAULT_LR = 2e-3                       # TrainConfig.lr and the CLI's --lr
MAX_SKIPPED_IN_A_ROW = 20               # non-finite gradients in a row before a run gives up
# lr warm-up steps after a resume with fresh Adam moments (a compact stage): the weights are trained, and
# beta2 = 0.95 makes the second moments settle within ~20 steps; a full warm-up again cost about a fifth
# of every resumed 8-minute device call (session 27: 200 of ~1000 steps at a reduced lr)
RESUME_WARMUP_STEPS = 25
# --anneal-minutes: the lr's floor at the end of the budget, as a fraction of the peak
ANNEAL_FLOOR = 0.1


# TrainConfig's fields that take one of a few words: what check() accepts and the CLI offers
CHOICES = {"arch": ("kda", "gdn"), "decay_init": ("paper", "default"), "answer_weighting": ("token", "row"),
           "task_sampling": ("uniform", "loss"), "conv": ("auto", "torch"), "row_lengths": ("uniform", "bucket"),
           "set_order": ("any", "target")}


@dataclass(slots=True)
class TrainConfig:
    arch: str = "kda"                   # kda (Kimi-Linear) | gdn (Qwen3-Next)
    vocab_size: int = 512
    hidden_size: int = 192
    groups: int = 2                     # each group: 3 linear-attention layers + 1 full-attention layer
    heads: int = 4
    head_dim: int = 48
    intermediate_size: int = 448         # keeps the bf16 checkpoint under 8 MB (about 3.7M parameters)
    min_length: int = 1024
    max_length: int = 4096
    tokens_per_step: int = 32768
    lr: float = DEFAULT_LR
    warmup_steps: int = 50
    all_token_weight: float = 0.1
    # the length curriculum's stages and gate (evals/curriculum.py); its lengths are min/max_length above
    curriculum: LengthCurriculum = field(default_factory=LengthCurriculum)
    # the mixture's tasks (default all 13): a run can start on the single-needle tasks, whose retrieval
    # the others build on, and --resume on all of them
    tasks: tuple[str, ...] | None = None
    # "paper": A_log / dt_bias start from the paper's trained profile (plan/synthetic.py; most KDA channels
    # forget within a few tokens); "default": transformers' own init (A in [1, 16], dt in [1e-3, 0.1], so
    # decays from 0.2 to 0.999), from which training has to find the spread itself
    decay_init: str = "paper"
    # on --resume, start the length curriculum again from its first stage (new tasks learn on short
    # haystacks first) instead of continuing the staged run's
    restart_curriculum: bool = False
    # hold A_log / dt_bias at the paper's profile (decay_init "paper") for the whole run: out of the
    # optimizer and requires_grad False, so `dasc plan` compresses the trained model as the profile says
    # (the quality issue: trained decays drifted until W=16 kept 85% of KDA's units, not the paper's ~38%)
    freeze_decay: bool = False
    # how the answer tokens of a batch are weighted in the loss. "token": every answer token alike, so a task
    # counts by its answer length: qa's one token is about 1.5% of the answer loss next to the needles' 100
    # and cwe's 10 (session 29: qa_1, qa_2 and cwe still at chance after ~4,000 steps). "row": every example
    # alike (the mean of its answer tokens' losses), as each counts alike in the suite's score. The logged
    # answer loss and the curriculum's gate stay the token mean either way (reweighted to a uniform task mix
    # when task_sampling is "loss": uniform_mix_answer_loss).
    answer_weighting: str = "token"
    # how each row's task is drawn: "uniform", or "loss": half the rows uniform, half in proportion to each
    # task's recent answer loss (mixture.task_weights_from_losses), so unlearned tasks get the steps
    task_sampling: str = "uniform"
    # the linear-attention layers' short convolution on a GPU: "auto" runs fla's Triton causal_conv1d where
    # it passes its check against transformers' torch fallback (evals/train_kernels.py), "torch" keeps the
    # fallback (a depthwise F.conv1d). The CPU always runs the fallback
    conv: str = "auto"
    # each row's example length: "uniform" in [min_length, batch length], or "bucket": within one curriculum
    # bucket (512 tokens) of the batch length, so a batch is nearly all example and not a third padding
    # (mixture.TrainingMixture.row_spread says why; the batch length is still drawn by the curriculum)
    row_lengths: str = "uniform"
    # qa_1 / qa_2 training examples ask up to this many extra one-hop questions about their own documents,
    # each answer a target (evals/qa_drill.py: qa sat at chance for 10,000 steps with one target per example);
    # 0: the examples evaluation sees. A qa row's loss then averages its drills in, and so does what reads it: the
    # per-task log, task_sampling "loss" (qa keeps a larger share while its drills are unlearned) and the
    # curriculum's gate (a run resumed at its last stage has no gate left); the log adds the final answer alone
    qa_drill: int = 0
    # add this times the mean squared log-ratio of each token's decay rate to the static one (KDA: per key channel,
    # GDN: per head; evals/safe_gate.py, enable_gate_anchor: why) to the loss; 0: no anchor. The decay parameters stay frozen
    # either way; this holds the gate's data-dependent part near the profile the planner reads
    gate_anchor: float = 0.0
    # the answers of the set-scored tasks (tasks.SCORING "set": vt, cwe, fwe; the scorer takes their items in any
    # order). "any": the loss at each item is -log of the probability of any item not yet given (loss_fn), so
    # every order the scorer accepts costs nothing; "target": cross-entropy on the generator's order. Why: cwe's
    # ten words are all equally frequent, so its target order is where each first appeared (all within the list's
    # first ~130 tokens, at every length), which the scorer ignores and a model whose decay is held at the profile
    # can hardly recall; on session 39's KDA stage it was most of cwe's answer loss "stuck at 2.3" (CPU, 12 cwe
    # prompts of 2k: 2.13 in the target order, 0.45 in any order, greedy set score 0.88)
    set_order: str = "any"
    seed: int = 0

    def check(self) -> None:
        for name, options in CHOICES.items():
            value = getattr(self, name)
            if value not in options:
                raise ValueError(f"--{name.replace('_', '-')} must be {' or '.join(options)}, got {value!r}")
        if not 64 <= self.min_length <= self.max_length:
            raise ValueError(f"need 64 <= min_length <= max_length, got {self.min_length}, {self.max_length}")
        if not is_count(self.qa_drill):
            raise ValueError(f"--qa-drill must be a non-negative integer, got {self.qa_drill!r}")
        if not (isinstance(self.gate_anchor, (int, float)) and math.isfinite(self.gate_anchor) and self.gate_anchor >= 0):
            raise ValueError(f"--gate-anchor must be a finite number >= 0, got {self.gate_anchor!r}")
        if self.freeze_decay and self.decay_init != "paper":
            raise ValueError("--freeze-decay holds the decay at the paper's profile: it needs --decay-init paper")


# what a stage's weights fix: a --resume takes these from the stage, not from its own flags
SHAPE_FIELDS = ("arch", "vocab_size", "hidden_size", "groups", "heads", "head_dim", "intermediate_size")

# --size: the model shapes and schedules of the quality models (TrainConfig fields; flags given on the
# command line override them). "tiny": the first committed models (about 3.7M parameters, 7 MB bf16).
# "large": the quality issue's operating-point models, 12 layers (9 linear + 3 full attention) of 384 with
# 6 heads of 64, about 18.5M parameters, 35 MB bf16 (the limit is 40 MB), trained on 1k-8k tokens
# (the protocol measures 4k and 8k) over several resumed device calls, with the decay held at the paper's
# profile (--freeze-decay) so that W=16/64/128/512 compress as the released models do.
SIZES = {
    "tiny": {},
    # half of large (about 9.8M parameters, 19 MB bf16): two bf16 stages and the tree fit one device call's carry
    "medium": dict(hidden_size=256, groups=3, heads=4, head_dim=64, intermediate_size=640, min_length=1024,
                   max_length=8192, tokens_per_step=65536, lr=1e-3, warmup_steps=200, decay_init="paper",
                   freeze_decay=True),
    "large": dict(hidden_size=384, groups=3, heads=6, head_dim=64, intermediate_size=768, min_length=1024,
                  max_length=8192, tokens_per_step=65536, lr=1e-3, warmup_steps=200, decay_init="paper",
                  freeze_decay=True, answer_weighting="row", task_sampling="loss"),
}


def model_config(cfg: TrainConfig):
    layer_types = (["linear_attention"] * 3 + ["full_attention"]) * cfg.groups
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                  num_hidden_layers=len(layer_types), layer_types=layer_types, num_attention_heads=cfg.heads,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=65536,
                  tie_word_embeddings=False)
    if cfg.arch == "kda":
        from transformers import KimiLinearConfig
        return KimiLinearConfig(**common, num_key_value_heads=cfg.heads, kv_lora_rank=64, q_lora_rank=None,
                                qk_rope_head_dim=16, qk_nope_head_dim=cfg.head_dim, v_head_dim=cfg.head_dim,
                                linear_head_dim=cfg.head_dim, linear_num_heads=cfg.heads, linear_conv_kernel_dim=4,
                                mlp_layer_types=["dense"] * len(layer_types), moe_intermediate_size=cfg.intermediate_size,
                                num_local_experts=1, num_experts_per_tok=1)
    from transformers import Qwen3NextConfig
    return Qwen3NextConfig(**common, num_key_value_heads=1, head_dim=cfg.head_dim, linear_num_key_heads=cfg.heads // 2,
                           linear_num_value_heads=cfg.heads, linear_key_head_dim=cfg.head_dim,
                           linear_value_head_dim=cfg.head_dim, linear_conv_kernel_dim=4,
                           mlp_only_layers=list(range(len(layer_types))), moe_intermediate_size=cfg.intermediate_size,
                           shared_expert_intermediate_size=cfg.intermediate_size, num_experts=1, num_experts_per_tok=1)


def conv_channels(cfg: TrainConfig) -> int:
    """The width of a linear-attention layer's short convolution (q, k and v side by side)."""
    if cfg.arch == "kda":
        return 3 * cfg.heads * cfg.head_dim
    return 2 * (cfg.heads // 2) * cfg.head_dim + cfg.heads * cfg.head_dim


def build_model(cfg: TrainConfig):
    """A fresh model; with decay_init "paper" the paper's decay profile goes into its A_log / dt_bias."""
    import torch
    from transformers import KimiLinearForCausalLM, Qwen3NextForCausalLM

    torch.manual_seed(cfg.seed)
    hf = model_config(cfg)
    model = (KimiLinearForCausalLM if cfg.arch == "kda" else Qwen3NextForCausalLM)(hf).float()
    make_kda_gates_gradient_safe(model)     # transformers' KDA softplus has a NaN gradient past x = 88.7
    if cfg.gate_anchor:
        model.gate_anchor_terms = enable_gate_anchor(model)
    if cfg.decay_init == "default":
        return model
    set_profile_decay(model, cfg)
    if cfg.freeze_decay:
        for p in decay_parameters(model):
            p.requires_grad_(False)
    return model


def decay_parameters(model) -> list:
    """A_log and dt_bias of every linear-attention mixer, in model order."""
    return [p for m in model.modules() if hasattr(m, "A_log") and hasattr(m, "dt_bias") for p in (m.A_log, m.dt_bias)]


# issue 34's models were trained (frozen / anchored decay) on the first profile, before plan/synthetic.py's tails
# were fitted to the paper's capacities (12-07): their stages must resume onto the decay they were trained with
TRAINING_PROFILE = LEGACY_PROFILE


def profile_alpha(cfg: TrainConfig):
    """The paper-shaped decay factors alpha [linear layers, units] of this config (plan/synthetic.py): what
    the planner's horizons of a decay-frozen model come from."""
    per_head = cfg.head_dim if cfg.arch == "kda" else 1
    return synthetic_decay(cfg.arch, 3 * cfg.groups, cfg.heads, per_head, cfg.seed, TRAINING_PROFILE)


def set_profile_decay(model, cfg: TrainConfig) -> float:
    """Write the paper's profile into A_log / dt_bias; returns the largest change (0 on a fresh model)."""
    import torch

    mixers = [m for m in model.modules() if hasattr(m, "A_log") and hasattr(m, "dt_bias")]
    per_head = cfg.head_dim if cfg.arch == "kda" else 1
    A_log, dt_bias = decay_tensors(profile_alpha(cfg), per_head, cfg.seed)
    moved = 0.0
    with torch.no_grad():
        for m, a, d in zip(mixers, A_log, dt_bias):
            for param, value in ((m.A_log, a), (m.dt_bias, d)):
                new = torch.tensor(value, dtype=torch.float32).view_as(param).to(param.device)
                moved = max(moved, float((param.float() - new).abs().max()))
                param.copy_(new)
    return moved


def loss_fn(model, tokens, mask, all_token_weight: float, with_accuracy: bool = False,
            answer_weighting: str = "token", with_final: bool = False, set_rows=None):
    """(training loss, answer loss) and, with_accuracy, the fraction of answer tokens whose argmax is right
    (teacher-forced: a cheap progress signal, not the greedy score of evals/run.py) and each row's answer
    loss [B] (for the per-task view of the log). The answer loss returned is the mean over the batch's
    answer tokens; the training loss weights them as ``answer_weighting`` says (TrainConfig). with_final
    (with with_accuracy): also each row's loss on the first token after its last ANSWER marker [B], the
    final question's answer: the one lookup evaluation scores, which a qa row's drills would hide in its
    row loss. set_rows (bool [B], optional): rows whose answer items (every answer token but the closing
    EOS) are a set, scored in any order (set_answer_loss); their accuracy counts an argmax on any item not
    yet given as right."""
    import torch
    import torch.nn.functional as F
    logits = model(input_ids=tokens).logits[:, :-1].float()
    target, answer = tokens[:, 1:], mask[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none").view_as(target)
    set_hits = None
    if set_rows is not None:
        ce, set_hits = set_answer_loss(logits, target, answer & set_rows.view(-1, 1), ce)
    real = target != 0
    answer_loss = (ce * answer).sum() / answer.sum().clamp_min(1)
    row_loss = (ce * answer).sum(1) / answer.sum(1).clamp_min(1)
    if answer_weighting == "row":
        has_answer = answer.any(1)
        objective = (row_loss * has_answer).sum() / has_answer.sum().clamp_min(1)
    else:
        objective = answer_loss
    loss = objective + all_token_weight * (ce * real).sum() / real.sum().clamp_min(1)
    if not with_accuracy:
        return loss, answer_loss
    right = (logits.detach().argmax(-1) == target) & answer
    if set_hits is not None:
        b, t, hit = set_hits
        right[b, t] = hit
    if not with_final:
        return loss, answer_loss, right.sum() / answer.sum().clamp_min(1), row_loss.detach()
    # ce[t] is the loss of tokens[t + 1]: at the last ANSWER of the input, the final answer's first token
    is_answer = tokens[:, :-1] == TaskVocab.ANSWER
    last = is_answer.shape[1] - 1 - is_answer.flip(1).int().argmax(1)
    final = ce.detach()[torch.arange(len(last), device=ce.device), last]
    return loss, answer_loss, right.sum() / answer.sum().clamp_min(1), row_loss.detach(), final


def set_answer_loss(logits, target, answer, ce):
    """``ce`` [B, T] with the answer items at ``answer`` (bool [B, T]; the closing EOS left out here) scored as a
    set: at the i-th item of a row, -log of the probability of any of its items from the i-th on (those not yet
    given). Also (rows, positions, argmax on such an item) of those items, for the accuracy."""
    import torch
    items = answer & (target != TaskVocab.EOS)
    b, t = items.nonzero(as_tuple=True)                 # row-major: each row's items in answer order
    if len(b) == 0:
        return ce, None
    k = (items.cumsum(1) - 1)[b, t]                     # each item's place in its row's answer
    width = int(k.max()) + 1
    row_items = torch.full((items.shape[0], width), -1, dtype=target.dtype, device=target.device)
    row_items[b, k] = target[b, t]
    mine = row_items[b]                                 # [N, width]: the items of each item's row
    open_ = (torch.arange(width, device=k.device).view(1, -1) >= k.view(-1, 1)) & (mine >= 0)
    logp = torch.log_softmax(logits[b, t], -1)
    picked = logp.gather(1, mine.clamp_min(0)).masked_fill(~open_, float("-inf"))
    hit = ((mine == logits[b, t].detach().argmax(-1, keepdim=True)) & open_).any(1)
    return ce.index_put((b, t), -torch.logsumexp(picked, 1)), (b, t, hit)


class TaskLosses:
    """The answer loss of the last ``window`` training rows of every task: which tasks a mixture run has
    learned (the pooled loss hides a task stuck at chance behind easy ones)."""

    def __init__(self, window: int = 200):
        self.window, self._rows = window, {}

    def add(self, tasks: list[str], losses: list[float]) -> None:
        for task, value in zip(tasks, losses):
            self._rows.setdefault(task, deque(maxlen=self.window)).append(float(value))

    def means(self) -> dict[str, float]:
        return {t: round(sum(v) / len(v), 4) for t, v in sorted(self._rows.items())}

    def state(self) -> dict[str, list[float]]:
        """The rows kept, per task (saved with a stage: a resumed run samples its tasks from them at once)."""
        return {t: list(v) for t, v in sorted(self._rows.items())}

    def resume(self, state: dict[str, list[float]]) -> None:
        for task, values in state.items():
            self.add([task] * len(values), values)

    def summary(self) -> str:
        return ", ".join(f"{t} {m:.2f}" for t, m in self.means().items())


def uniform_mix_answer_loss(row_losses, row_tokens, row_tasks, tasks, weights) -> float:
    """The token-mean answer loss of a batch whose rows' tasks were drawn with probabilities ``weights``,
    reweighted to a uniform draw over ``tasks``: each row counts (1 / len(tasks)) / p(its task) times, so
    the figure means what the uniform mixture's answer loss meant (the curriculum's gate was set on it)."""
    p = dict(zip(tasks, weights))
    w = np.array([(1.0 / len(tasks)) / p[t] for t in row_tasks]) * np.asarray(row_tokens, dtype=np.float64)
    return float((w * np.asarray(row_losses, dtype=np.float64)).sum() / max(w.sum(), 1e-12))


def save(model, out: str, meta: dict) -> None:
    """bf16 weights except the decay tensors (fp32, as the released checkpoints keep them)."""
    import torch
    keep = ("A_log", "dt_bias")
    for name, p in model.named_parameters():
        p.data = p.data.float() if name.endswith(keep) else p.data.to(torch.bfloat16)
    model.save_pretrained(out)
    with open(os.path.join(out, "train_meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


def select_kernels(cfg: TrainConfig, device: str, log=print) -> tuple[str, str]:
    """Patch transformers for this device as the run trains (evals/train_kernels.py); returns the GDN
    recurrence and the short convolution chosen."""
    recurrence = (choose_gdn_recurrence(device, log, heads=(cfg.heads // 2, cfg.heads), head_dim=cfg.head_dim)
                  if cfg.arch == "gdn" else "fla" if device.startswith("cuda") else "torch")
    return recurrence, choose_conv(device, log, channels=conv_channels(cfg), mode=cfg.conv)


def build_optimizer(model, cfg: TrainConfig):
    # frozen decay tensors stay out of the optimizer: AdamW's weight decay would move them even without a gradient
    import torch
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95),
                             weight_decay=0.01)


def autocast_for(device: str):
    """bf16 autocast on a GPU (fla's kernels run in it), none on the CPU."""
    import torch
    return (torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda")
            else torch.autocast("cpu", enabled=False))


def forward_backward(model, opt, tokens, mask, cfg: TrainConfig, amp, set_rows=None):
    """One step's work before the update: the loss (with the accuracy and each row's answer loss), its
    gradients, clipped to norm 1. set_rows: as loss_fn's. Returns (loss, grad norm, answer loss, accuracy, row
    losses, final-answer losses), all on the device: the caller reads them back once (the trainer) or not at all
    (benchmarks/train_step.py)."""
    import torch
    terms = getattr(model, "gate_anchor_terms", None) if cfg.gate_anchor else None
    if terms is not None:
        terms.clear()
    with amp:
        loss, answer_loss, accuracy, row_loss, final_loss = loss_fn(
            model, tokens, mask, cfg.all_token_weight, with_accuracy=True, answer_weighting=cfg.answer_weighting,
            with_final=True, set_rows=set_rows)
        if terms:
            anchor = torch.stack(terms).mean()
            loss = loss + cfg.gate_anchor * anchor
            model.gate_anchor_last = anchor.detach()     # the log's figure, read back with the others
            terms.clear()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    return loss, grad_norm, answer_loss, accuracy, row_loss, final_loss


def anneal_factor(remaining_s: float, window_s: float, floor: float = ANNEAL_FLOOR) -> float:
    """The lr multiplier of a run that anneals over its last ``window_s`` seconds: 1 before the window, then
    linear in the time left, down to ``floor`` at the end of the budget (and no lower past it)."""
    if window_s <= 0 or remaining_s >= window_s:
        return 1.0
    return floor + (1.0 - floor) * max(0.0, remaining_s) / window_s


def train(cfg: TrainConfig, out: str, minutes: float, device: str, resume: str | None = None,
          stage: str | None = None, max_steps: int | None = None, log=print, stage_optimizer: bool = False,
          stage_dtype: str = "float32", anneal_minutes: float = 0.0) -> dict:
    """Train for ``minutes`` of wall time counted from this call (kernel checks, compiles and the first
    step's autotuning included, so a device command's timeout of minutes + a margin never cuts the run
    before it saves); SIGTERM ends the loop early and the run still saves. anneal_minutes: the lr falls
    linearly over the budget's last minutes to ANNEAL_FLOOR of its peak (anneal_factor), so the saved
    weights are a settled point to evaluate, not the constant-lr run's noisy one; a later --resume warms
    up to the peak again."""
    t0 = time.time()
    with _sigterm_sets_event() as stop:
        return _train(cfg, out, minutes, device, resume, stage, max_steps, log, stage_optimizer, t0, stop,
                      stage_dtype, anneal_minutes)


def _train(cfg: TrainConfig, out: str, minutes: float, device: str, resume, stage, max_steps, log,
           stage_optimizer: bool, t0: float, stop, stage_dtype: str = "float32", anneal_minutes: float = 0.0) -> dict:
    import torch

    cfg.check()
    if not anneal_minutes >= 0:
        raise ValueError(f"--anneal-minutes must be >= 0, got {anneal_minutes}")
    curriculum = replace(cfg.curriculum, start=min(cfg.curriculum.start, cfg.max_length), min_length=cfg.min_length,
                         max_length=cfg.max_length)
    # built before the GPU check and the model: bad tasks or lengths fail in a second, not after compiles
    mixture = TrainingMixture(vocab=TaskVocab(cfg.vocab_size), min_length=cfg.min_length, max_length=cfg.max_length,
                              seed=cfg.seed, row_spread=curriculum.bucket if cfg.row_lengths == "bucket" else None,
                              qa_drill=cfg.qa_drill,
                              **({"tasks": tuple(cfg.tasks)} if cfg.tasks else {}))
    state = _load_stage(resume, device) if resume else None
    if state is not None and "config" in state:
        # the stage's model shape, whatever this call's flags say (a resume continues those weights); and the
        # weights were initialised by the stage's run: its decay init is what train_meta.json must say,
        # unless this run holds the decay at the profile (then it is reset to it below)
        cfg = replace(cfg, **{k: state["config"][k] for k in SHAPE_FIELDS if k in state["config"]})
        if not cfg.freeze_decay:
            cfg = replace(cfg, decay_init=state["config"]["decay_init"])
    on_gpu = device.startswith("cuda")
    recurrence, conv = select_kernels(cfg, device, log)
    model = build_model(cfg).to(device)
    opt = build_optimizer(model, cfg)
    step, curve, warm_from, warmup, runs = 0, [], 0, cfg.warmup_steps, []
    if state is not None:
        model.load_state_dict(state["model"])
        step, curve, runs = state["step"], state["curve"], list(state.get("runs", []))
        if "curriculum" in state and not cfg.restart_curriculum:
            curriculum.resume(state["curriculum"])
        if cfg.freeze_decay:
            # a stage trained with free decays (the older models) moves back onto the profile, then stays there
            moved = set_profile_decay(model, cfg)
            if moved:
                log(f"[train] --freeze-decay: the stage's A_log / dt_bias reset to the paper's profile "
                    f"(largest change {moved:.3g})")
        frozen_before = (state.get("config") or {}).get("freeze_decay", False)
        if "opt" in state and frozen_before == cfg.freeze_decay:
            opt.load_state_dict(state["opt"])
        else:                           # a compact stage (weights only, or other parameter groups): fresh
            warm_from = step            # moments, warm the lr up again, briefly
            warmup = min(cfg.warmup_steps, RESUME_WARMUP_STEPS)
    first_step, skipped, per_task = step, 0, TaskLosses()
    # qa rows with drills: their row loss averages the drills in, so the final question's own loss is kept apart
    drilled, qa_final = (set(QA_TASKS) & set(mixture.tasks) if cfg.qa_drill else set()), TaskLosses()
    if state is not None:
        per_task.resume(state.get("task_losses", {}))
    rng = np.random.default_rng([cfg.seed, step])
    amp = autocast_for(device)
    model.train()
    # the next batch is built in a worker process while this step runs on the GPU (evals/prefetch.py); on
    # the CPU in this process, where the step itself is the CPU
    with BatchPrefetcher(mixture, (cfg.seed, step), background=on_gpu) as prefetch:

        def submit_next():
            """Start the next batch; returns the task weights it is drawn with (None: uniform)."""
            length = curriculum.length(rng)
            weights = (task_weights_from_losses(mixture.tasks, per_task.means())
                       if cfg.task_sampling == "loss" else None)
            prefetch.submit(max(1, cfg.tokens_per_step // length), length, weights)
            return weights
        next_weights = submit_next()
        while time.time() - t0 < minutes * 60 and (max_steps is None or step < max_steps) and not stop.is_set():
            tokens, mask, row_tasks, length = prefetch.take()
            batch, row_tokens = len(tokens), mask[:, 1:].sum(1)
            batch_weights, next_weights = next_weights, submit_next()
            tokens = torch.as_tensor(tokens, device=device)
            mask = torch.as_tensor(mask, device=device)
            set_rows = None if cfg.set_order == "target" else \
                torch.tensor([SCORING[t] == "set" for t in row_tasks], device=device)
            lr = cfg.lr * min(1.0, (step - warm_from + 1) / warmup) * \
                anneal_factor(minutes * 60 - (time.time() - t0), anneal_minutes * 60)
            for group in opt.param_groups:
                group["lr"] = lr
            loss, grad_norm, answer_loss, accuracy, row_loss, final_loss = forward_backward(
                model, opt, tokens, mask, cfg, amp, set_rows)
            # one host sync a step, once forward, backward and the clip are all queued: a read-back between
            # forward and backward would leave the GPU idle while the CPU queues the backward (it did not change
            # the large models' step rate, session 29: their steps are GPU time)
            values = torch.cat([torch.stack([x.detach().float().reshape(()).to(loss.device)
                                             for x in (loss, grad_norm, answer_loss, accuracy)]),
                                row_loss.detach().float(), final_loss.float()]).tolist()
            (loss_value, grad_value, answer_value, accuracy_value) = values[:4]
            row_losses, final_losses = values[4:4 + batch], values[4 + batch:]
            if batch_weights is not None:
                # what the logs, the curve and the curriculum's gate read: the answer loss a uniform task mix
                # would give (rows drawn by loss over-represent the hard tasks and would hold the gate shut)
                answer_value = uniform_mix_answer_loss(row_losses, row_tokens, row_tasks, mixture.tasks, batch_weights)
            if not math.isfinite(loss_value):
                # before the update: the weights (and a stage written now) are still the last good ones
                log(f"[train] the loss became {loss_value} at step {step + 1}; stopping with step {step}'s weights")
                break
            if not math.isfinite(grad_value):
                # a non-finite gradient would turn every weight into NaN through Adam (it did once, at step 1613 of
                # a KDA run whose loss was still finite): skip the update, keep the weights
                skipped += 1
                log(f"[train] step {step + 1}: gradient norm {grad_value}, update skipped ({skipped} in a row)")
                if skipped >= MAX_SKIPPED_IN_A_ROW:
                    log(f"[train] {skipped} updates in a row skipped: stopping with the last good weights")
                    break
                opt.zero_grad(set_to_none=True)
                continue
            opt.step()
            skipped = 0
            step += 1
            curve.append([step, length, round(answer_value, 4), round(accuracy_value, 3)])
            per_task.add(row_tasks, row_losses)
            if drilled:
                qa_rows = [i for i, t in enumerate(row_tasks) if t in drilled]
                qa_final.add([row_tasks[i] for i in qa_rows], [final_losses[i] for i in qa_rows])
            moved = curriculum.update(answer_value)
            if moved:
                log(f"[train] step {step} {moved}")
            if step % 50 == 0 or step == first_step + 1:     # and the first step of every run
                ema = "" if curriculum.ema is None else f" (EMA {curriculum.ema:.3f})"
                anchor = getattr(model, "gate_anchor_last", None)
                anchor = "" if anchor is None else f" gate anchor {float(anchor):.3f}"
                log(f"[train] step {step} len {length} x{batch} answer loss {answer_value:.3f}{ema} "
                    f"answer tokens right {accuracy_value:.1%}{anchor} lr {lr:.3g} ({time.time() - t0:.0f} s)")
            if step % 200 == 0:
                log(f"[train] step {step} answer loss by task (last {per_task.window} rows each): {per_task.summary()}")
                if qa_final.means():
                    log(f"[train] step {step} qa's final answer alone, without its drills (last {qa_final.window} "
                        f"rows each; chance ln({mixture.vocab.num_words}) = {math.log(mixture.vocab.num_words):.2f}): "
                        f"{qa_final.summary()}")
                if next_weights is not None:
                    log(f"[train] step {step} next rows' task shares: "
                        + ", ".join(f"{t} {p:.0%}" for t, p in zip(mixture.tasks, next_weights)))
    if stop.is_set():
        log(f"[train] SIGTERM at step {step}: saving")
    model.eval()
    command = " ".join(["python -m trtllm_dasc.evals.train", *sys.argv[1:]])
    # every call that trained these weights: its command, steps and wall time (train_meta.json says how they
    # were made across resumed device calls)
    runs.append({"command": command, "device": device,
                 "recurrence": recurrence, "conv": conv, "steps": [first_step, step],
                 "seconds": round(time.time() - t0, 1)})
    if stage:
        # compact: fp32 weights only (a device call returns files of at most 16 MiB; Adam's moments would
        # triple it), so --resume restarts the moments with a short lr warm-up
        os.makedirs(stage, exist_ok=True)
        weights = model.state_dict()
        if stage_dtype == "bfloat16":
            # half the bytes (a larger model's stage must come back, and be carried again, within a call's
            # limits); the run it resumes keeps fp32 master weights, so this rounds once per device call.
            # The decay tensors stay fp32: the planner reads them
            weights = {k: v if k.endswith(("A_log", "dt_bias")) or not v.is_floating_point() else v.to(torch.bfloat16)
                       for k, v in weights.items()}
        state = {"model": weights, "step": step, "curve": curve, "curriculum": curriculum.state(),
                 "config": asdict(cfg), "runs": runs, "task_losses": per_task.state()}
        if stage_optimizer:
            state["opt"] = opt.state_dict()
        torch.save(state, os.path.join(stage, "train_state.pt"))
    meta = {"config": asdict(cfg), "steps": step, "seconds": time.time() - t0, "device": device,
            "resumed_from": resume and os.path.abspath(resume), "recurrence": recurrence, "conv": conv,
            "curriculum": curriculum.state(), "runs": runs, "task_answer_loss": per_task.means(),
            "loss_curve": curve, "command": command}
    save(model.cpu(), out, meta)
    return meta


def export(stage_file: str, out: str) -> dict:
    """The bf16 checkpoint (save_pretrained + train_meta.json) of a staged run: a device call returns the
    fp32 stage (the model would not fit beside it in a returned file), and the model is written here."""
    state = _load_stage(stage_file, "cpu")
    if "config" not in state:
        raise ValueError(f"{stage_file}: a stage without its config (written before --export existed)")
    config = dict(state["config"])
    config["curriculum"] = LengthCurriculum(**config["curriculum"])
    config["tasks"] = tuple(config["tasks"]) if config.get("tasks") else None
    cfg = TrainConfig(**config)
    model = build_model(cfg)
    model.load_state_dict(state["model"])
    meta = {"config": asdict(cfg), "steps": state["step"], "runs": state.get("runs", []),
            "seconds": sum(r["seconds"] for r in state.get("runs", [])), "exported_from": os.path.basename(stage_file),
            "curriculum": state.get("curriculum"), "loss_curve": state["curve"],
            "command": " ".join(["python -m trtllm_dasc.evals.train", *sys.argv[1:]])}
    save(model.eval(), out, meta)
    return meta


@contextlib.contextmanager
def _sigterm_sets_event():
    """An Event that SIGTERM (a device command's timeout) sets instead of killing the process, so the
    loop ends and the run saves; the previous handler comes back afterwards."""
    import signal
    import threading
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def _load_stage(resume: str, device: str) -> dict:
    """A --stage directory (train_state.pt inside) or the state file itself."""
    import torch
    path = os.path.join(resume, "train_state.pt") if os.path.isdir(resume) else resume
    if not os.path.isfile(path):
        raise ValueError(f"--resume {resume}: no staged state at {path}")
    return torch.load(path, map_location=device)


_CURRICULUM = LengthCurriculum()        # the CLI's defaults


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="kda", choices=CHOICES["arch"])
    ap.add_argument("--out", required=True, help="checkpoint directory to write (save_pretrained)")
    ap.add_argument("--minutes", type=float, default=9.0, help="training time budget")
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES),
                    help="model shape and schedule preset (SIZES in this file; the flags below override it)")
    ap.add_argument("--min-length", type=int, default=None, help="default 1024 (--size large: 1024)")
    ap.add_argument("--max-length", type=int, default=None, help="default 4096 (--size large: 8192)")
    ap.add_argument("--tokens-per-step", type=int, default=None, help="default 32768 (--size large: 65536)")
    ap.add_argument("--decay-init", default=None, choices=CHOICES["decay_init"],
                    help="A_log / dt_bias from the paper's profile (default), or transformers' init")
    ap.add_argument("--freeze-decay", action="store_true", default=None,
                    help="hold A_log / dt_bias at the paper's profile (out of the optimizer; needs --decay-init "
                         "paper; on --resume a stage's drifted decay is reset to the profile first)")
    ap.add_argument("--lr", type=float, default=None, help=f"peak learning rate (AdamW; default {DEFAULT_LR})")
    ap.add_argument("--tasks", default=None, help="comma-separated training tasks (default: all of evals/tasks.py)")
    ap.add_argument("--conv", default=None, choices=CHOICES["conv"],
                    help="short convolution on a GPU: fla's Triton kernel where it passes its check (auto, the "
                         "default) or transformers' torch fallback")
    ap.add_argument("--answer-weighting", default=None, choices=CHOICES["answer_weighting"],
                    help="loss weight of the answer tokens: each token alike (default) or each example alike "
                         "(--size large: row)")
    ap.add_argument("--task-sampling", default=None, choices=CHOICES["task_sampling"],
                    help="each row's task: uniform (default), or half uniform and half by the tasks' recent "
                         "answer losses (--size large: loss)")
    ap.add_argument("--row-lengths", default=None, choices=CHOICES["row_lengths"],
                    help="each row's example length: uniform in [min-length, the batch length] (default), or within "
                         "one 512-token bucket of the batch length (less padding a step)")
    ap.add_argument("--qa-drill", type=int, default=None, metavar="K",
                    help="qa_1 / qa_2 training examples also ask up to K one-hop questions about their own "
                         "documents, each answer a target (default 0; evaluation never drills)")
    ap.add_argument("--gate-anchor", type=float, default=None, metavar="LAMBDA",
                    help="add LAMBDA x the mean squared log-ratio of each token's decay rate to its static one (KDA: "
                         "per key channel, GDN: per head) to the loss, holding the data-dependent gate near the profile dasc plans "
                         "from (default 0: none)")
    ap.add_argument("--set-order", default=None, choices=CHOICES["set_order"],
                    help="the answers of vt, cwe and fwe (scored as sets): trained in any order (default), or in the "
                         "generator's order (target; cwe's is the words' first appearance)")
    ap.add_argument("--start-length", type=int, default=_CURRICULUM.start, help="the curriculum's first batch length")
    ap.add_argument("--advance-loss", type=float, default=_CURRICULUM.advance_loss,
                    help="leave a curriculum stage when the answer loss EMA falls under this")
    ap.add_argument("--stage-steps", type=int, default=_CURRICULUM.stage_steps, help="... or after this many steps")
    ap.add_argument("--resume", default=None, help="a --stage directory of an earlier run, or its train_state.pt")
    ap.add_argument("--restart-curriculum", action="store_true",
                    help="with --resume: run the length curriculum again from --start-length (e.g. for new --tasks)")
    ap.add_argument("--anneal-minutes", type=float, default=0.0,
                    help="lower the lr linearly over the budget's last minutes, to a tenth of its peak at the "
                         "end (a run whose weights are evaluated next; default 0: constant after the warm-up)")
    ap.add_argument("--stage", default=None, help="also write fp32 weights here (to --resume from)")
    ap.add_argument("--stage-optimizer", action="store_true", help="stage Adam's moments too (3x the size)")
    ap.add_argument("--stage-dtype", default="float32", choices=["float32", "bfloat16"],
                    help="dtype of the staged weights (bfloat16: half the size; decay tensors stay fp32)")
    ap.add_argument("--export", default=None, metavar="STAGE",
                    help="write the bf16 model of a staged run (its train_state.pt) to --out, and train nothing")
    args = ap.parse_args(argv)
    if args.export:
        try:
            meta = export(args.export, args.out)
        except Exception as e:          # a foreign or damaged stage file: say so, no traceback
            print(f"train: error: cannot export {args.export}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        print(f"wrote {args.out}: {meta['steps']} steps of training")
        return 0
    try:
        preset = dict(SIZES[args.size])
        given = {"min_length": args.min_length, "max_length": args.max_length,
                 "tokens_per_step": args.tokens_per_step, "decay_init": args.decay_init, "lr": args.lr,
                 "freeze_decay": args.freeze_decay, "answer_weighting": args.answer_weighting,
                 "task_sampling": args.task_sampling, "conv": args.conv, "row_lengths": args.row_lengths,
                 "qa_drill": args.qa_drill, "gate_anchor": args.gate_anchor, "set_order": args.set_order}
        preset.update({k: v for k, v in given.items() if v is not None})
        cfg = TrainConfig(arch=args.arch, seed=args.seed, restart_curriculum=args.restart_curriculum,
                          tasks=tuple(args.tasks.split(",")) if args.tasks else None,
                          curriculum=LengthCurriculum(start=args.start_length, advance_loss=args.advance_loss,
                                                      stage_steps=args.stage_steps), **preset)
        meta = train(cfg, args.out, args.minutes, args.device, args.resume, args.stage, args.max_steps,
                     log=lambda m: print(m, file=sys.stderr, flush=True), stage_optimizer=args.stage_optimizer,
                     stage_dtype=args.stage_dtype, anneal_minutes=args.anneal_minutes)
    except (ValueError, RuntimeError) as e:
        print(f"train: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {meta['steps']} steps in {meta['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
