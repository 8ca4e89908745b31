"""EngineConfig: one serving arm (dense or dasc) and the engine's capacities, validated up front."""
from __future__ import annotations

from dataclasses import dataclass

from trtllm_dasc.errors import UserError

POLICIES = ("nr", "wr")


@dataclass(slots=True)
class EngineConfig:
    model: str                          # checkpoint directory
    # the arm: W_max = 0 + native codec is dense; anything else is dasc (plan from the decay weights)
    wmax: int = 0
    policy: str = "nr"                  # nr: zero-fill omitted units; wr: replay a suffix and merge them
    codec: str = "native"
    layout: str = "ragged"
    state_budget_bytes: int | None = None   # checkpoint pool budget; None: 64 dense checkpoints' worth
    replay_window: int | None = None    # wr window override (tokens); None: the plan's rule
    # runtime
    dtype: str = "float32"
    device: str = "cpu"
    backend: str = "auto"
    max_batch: int = 8                  # concurrently running requests (active state rows)
    max_context: int = 4096
    block_size: int = 16
    num_kv_blocks: int = 2048
    interval: int = 256                 # checkpoint every `interval` tokens of a prompt
    prefill_chunk: int = 2048           # tokens of one request's prefill per step
    prompt_only: bool = False           # checkpoint prompt ends only (the paper's strict replay protocol)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise UserError(f"policy must be nr or wr, got {self.policy!r}")
        for name in ("max_batch", "max_context", "block_size", "num_kv_blocks", "interval", "prefill_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{name} must be a positive integer, got {value!r}")
        if self.replay_window is not None and self.replay_window < 0:
            raise UserError(f"replay_window must be >= 0, got {self.replay_window}")

    @property
    def arm(self) -> str:
        if self.wmax == 0 and self.codec == "native":
            return "dense"
        return f"dasc-{self.policy} W={self.wmax} {self.codec} {self.layout}"
