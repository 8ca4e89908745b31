"""The arm spec: the allowed values and defaults every description of a serving arm shares, defined once.

An arm (dense, or dasc at some W_max) is described by EngineConfig (engine/config.py), PlanOptions
(plan/plan.py), ArmSpec (engine/arms.py), the state layout (state/layout.py) and the CLI flags of `dasc plan`,
`dasc-build` / `dasc serve`, `dasc logits` and clients/matched_hbm.py. All of them take their choices,
defaults, checks and flags from here; this module imports nothing of the package but errors.

Defaults, by who asks (the one place that says which path has which default):
  planning and building: `dasc plan`, `dasc-build`, `dasc serve` of a checkpoint, PlanOptions,
      clients/matched_hbm.py: W_max 16 and placement hybrid. dasc-build (and matched_hbm's builds) record
      placement off at TP 1 (build_placement: one rank has nothing to balance);
  an engine made directly: EngineConfig, `dasc logits`: W_max 0 (dense) and placement off;
  both: policy nr, codec native, layout ragged, selection decay (no mask seed), TP 1.

Adding a codec is one line in CODECS (its stored bytes follow from the entry) plus its kernels (state/).
"""
from __future__ import annotations

from dataclasses import dataclass

from trtllm_dasc.errors import UserError


@dataclass(frozen=True, slots=True)
class Codec:
    """How a temporal unit is stored: its element width and its scales (paper Eq. 10, App. E.1)."""

    name: str
    # bits per stored element; None: the temporal dtype's own width (no quantization)
    payload_bits: int | None
    # one scale per row of d_v (per (l, h, k), shared over d_v), in the temporal source dtype
    row_scales: bool


# name -> codec; the first is the default (the lossless one)
CODECS_BY_NAME = {c.name: c for c in (
    Codec("native", None, False),
    Codec("int8", 8, True),
    Codec("fp8", 8, True),         # e4m3 (state/codec_naive.py)
    Codec("int4", 4, True),        # two values a byte along each row of d_v
)}
CODECS = tuple(CODECS_BY_NAME)
# the conv state: its own dtype, or int8 with one fp32 scale per (layer, request) (state/conv8_naive.py)
CONV_CODECS = ("native", "int8")
LAYOUTS = ("ragged", "padded")
PLACEMENTS = ("off", "storage", "hybrid")
# wr-warm: wr whose scratch row starts from the checkpoint's retained units instead of zeros (the quality
# issue's candidate replay for KDA, whose delta rule couples channels). Experimental: it equals wr on both
# the single-needle and the 13-task trained models (python -m trtllm_dasc.evals.run measures it)
POLICIES = ("nr", "wr", "wr-warm")
# random: the paper's count-matched control (as many units per layer as decay keeps, drawn with a seed)
SELECTIONS = ("decay", "random")

# checkpoint eviction (cache/radix.py, invariant 8): least recently used, or Marconi's FLOPs saved per byte
# aged by recency
EVICTIONS = ("lru", "cost")
DEFAULT_EVICTION = "lru"
# when a checkpoint reaches the host tier (cache/radix.py, invariant 7): copied on its device eviction
# (write-back), or at store time, so that a device eviction never copies (write-through)
HOST_WRITE_POLICIES = ("write-back", "write-through")
DEFAULT_HOST_WRITE_POLICY = "write-back"

# the engine's runtime choices, shared by EngineConfig and the CLIs that set them
DTYPES = ("float32", "bfloat16", "float16")
BACKENDS = ("auto", "torch", "fla", "fla-unfused")   # model/recurrence/__init__.py says what each runs
LOAD_FORMATS = ("auto", "safetensors", "dummy")

DEFAULT_CODEC = CODECS[0]
DEFAULT_LAYOUT = "ragged"
DEFAULT_POLICY = "nr"
DEFAULT_SELECTION = "decay"
DEFAULT_TP = 1
# the TP group's collective timeout (seconds): long enough for one rank to compile a kernel the others already have
DEFAULT_TP_TIMEOUT_S = 600.0
# prompt token ids outside the vocabulary: embedded as zeros, as TensorRT-LLM's embedding lookup writes them
# (its tools/inflight_batcher_llm/benchmark_core_model.py sends random ids in [0, 2^31)): what a built, served
# engine does by default; or refused, naming the id: an engine made directly (ENGINE_OUT_OF_VOCAB_INPUTS below)
OUT_OF_VOCAB_INPUTS = ("zero", "refuse")
DEFAULT_OUT_OF_VOCAB_INPUTS = "zero"
# planning and building (see the module docstring)
DEFAULT_WMAX = 16
DEFAULT_PLACEMENT = "hybrid"
# an engine made directly (EngineConfig, dasc logits)
ENGINE_WMAX = 0
ENGINE_PLACEMENT = "off"
ENGINE_OUT_OF_VOCAB_INPUTS = "refuse"
# the random selection's seed feeds numpy's SeedSequence, which takes any non-negative integer; we keep
# it to what a JSON reader of any language holds exactly
MAX_MASK_SEED = 2**63 - 1

# PlanOptions field -> the EngineConfig field of the same fact (an engine's plan must agree on each)
PLAN_TO_ENGINE = {"wmax": "wmax", "tp": "tp_size", "placement": "placement", "codec": "codec",
                  "layout": "layout", "selection": "selection", "mask_seed": "mask_seed", "precision": "precision",
                  "conv_codec": "conv_codec"}
# a checkpoint's precision: every kept unit in the codec (uniform), or a codec per horizon band
# (plan/precision.py parses horizon[:H1,H2[:c0,c1,c2]])
DEFAULT_PRECISION = "uniform"
DEFAULT_CONV_CODEC = "native"


def check_choice(name: str, value, allowed: tuple) -> None:
    """One line naming the field and its choices (``name`` as the user wrote it: a flag or a field)."""
    if value not in allowed:
        raise UserError(f"{name} must be one of {'|'.join(allowed)}, got {value!r}")


def check_selection(selection, mask_seed) -> int | None:
    """The selection and its mask seed, checked together; returns the seed as a plain int (or None)."""
    check_choice("--selection", selection, SELECTIONS)
    if (selection == "random") != (mask_seed is not None):
        raise UserError("--selection random needs --mask-seed (and --mask-seed needs --selection random)")
    if mask_seed is None:
        return None
    if isinstance(mask_seed, bool) or not hasattr(mask_seed, "__index__") or not 0 <= mask_seed <= MAX_MASK_SEED:
        raise UserError(f"--mask-seed must be an integer in [0, 2^63 - 1], got {mask_seed!r}")
    return int(mask_seed.__index__())


def build_placement(placement: str, tp: int) -> str:
    """The placement a build records: off at TP 1 (one rank: nothing to balance), else the one asked for."""
    return placement if tp > 1 else "off"


def plan_fields(engine) -> dict:
    """The PlanOptions fields of an engine's arm (an EngineConfig, or a dict of its fields)."""
    get = engine.get if isinstance(engine, dict) else (lambda k: getattr(engine, k))
    return {plan: get(eng) for plan, eng in PLAN_TO_ENGINE.items()}


def _flags(engine: bool) -> dict:
    wmax = ENGINE_WMAX if engine else DEFAULT_WMAX
    return {
        "wmax": dict(type=int, default=wmax, help="W_max: units with a static horizon <= W_max are omitted from "
                     f"checkpoints (0: dense, keep everything; default {wmax})"),
        "selection": dict(default=DEFAULT_SELECTION, choices=SELECTIONS, help="decay (dasc) or random: as many "
                          "units per layer, drawn uniformly (the paper's count-matched control; needs --mask-seed)"),
        "mask_seed": dict(type=int, default=None, help="seed of --selection random"),
        "policy": dict(default=DEFAULT_POLICY, choices=POLICIES, help="load policy for omitted units: nr zero-fills "
                       "them, wr replays the last W cached tokens (wr-warm, experimental: the replay starts from the "
                       "checkpoint's retained units)"),
        "codec": dict(default=DEFAULT_CODEC, choices=CODECS,
                      help=f"checkpoint temporal codec of --precision uniform (default {DEFAULT_CODEC})"),
        "precision": dict(default=DEFAULT_PRECISION, help="uniform (every kept unit in --codec) or "
                          "horizon[:H1,H2[:c0,c1,c2]]: each kept unit's codec from its horizon band, thresholds in "
                          f"tokens (default {DEFAULT_PRECISION}; a bare horizon means horizon:128,1024:int4,int8,int8)"),
        "conv_codec": dict(default=DEFAULT_CONV_CODEC, choices=CONV_CODECS, help="checkpoint conv state codec: "
                           f"native (its dtype, the paper) or int8 (one scale per layer); default {DEFAULT_CONV_CODEC}"),
        "layout": dict(default=DEFAULT_LAYOUT, choices=LAYOUTS,
                       help=f"checkpoint temporal slot layout (default {DEFAULT_LAYOUT})"),
        "tp": dict(type=int, default=DEFAULT_TP, help=f"tensor-parallel degree (default {DEFAULT_TP})"),
        "placement": dict(default=ENGINE_PLACEMENT if engine else DEFAULT_PLACEMENT, choices=PLACEMENTS,
                          help="TP placement of the checkpoint units (with --tp > 1): off, storage (balanced slot "
                               "widths), hybrid (bundle permutation + storage)"),
    }


ARM_FLAGS = tuple(_flags(False))


def add_arm_arguments(parser, names=ARM_FLAGS, *, engine: bool = False) -> None:
    """The arm's flags (``names``: a subset of ARM_FLAGS, in this order) with the spec's choices and help;
    engine=True gives an engine's defaults (W_max 0, placement off), else planning's (W_max 16, hybrid)."""
    flags = _flags(engine)
    for name in names:
        parser.add_argument("--" + name.replace("_", "-"), **flags[name])
