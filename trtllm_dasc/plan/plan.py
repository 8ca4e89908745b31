"""DascPlan: the offline compression plan the engine, the state store and the Triton backend consume.

It fixes which units every checkpoint keeps, where they live (head-bundle permutation, storage-balanced
slot positions) and what a checkpoint costs per rank. It serialises to JSON (``to_dict``/``from_dict``,
versioned); everything derived is recomputed on load from the decisions it stores, and checked.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np

from trtllm_dasc.checkpoint_files import dummy_marker, has_weights
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.engine_dir import model_dir_of
from trtllm_dasc.errors import UserError
from trtllm_dasc.plan import accounting
from trtllm_dasc.plan.horizons import DEFAULT_A, DEFAULT_EPS
from trtllm_dasc.plan.permutation import balance_bundles, identity_order
from trtllm_dasc.plan.precision import UNIFORM, HorizonBands, assign_bands, parse_precision
from trtllm_dasc.plan.selection import check_wmax, random_units, replay_window, select_units
from trtllm_dasc.plan.storage import StoragePlan, balance_storage
from trtllm_dasc.spec import (CODECS, DEFAULT_CODEC, DEFAULT_LAYOUT, DEFAULT_PLACEMENT, DEFAULT_SELECTION, DEFAULT_TP,
                              DEFAULT_WMAX, LAYOUTS, PLACEMENTS, CONV_CODECS, check_choice, check_selection)
from trtllm_dasc.plan.horizons import read_decay_params
from trtllm_dasc.plan.horizons import decay_factors, horizons_from_params
from trtllm_dasc.plan.synthetic import profile_decay_params, profile_of_record

PLAN_VERSION = 1
# the static gate logit stands for a typical input (the paper: -0.3, compared with 0); beyond +-3 softplus
# pushes every head to the end of its decay range and the plan describes no input (--a 5 kept nothing and
# printed an infinite compression)
A_RANGE = (-3.0, 3.0)
# eps: the fraction a unit's memory decays to; below 1e-12 horizons measure float noise, above 0.5 the
# "horizon" is shorter than a half-life
EPS_RANGE = (1e-12, 0.5)


@dataclass(slots=True)
class PlanOptions:
    wmax: int = DEFAULT_WMAX
    tp: int = DEFAULT_TP
    placement: str = DEFAULT_PLACEMENT
    codec: str = DEFAULT_CODEC
    layout: str = DEFAULT_LAYOUT
    a: float = DEFAULT_A
    eps: float = DEFAULT_EPS
    # "random": the paper's count-matched control, as many units per layer as the decay selection keeps,
    # drawn uniformly with mask_seed (quality experiments only)
    selection: str = DEFAULT_SELECTION
    mask_seed: int | None = None
    # "uniform" (every kept unit in codec) or a horizon band spec (plan/precision.py), stored normalised
    precision: str = UNIFORM
    # the conv state's checkpoint codec: its own dtype, or int8 with a scale per layer (state/conv8_naive.py)
    conv_codec: str = "native"

    def __post_init__(self):
        check_wmax(self.wmax)
        self.mask_seed = check_selection(self.selection, self.mask_seed)
        check_choice("--conv-codec", self.conv_codec, CONV_CODECS)
        bands = parse_precision(self.precision, self.wmax)
        if bands is not None:
            self.precision = bands.spec()
            if self.layout != "ragged":
                raise UserError("--precision horizon packs each rank's units ragged by codec: use --layout ragged")
            if self.codec != "native":
                raise UserError(f"--codec {self.codec} is for --precision uniform; --precision horizon names its "
                                "codecs per band (horizon:H1,H2:c0,c1,c2)")
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise UserError(f"--tp must be a positive integer, got {self.tp!r}")
        for name, allowed in (("placement", PLACEMENTS), ("codec", CODECS), ("layout", LAYOUTS)):
            check_choice(f"--{name}", getattr(self, name), allowed)
        # NaN compares false both ways: without these checks --a nan kept every unit and printed NaN JSON
        if isinstance(self.a, bool) or not isinstance(self.a, (int, float)) or not math.isfinite(self.a):
            raise UserError(f"--a must be a finite number, got {self.a!r}")
        if not A_RANGE[0] <= self.a <= A_RANGE[1]:
            raise UserError(f"--a (the static gate logit) must lie in [{A_RANGE[0]:g}, {A_RANGE[1]:g}] (the paper "
                            f"uses {DEFAULT_A}), got {self.a!r}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not 0.0 < self.eps < 1.0:
            raise UserError(f"--eps must lie in (0, 1), got {self.eps!r}")
        if not EPS_RANGE[0] <= self.eps <= EPS_RANGE[1]:
            raise UserError(f"--eps must lie in [{EPS_RANGE[0]:g}, {EPS_RANGE[1]:g}] (the paper uses {DEFAULT_EPS:g}), "
                            f"got {self.eps!r}")

    @property
    def bands(self) -> HorizonBands | None:
        return parse_precision(self.precision, self.wmax)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(slots=True)
class DascPlan:
    config: HybridConfig
    options: PlanOptions
    retained: list[list[int]]          # per linear layer: kept original unit ids, sorted
    bundle_order: list[list[int]]      # per linear layer: position p holds original bundle [l][p]
    permutation_optimal: bool
    replay_window: int                 # dasc-wr replay window W in tokens (0: nothing omitted)
    decay_summary: dict = field(default_factory=dict)
    storage: StoragePlan | None = None  # derived: None for placement 'off'
    # horizon precision: per layer, the band of each kept unit (parallel to retained); None for uniform
    retained_bands: list[list[int]] | None = None

    def __post_init__(self):
        cfg, opt = self.config, self.options
        shard = cfg.shard(opt.tp)   # raises on a TP degree that does not divide the heads
        if len(self.retained) != cfg.num_linear_layers or len(self.bundle_order) != cfg.num_linear_layers:
            raise UserError("plan lists do not match the number of linear layers")
        # a plan.json read back (an engine's, edited or corrupt) is checked here: an id past the layer's units
        # failed the engine's load with a bare KeyError, a repeated or unsorted one was served
        for l, kept in enumerate(self.retained):
            if not isinstance(kept, list) or any(isinstance(u, bool) or not isinstance(u, int) for u in kept):
                raise UserError(f"plan's retained units of linear layer {l} must be a list of integer unit ids")
            if kept and not (min(kept) >= 0 and max(kept) < cfg.units_per_layer):
                raise UserError(f"plan's retained units of linear layer {l} hold ids out of range "
                                f"0..{cfg.units_per_layer - 1}")
            if any(a >= b for a, b in zip(kept, kept[1:])):
                raise UserError(f"plan's retained units of linear layer {l} must be sorted unit ids without repeats")
        for order in self.bundle_order:
            if sorted(order) != list(range(cfg.num_bundles)):
                raise UserError("bundle_order must be a permutation of whole bundles in every layer")
        bands = opt.bands
        if (bands is None) != (self.retained_bands is None):
            raise UserError("a horizon-precision plan needs the band of every kept unit (and a uniform one none)")
        if bands is not None:
            if [len(b) for b in self.retained_bands] != [len(k) for k in self.retained] or any(
                    not 0 <= i <= len(bands.thresholds) for row in self.retained_bands for i in row):
                raise UserError("retained_bands do not match the retained units or the precision's bands")
        if opt.placement != "off":
            self.storage = balance_storage(self._segment_counts())
        del shard

    # ---- horizon precision: one ragged segment per codec -----------------------------------------------
    @property
    def codec_segments(self) -> list[str]:
        """The codecs a slot holds, in band order without repeats (uniform: the one codec)."""
        bands = self.options.bands
        return [self.options.codec] if bands is None else list(dict.fromkeys(bands.codecs))

    def unit_codecs(self) -> list[list[str]]:
        """Per layer, the codec of each kept unit (parallel to retained)."""
        bands = self.options.bands
        if bands is None:
            return [[self.options.codec] * len(k) for k in self.retained]
        return [[bands.codecs[i] for i in row] for row in self.retained_bands]

    def rank_codec_counts(self) -> list[list[int]]:
        """[segment][r]: kept units of codec segment s computed on rank r."""
        cfg, tp = self.config, self.options.tp
        per_rank, upb = cfg.num_bundles // tp, cfg.units_per_bundle
        seg = {c: i for i, c in enumerate(self.codec_segments)}
        counts = [[0] * tp for _ in seg]
        for kept, codecs, order in zip(self.retained, self.unit_codecs(), self.bundle_order):
            rank_of_bundle = {b: p // per_rank for p, b in enumerate(order)}
            for u, c in zip(kept, codecs):
                counts[seg[c]][rank_of_bundle[u // upb]] += 1
        return counts

    def segment_widths(self) -> list[list[int]]:
        """[segment][r]: unit positions of each codec segment rank r allocates (mixed plans)."""
        counts = self.rank_codec_counts()
        if self.storage is None:
            return counts
        return [[w] * self.options.tp for w in self.storage.widths]

    # ---- where units live ----------------------------------------------------------------------------
    def local_retained(self, rank: int) -> list[list[int]]:
        """Per layer, the kept units rank ``rank`` computes, as sorted *local* unit ids after the
        permutation (gdn: local value head; kda: local_head * K + k)."""
        cfg, tp = self.config, self.options.tp
        per_rank, upb = cfg.num_bundles // tp, cfg.units_per_bundle
        out = []
        for kept, order in zip(self.retained, self.bundle_order):
            kept_set = set(kept)
            local = []
            for p in range(rank * per_rank, (rank + 1) * per_rank):
                b = order[p]
                base_local = (p - rank * per_rank) * upb
                local.extend(base_local + j for j in range(upb) if b * upb + j in kept_set)
            out.append(local)
        return out

    def rank_layer_counts(self) -> list[list[int]]:
        """[l][r]: kept units of layer l computed on rank r."""
        cfg, tp = self.config, self.options.tp
        per_rank, upb = cfg.num_bundles // tp, cfg.units_per_bundle
        counts = []
        for kept, order in zip(self.retained, self.bundle_order):
            rank_of_bundle = {b: p // per_rank for p, b in enumerate(order)}
            row = [0] * tp
            for u in kept:
                row[rank_of_bundle[u // upb]] += 1
            counts.append(row)
        return counts

    def rank_units(self) -> list[int]:
        """U_r: kept units each rank computes (before storage balancing)."""
        return [sum(col) for col in zip(*self.rank_layer_counts())]

    def _segment_counts(self) -> list[list[int]]:
        if self.options.bands is not None:
            return self.rank_codec_counts()
        if self.options.layout == "ragged":
            return [self.rank_units()]
        return self.rank_layer_counts()

    def rank_widths(self) -> list[int]:
        """Unit positions each rank allocates per slot (layout and placement applied)."""
        L, tp = self.config.num_linear_layers, self.options.tp
        if self.options.bands is not None:
            return [sum(col) for col in zip(*self.segment_widths())]
        if self.options.layout == "ragged":
            if self.storage is None:
                return self.rank_units()
            return [self.storage.widths[0]] * tp
        if self.storage is None:
            return [L * max(col, default=0) for col in zip(*self.rank_layer_counts())]
        return [L * max(self.storage.widths, default=0)] * tp

    def transfer_units(self, t) -> list[tuple[int, int]]:
        """The exact units a storage transfer moves, in order, as (linear layer index, local unit id) on
        the source rank: the all-to-all's send list (and, reversed, the receive list of the load)."""
        local = self.local_retained(t.src)
        if self.options.bands is not None:
            flat = [(l, u) for l, units in enumerate(self.segment_retained(t.src, t.segment)) for u in units]
        elif self.options.layout == "ragged":
            flat = [(l, u) for l, units in enumerate(local) for u in units]
        else:
            flat = [(t.segment, u) for u in local[t.segment]]
        return flat[t.src_start:t.src_start + t.count]

    def local_codecs(self, rank: int) -> list[list[str]]:
        """Per layer, the codec of each kept unit rank ``rank`` computes (parallel to local_retained)."""
        cfg, tp = self.config, self.options.tp
        per_rank, upb = cfg.num_bundles // tp, cfg.units_per_bundle
        out = []
        for l, (local, codecs) in enumerate(zip(self.local_retained(rank), self.unit_codecs())):
            codec_of = dict(zip(self.retained[l], codecs))
            order = self.bundle_order[l]
            out.append([codec_of[order[rank * per_rank + u // upb] * upb + u % upb] for u in local])
        return out

    def local_codec(self, rank: int, layer: int, local_unit: int) -> str:
        """The codec of a kept unit given by its rank-local id."""
        local = self.local_retained(rank)[layer]
        return self.local_codecs(rank)[layer][local.index(local_unit)]

    def segment_retained(self, rank: int, segment: int) -> list[list[int]]:
        """Per layer, the kept local units of rank ``rank`` in codec segment ``segment`` (sorted)."""
        codec = self.codec_segments[segment]
        return [[u for u, c in zip(units, codecs) if c == codec]
                for units, codecs in zip(self.local_retained(rank), self.local_codecs(rank))]

    def segment_foreign(self, rank: int, segment: int) -> list[list[int]]:
        """Per layer, the kept local units of rank ``rank`` that other codec segments store."""
        codec = self.codec_segments[segment]
        return [[u for u, c in zip(units, codecs) if c != codec]
                for units, codecs in zip(self.local_retained(rank), self.local_codecs(rank))]

    @property
    def conv_segment(self) -> int:
        """The codec segment whose slot holds the conv state: the first any rank stores units of (the same
        on every rank, so a segment no rank uses need not exist), segment 0 when none does."""
        return next((s for s, w in enumerate(self.segment_widths()) if any(w)), 0)

    @property
    def moved_units(self) -> int:
        return self.storage.moved_units if self.storage else 0

    # ---- accounting ----------------------------------------------------------------------------------
    def slot_bytes_per_rank(self) -> list[int]:
        if self.options.bands is not None:
            return accounting.mixed_slot_bytes_per_rank(self.config, self.options.tp, self.codec_segments,
                                                        self.segment_widths(), self.options.conv_codec)
        return accounting.slot_bytes_per_rank(self.config, self.options.tp, self.rank_widths(),
                                              self.options.codec, self.options.conv_codec)

    def bottleneck_slot_bytes(self) -> int:
        return max(self.slot_bytes_per_rank())

    def report(self, budget_bytes: int | None = None) -> dict:
        return accounting.report(self, budget_bytes)

    # ---- serialisation -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        # "wr_window" is the replay window's key in the plan.json engine dirs record (kept: a contract)
        return {"plan_version": PLAN_VERSION, "config": self.config.to_dict(), "options": self.options.to_dict(),
                "retained_units": self.retained, "bundle_order": self.bundle_order,
                "permutation_optimal": self.permutation_optimal, "wr_window": self.replay_window,
                "decay_summary": self.decay_summary,
                **({"retained_bands": self.retained_bands} if self.retained_bands is not None else {}),
                "storage_transfers": [t.to_dict() for t in self.storage.transfers] if self.storage else []}

    def digest(self) -> str:
        """sha256 of the plan's content (to_dict as canonical JSON): dasc-build records it in the engine's
        config, so a plan.json edited after the build (another selection under the same options, served
        silently) is refused at load (engine/runner.py engine_plan). JSON round-trips every value exactly."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def from_dict(cls, d: dict) -> "DascPlan":
        if d.get("plan_version") != PLAN_VERSION:
            raise UserError(f"plan version {d.get('plan_version')!r} is not {PLAN_VERSION}; re-run dasc plan")
        c = dict(d["config"])
        cfg = HybridConfig(**{k: c[k] for k in HybridConfig.__slots__ if k in c and k != "raw"})
        plan = cls(config=cfg, options=PlanOptions(**d["options"]), retained=d["retained_units"],
                   bundle_order=d["bundle_order"], permutation_optimal=d["permutation_optimal"],
                   replay_window=d["wr_window"], decay_summary=d.get("decay_summary", {}),
                   retained_bands=d.get("retained_bands"))
        stored = d.get("storage_transfers", [])
        derived = [t.to_dict() for t in plan.storage.transfers] if plan.storage else []
        if stored != derived:
            raise UserError("plan's storage_transfers disagree with its retained units; the file was edited")
        return plan


def build_plan(cfg: HybridConfig, horizons: list[np.ndarray] | None, options: PlanOptions) -> DascPlan:
    """Select, lay out and place. ``horizons`` may be None only for W_max = 0 (keep everything)."""
    cfg.shard(options.tp)
    used = set(options.bands.codecs) if options.bands is not None else {options.codec}
    if "int4" in used and cfg.value_head_dim % 2:
        # the layout and both codec paths pack two values a byte (state/layout.py): refused here, where dasc plan
        # and dasc-build see it, not when the engine starts
        raise UserError(f"codec int4 packs two values a byte: this model's value head dim {cfg.value_head_dim} is "
                        "odd; choose other codecs")
    if horizons is None:
        if options.wmax != 0:
            raise UserError("--wmax > 0 needs the decay weights (A_log, dt_bias): pass a checkpoint "
                            "directory, not a bare config.json")
        retained = [list(range(cfg.units_per_layer)) for _ in cfg.linear_layers]
        window = 0
    else:
        retained = select_units(horizons, options.wmax)
        if options.selection == "random":
            retained = random_units([len(k) for k in retained], cfg.units_per_layer, options.mask_seed)
        window = replay_window(horizons, retained, options.wmax)
    bands = options.bands
    retained_bands = None
    if bands is not None:
        if horizons is None:
            raise UserError("--precision horizon needs the decay weights (A_log, dt_bias) to band the units: pass "
                            "a checkpoint directory, not a bare config.json")
        retained_bands = assign_bands(horizons, retained, bands)
    order, optimal = identity_order(cfg.num_linear_layers, cfg.num_bundles), True
    if options.placement == "hybrid":
        upb = cfg.units_per_bundle
        loads = []
        for l, kept in enumerate(retained):
            row = [0] * cfg.num_bundles
            for i, u in enumerate(kept):
                # mixed widths: a bundle weighs its bytes, so the permutation balances Eq. 8's bottleneck
                row[u // upb] += 1 if bands is None else cfg.unit_bytes(bands.codecs[retained_bands[l][i]])
            loads.append(row)
        perm = balance_bundles(loads, options.tp)
        order, optimal = perm.bundle_order, perm.optimal
    return DascPlan(config=cfg, options=options, retained=retained, bundle_order=order,
                    permutation_optimal=optimal, replay_window=window, retained_bands=retained_bands)


def plan_from_path(path: str, options: PlanOptions, temporal_dtype: str = "float32",
                   conv_dtype: str = "bfloat16", dummy_seed: int | None = None, cfg: HybridConfig | None = None
                   ) -> tuple[DascPlan, list[np.ndarray] | None]:
    """Plan a checkpoint directory (reads config.json + A_log/dt_bias; a dummy-weights one, dasc-build
    --load-format dummy, its seed's decay profile; an engine directory, its model/) or a bare config.json (W=0
    only, unless dummy_seed says the weights will be dummy ones of that seed).
    ``cfg``: the path's config, already parsed (then the dtypes are cfg's and config.json is not read again).
    Returns the plan and the per-layer horizons (None when no weights were read)."""

    path = model_dir_of(path)
    if cfg is None:
        cfg = HybridConfig.from_path(path, temporal_dtype=temporal_dtype, conv_dtype=conv_dtype)
    cfg.shard(options.tp)
    dummy = dummy_marker(path)
    if dummy_seed is None and dummy is not None:
        dummy_seed = dummy["seed"]
    params = None
    if dummy_seed is not None:
        # dummy weights: the decay tensors the loader will make (plan/synthetic.py's profile)
        params = profile_decay_params(cfg, dummy_seed, profile_of_record(dummy))
    elif os.path.isdir(path) and (options.wmax > 0 or has_weights(path)):
        params = read_decay_params(path, cfg)
    return plan_from_params(cfg, params, options)


def plan_from_params(cfg: HybridConfig, params, options: PlanOptions) -> tuple[DascPlan, list[np.ndarray] | None]:
    """Plan cfg from its decay tensors (horizons.DecayParams per linear layer; None: W=0 only)."""

    horizons, summary = None, {}
    if params is not None:
        horizons = horizons_from_params(params, cfg, options.a, options.eps)
        alpha = decay_factors(params, cfg, options.a)
        q1, med, q3 = np.quantile(alpha, [0.25, 0.5, 0.75])
        summary = {"decay_median": float(med), "decay_iqr": [float(q1), float(q3)],
                   "horizon_median": float(np.median(np.concatenate(horizons)))}
    plan = build_plan(cfg, horizons, options)
    plan.decay_summary = summary
    return plan, horizons
