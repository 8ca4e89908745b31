"""EngineConfig: one serving arm (dense or dasc) and the engine's capacities, validated up front."""
from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, fields

from trtllm_dasc import engine_dir as engine_dir_format
from trtllm_dasc.engine.slow_step import check_seconds
from trtllm_dasc.errors import UserError
from trtllm_dasc.spec import (BACKENDS, CODECS, CONV_CODECS, DEFAULT_CODEC, DEFAULT_EVICTION, DEFAULT_LAYOUT, DEFAULT_POLICY, DEFAULT_SELECTION,
                              DEFAULT_TP, DTYPES, ENGINE_PLACEMENT, EVICTIONS, ENGINE_WMAX, LAYOUTS, LOAD_FORMATS, PLACEMENTS,
                              POLICIES, check_choice, check_selection)
from trtllm_dasc.spec import DEFAULT_HOST_WRITE_POLICY, DEFAULT_TP_TIMEOUT_S, HOST_WRITE_POLICIES
from trtllm_dasc.spec import ENGINE_OUT_OF_VOCAB_INPUTS, OUT_OF_VOCAB_INPUTS

MAX_TP = 64
# the load policies whose hits replay the last W cached tokens
REPLAYING_POLICIES = ("wr", "wr-warm")
# a sanity cap on every count (a typo of 10 extra digits must not try to allocate the world)
# int32's largest: max_batch_size and the other counts go into config.pbtxt as int32 (2^31 was out of range)
MAX_COUNT = (1 << 31) - 1
# the ablation knobs' ranges: a delay of a minute a step or a hundredfold slowdown is a typo, not an ablation
MAX_STEP_DELAY_S = 60.0
MAX_STEP_SLOWDOWN = 100.0


@dataclass(slots=True)
class EngineConfig:
    model: str                          # checkpoint directory
    # the arm: W_max = 0 + native codec is dense; anything else is dasc (plan from the decay weights)
    wmax: int = ENGINE_WMAX
    policy: str = DEFAULT_POLICY        # nr: zero-fill omitted units; wr: replay a suffix and merge them
    codec: str = DEFAULT_CODEC
    layout: str = DEFAULT_LAYOUT
    state_budget_bytes: int | None = None   # checkpoint pool budget; None: 64 dense checkpoints' worth
    replay_window: int | None = None    # replay window override (tokens); None: the plan's rule
    selection: str = DEFAULT_SELECTION  # decay | random (count-matched control for quality experiments)
    mask_seed: int | None = None        # the random selection's seed
    # runtime
    dtype: str = "float32"
    device: str = "cpu"
    backend: str = "auto"
    # decode steps replayed as CUDA graphs (model/decode_graphs.py) where they can be: a GPU, the fla
    # backend, one rank; every other step, and every other setup, runs eagerly
    cuda_graphs: bool = True
    max_batch: int = 8                  # concurrently running requests (active state rows)
    max_context: int = 4096
    block_size: int = 16
    num_kv_blocks: int = 2048
    interval: int = 256                 # checkpoint every `interval` tokens of a prompt
    prefill_chunk: int = 2048           # tokens of one request's prefill per step
    max_num_tokens: int | None = None   # tokens of one step's forward, all requests (None: no cap)
    prompt_only: bool = False           # checkpoint prompt ends only (the paper's strict replay protocol)
    # checkpoints one step captures (None: as many as its spans meet); past it a chunk stops before the
    # next capture, which the next step takes. Bounds the step's captured states in the memory check
    # (model/workspace.py)
    max_step_captures: int | None = None
    kernel_cache_dir: str | None = None  # Triton's compiled-kernel cache (TRITON_CACHE_DIR); None: Triton's default
    plan_path: str | None = None        # a dasc plan JSON (an engine dir's plan.json); None: plan at start
    # tensor parallelism (parallel/): T ranks under one mpirun, rank 0 schedules; the budget is per rank
    tp_size: int = DEFAULT_TP
    placement: str = ENGINE_PLACEMENT   # the planner's TP placement of the units (spec.py: why off here)
    # how long a rank waits in a collective for the others (the TP group's timeout): a rank hung in a step
    # holds every other one that long, then the step fails and every rank aborts (parallel/runner.py)
    tp_timeout_s: float = DEFAULT_TP_TIMEOUT_S
    # a prompt token id outside [0, vocab): "zero" embeds it as a zero vector (TensorRT-LLM's lookup does, and
    # its benchmark tool sends such ids: a built engine's default, dasc-build --out-of-vocab-inputs), "refuse"
    # fails the request naming the id
    out_of_vocab_inputs: str = ENGINE_OUT_OF_VOCAB_INPUTS
    rank_weights: str | None = None     # per-rank weight files (dasc-build --tp); None: slice the checkpoint
    # the build's id in every rank's weight manifest: a rank file of another engine (same shapes, other
    # weights) is refused (model/rank_weights.py); None: an engine built before it was recorded
    rank_weights_id: str | None = None
    # sha256 of the plan dasc-build wrote to plan.json (DascPlan.digest): an edited plan.json is refused at
    # load; None: an engine built before it was recorded, or a plan made at start
    plan_digest: str | None = None
    # where the weights come from: safetensors (the checkpoint's files), dummy (random, made on the device at
    # load time: dasc-build --load-format dummy), auto (dummy when the checkpoint is a dummy one, else safetensors)
    load_format: str = "auto"
    # device memory one rank may take (weights + KV cache + state rows + checkpoint pool + the largest step's
    # transient tensors, model/workspace.py), checked before loading; None: the device's free memory (a CPU device is not checked)
    memory_limit_bytes: int | None = None
    # checkpoint precision: "uniform" (codec) or a horizon band spec (plan/precision.py), stored normalised
    precision: str = "uniform"
    # checkpoint conv state: the model dtype (native) or int8, one scale per layer (state/conv8_naive.py)
    conv_codec: str = "native"
    # the host tier of checkpoints (cache/radix.py invariant 7): bytes of host memory (pinned on a GPU) per
    # rank holding demoted checkpoints in their encoded form; 0: off (a device eviction drops)
    host_cache_bytes: int = 0
    # checkpoint eviction in both tiers: lru, or cost (Marconi: FLOPs saved per byte, aged by recency)
    eviction: str = DEFAULT_EVICTION
    # when a checkpoint reaches the host tier: write-back (copied on its device eviction) or write-through
    # (copied at store time; a device eviction then copies nothing)
    host_write_policy: str = DEFAULT_HOST_WRITE_POLICY
    # host KV blocks per rank (cache/radix.py invariant 9): a KV eviction moves a cached prefix's blocks
    # there (with its checkpoint) instead of dropping them; 0: off
    host_kv_blocks: int = 0
    # a step whose runner took longer than this many seconds says on stderr what it ran (engine/slow_step.py);
    # None: $DASC_SLOW_STEP_S, else 5 s (a served engine's config is its engine directory's); 0: off
    slow_step_s: float | None = None
    # measurement ablations only (issue 33: is a missed serving target the engine's speed or the workload's
    # scale?): each step's results are held back step_delay_s more, and (step_slowdown - 1) x the step's own
    # time more, as a slower engine's would be. 0 and 1: off (the defaults). Never a serving setting.
    step_delay_s: float = 0.0
    step_slowdown: float = 1.0

    def __post_init__(self):
        # lazy: torch / numpy load only when this runs (keeps importing this module light)
        from trtllm_dasc.plan.precision import check_device_runs, parse_precision
        bands = parse_precision(self.precision, self.wmax if isinstance(self.wmax, int) else None)
        self.precision = "uniform" if bands is None else bands.spec()
        check_device_runs(bands, self.codec)
        if not isinstance(self.model, str) or not self.model:
            raise UserError(f"model must be a checkpoint directory path, got {self.model!r}")
        for name, allowed in (("policy", POLICIES), ("codec", CODECS), ("conv_codec", CONV_CODECS), ("layout", LAYOUTS), ("dtype", DTYPES),
                              ("backend", BACKENDS), ("placement", PLACEMENTS), ("load_format", LOAD_FORMATS),
                              ("eviction", EVICTIONS), ("host_write_policy", HOST_WRITE_POLICIES),
                              ("out_of_vocab_inputs", OUT_OF_VOCAB_INPUTS)):
            check_choice(name, getattr(self, name), allowed)
        for name in ("max_batch", "max_context", "block_size", "num_kv_blocks", "interval", "prefill_chunk"):
            _count(self, name, minimum=1)
        _count(self, "wmax", minimum=0)
        _count(self, "host_cache_bytes", minimum=0, cap=1 << 50)
        _count(self, "host_kv_blocks", minimum=0, cap=1 << 40)
        _count(self, "tp_size", minimum=1, cap=MAX_TP)
        self.mask_seed = check_selection(self.selection, self.mask_seed)
        for name in ("replay_window", "state_budget_bytes", "max_num_tokens", "memory_limit_bytes",
                     "max_step_captures"):
            if getattr(self, name) is not None:
                _count(self, name, minimum=0 if name == "replay_window" else 1, cap=1 << 50)
        if self.slow_step_s is not None:
            self.slow_step_s = check_seconds("slow_step_s", self.slow_step_s)
        self.tp_timeout_s = _bounded(self, "tp_timeout_s", 1.0, 86400.0)
        self.step_delay_s = _bounded(self, "step_delay_s", 0.0, MAX_STEP_DELAY_S)
        self.step_slowdown = _bounded(self, "step_slowdown", 1.0, MAX_STEP_SLOWDOWN)
        if not isinstance(self.prompt_only, bool):
            raise UserError(f"prompt_only must be true or false, got {self.prompt_only!r}")
        if not isinstance(self.device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise UserError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.device == "cpu" and self.backend in ("fla", "fla-unfused"):
            # said here, so dasc-build refuses it before writing an engine no machine can serve
            raise UserError(f"backend {self.backend} runs fla's Triton kernels, which need a CUDA device, and device "
                            "is cpu: use backend auto or torch on the cpu")
        for name in ("kernel_cache_dir", "plan_path", "rank_weights", "rank_weights_id", "plan_digest"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise UserError(f"{name} must be a path, got {getattr(self, name)!r}")

    @property
    def replays(self) -> bool:
        """Whether a hit replays the last W cached tokens (wr and wr-warm)."""
        return self.policy in REPLAYING_POLICIES

    @property
    def arm(self) -> str:
        if self.wmax == 0 and self.codec == "native":
            return "dense"
        arm = f"dasc-{self.policy} W={self.wmax} {self.codec} {self.layout}"
        return arm + (f" random mask {self.mask_seed}" if self.selection == "random" else "")

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def from_engine_fields(engine: dict, where: str = "the engine's config.json") -> EngineConfig:
    """EngineConfig(**engine) of an engine directory's "engine" section, with a field this dasc does not know
    (an engine of a newer dasc that kept the format version) or one it needs but lacks refused in one UserError
    line naming it (it was a TypeError traceback)."""
    known = {f.name for f in fields(EngineConfig)}
    unknown = sorted(set(engine) - known)
    if unknown:
        raise UserError(f"{where} has engine field(s) this dasc does not know ({', '.join(unknown)}): it was built "
                        "by another dasc version; rebuild it with this dasc-build")
    required = {f.name for f in fields(EngineConfig) if f.default is MISSING and f.default_factory is MISSING}
    missing = sorted(required - set(engine))
    if missing:
        raise UserError(f"{where} lacks engine field(s) {', '.join(missing)}; rebuild it with dasc-build")
    return EngineConfig(**engine)


def engine_config(engine_dir: str) -> EngineConfig:
    """The EngineConfig an engine directory's config.json describes (paths resolved against the directory)."""
    return from_engine_fields(engine_dir_format.read(engine_dir).engine, f"{engine_dir}/config.json")


def _count(cfg, name: str, minimum: int, cap: int = MAX_COUNT) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise UserError(f"{name} must be an integer, got {value!r}")
    value = int(value.__index__())
    if not minimum <= value <= cap:
        raise UserError(f"{name} must be an integer in [{minimum}, {cap}], got {value}")
    setattr(cfg, name, value)


def _bounded(cfg, name: str, low: float, high: float) -> float:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise UserError(f"{name} must be a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def replay_tokens(policy: str, plan_window: int, max_context: int, override: int | None = None) -> int:
    """The tokens a hit replays: the plan's window (paper Sec. 4.2) unless overridden (EngineConfig.replay_window),
    never past max_context (a replay never reaches further back than a prompt can be long); 0 when nothing is
    omitted (dense) or the policy does not replay (nr). The runner's, and what the clients that size an engine's
    largest step (model/workspace.py) count for a wr arm."""
    if policy not in REPLAYING_POLICIES or not plan_window:
        return 0
    return min(plan_window if override is None else override, max_context)
