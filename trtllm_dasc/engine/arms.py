"""Arm specs: one short string per serving arm, as the benchmarks and quality protocols name them.

    dense                  every unit kept (W_max = 0)
    nr<W> / wr<W>          dasc at W_max = W with that load policy; wr-warm<W>: wr from a warm scratch
    rand<W>@<seed>         nr with the count-matched random mask of that seed (the paper's control)
    ...+int8               the INT8 temporal codec (likewise +fp8, +int4)
    ...+horizon            horizon-aware precision, each kept unit's codec from its horizon band
                           (--precision horizon, plan/precision.py's default bands)
    ...+horizon@<seed>     its count-matched control: the same codecs per layer on random kept units
    ...+horizon/H1/H2[/C1/C2/C3][@seed]  other bands: --precision horizon:H1,H2[:C1,C2,C3] ('/' because a
                           comma separates arms and a colon names a placement), e.g. nr16+horizon/64/1024
    ...+conv-int8          the conv state in 8 bits (--conv-codec int8) beside any temporal codec or bands, e.g.
                           nr16+horizon/128/1024/int4/int8/int8+conv-int8
    ...:<placement>        at TP, this arm's placement of the units (off, storage, hybrid) instead of the run's
                           own: `nr16:storage,nr16:hybrid` compares placements in one run
An arm is the EngineConfig / dasc-build fields that differ between arms; everything else is shared.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from trtllm_dasc.errors import UserError
from trtllm_dasc.spec import (CODECS, CONV_CODECS, DEFAULT_CODEC, DEFAULT_CONV_CODEC, DEFAULT_LAYOUT, DEFAULT_POLICY,
                              DEFAULT_PRECISION, PLACEMENTS, POLICIES, build_placement)


def _either(names) -> str:
    # the longest first: wr-warm must not match as wr
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))


# +<codec> for every codec but the default one, or +horizon[/bands][@seed] (a precision, not a codec); then
# +conv-<conv codec> for every conv codec but the native one
SPEC = re.compile(rf"(dense|({_either(POLICIES)})(\d+)|rand(\d+)@(\d+))"
                  rf"(?:\+({_either(CODECS[1:])}|horizon(?:/\w+)*(?:@\d+)?))?"
                  rf"(?:\+conv-({_either(CONV_CODECS[1:])}))?(?::({_either(PLACEMENTS)}))?")


def _precision(suffix: str) -> str:
    """An arm's +horizon suffix as a --precision value: horizon/64/1024/int4/int8/int8@7 ->
    horizon:64,1024:int4,int8,int8@7 (plan/precision.py checks the bands and codecs when it plans)."""
    base, at, seed = suffix.partition("@")
    parts = base.split("/")[1:]
    thresholds = [p for p in parts if p.isdigit()]
    codecs = [p for p in parts if not p.isdigit()]
    out = "horizon" + (":" + ",".join(thresholds) if thresholds else "") + (":" + ",".join(codecs) if codecs else "")
    return out + (at + seed if at else "")


EXAMPLES = ("dense, nr16, wr16, wr-warm16, rand16@1234, nr16+int8, nr16+horizon, nr16+horizon@1234, "
            "nr16+horizon/64/1024/int4/int8/int8, nr16+int8+conv-int8, nr16:storage")


@dataclass(slots=True)
class ArmSpec:
    spec: str
    wmax: int = 0
    policy: str = DEFAULT_POLICY
    codec: str = DEFAULT_CODEC
    mask_seed: int | None = None          # set: the random selection with this seed
    placement: str | None = None          # set: this arm's TP placement (None: the run's)
    precision: str = DEFAULT_PRECISION    # or "horizon" / "horizon@<seed>" (--precision)
    conv_codec: str = DEFAULT_CONV_CODEC  # --conv-codec (+conv-<codec>)

    @property
    def precision_kind(self) -> str | None:
        """None (uniform precision), "horizon" (the horizon bands) or "shuffled" (their count-matched control,
        horizon@<seed>): what the quality reports group arms by."""
        if self.precision == DEFAULT_PRECISION:
            return None
        return "shuffled" if "@" in self.precision else "horizon"

    @property
    def native_conv_twin(self) -> str:
        """The spec of the same arm with the native conv state (this spec less its +conv-<codec>): what the
        quality reports pair a conv arm with."""
        return self.spec.replace(f"+conv-{self.conv_codec}", "") if self.conv_codec != DEFAULT_CONV_CODEC else self.spec

    @property
    def label(self) -> str:
        if self.wmax == 0:
            name = "dense"
        elif self.mask_seed is not None:
            name = f"random W={self.wmax} mask {self.mask_seed}"
        else:
            name = f"dasc-{self.policy} W={self.wmax}"
        name += f" + {self.codec.upper()}" if self.codec != DEFAULT_CODEC else ""
        if self.precision_kind is not None:
            bands = self.precision.partition("@")[0].partition(":")[2]
            name += " + horizon" + (f" {bands}" if bands else "") + (f" bands shuffled {self.precision.partition('@')[2]}"
                                    if self.precision_kind == "shuffled" else "")
        name += f" + conv {self.conv_codec.upper()}" if self.conv_codec != DEFAULT_CONV_CODEC else ""
        return name + (f" [{self.placement}]" if self.placement else "")

    def engine_fields(self) -> dict:
        """The EngineConfig fields of this arm (placement only when the spec names one)."""
        fields = {"wmax": self.wmax, "policy": self.policy, "codec": self.codec,
                  "selection": "random" if self.mask_seed is not None else "decay", "mask_seed": self.mask_seed}
        if self.precision != DEFAULT_PRECISION:
            fields["precision"] = self.precision
        if self.conv_codec != DEFAULT_CONV_CODEC:
            fields["conv_codec"] = self.conv_codec
        if self.placement is not None:
            fields["placement"] = self.placement
        return fields

    def plan_fields(self, tp: int = 1, placement: str = "off") -> dict:
        """The PlanOptions fields dasc-build plans for this arm given after the run's --tp and --placement
        (``placement``: the run's, used when the arm names none): what a client's capacity and KV sizing must
        plan, or the slots it expects are another arm's (tests/clients/test_arm_capacity.py checks each field
        against dasc-build's own)."""
        f = self.engine_fields()
        return {"wmax": self.wmax, "tp": tp, "placement": build_placement(self.placement or placement, tp),
                "codec": self.codec, "layout": DEFAULT_LAYOUT, "selection": f["selection"],
                "mask_seed": f["mask_seed"], "precision": self.precision, "conv_codec": self.conv_codec}

    def build_flags(self) -> list[str]:
        """The dasc-build flags of this arm (given after the run's shared ones, so its placement wins)."""
        flags = ["--wmax", str(self.wmax), "--policy", self.policy, "--codec", self.codec]
        if self.mask_seed is not None:
            flags += ["--selection", "random", "--mask-seed", str(self.mask_seed)]
        if self.precision != DEFAULT_PRECISION:
            flags += ["--precision", self.precision]
        if self.conv_codec != DEFAULT_CONV_CODEC:
            flags += ["--conv-codec", self.conv_codec]
        if self.placement is not None:
            flags += ["--placement", self.placement]
        return flags


def parse_arm(spec: str) -> ArmSpec:
    m = SPEC.fullmatch(spec.strip())
    if m is None:
        raise UserError(f"arm {spec.strip()!r}: expected dense, {', '.join(p + '<W>' for p in POLICIES)} or "
                        f"rand<W>@<seed>, each optionally {' / '.join('+' + c for c in CODECS[1:])} / "
                        f"+horizon[/H1/H2[/C1/C2/C3]][@seed], then "
                        f"{' / '.join('+conv-' + c for c in CONV_CODECS[1:])}, and "
                        f"{' / '.join(':' + p for p in PLACEMENTS)} (e.g. {EXAMPLES})")
    suffix = m.group(6) or DEFAULT_CODEC
    codec, precision = ((DEFAULT_CODEC, _precision(suffix)) if suffix.startswith("horizon")
                        else (suffix, DEFAULT_PRECISION))
    conv_codec = m.group(7) or DEFAULT_CONV_CODEC
    placement = m.group(8)
    if m.group(1) == "dense":
        if precision != DEFAULT_PRECISION:
            raise UserError(f"arm {spec.strip()!r}: dense keeps every unit at the model's precision; "
                            "+horizon is for a dasc arm (e.g. nr16+horizon)")
        return ArmSpec(spec.strip(), codec=codec, placement=placement, conv_codec=conv_codec)
    if m.group(2):
        wmax, policy, seed = int(m.group(3)), m.group(2), None
    else:
        wmax, policy, seed = int(m.group(4)), DEFAULT_POLICY, int(m.group(5))
    if wmax == 0:
        raise UserError(f"arm {spec.strip()!r}: a dasc arm needs W_max >= 1 (dense is `dense`)")
    return ArmSpec(spec.strip(), wmax, policy, codec, seed, placement, precision, conv_codec)


def parse_arms(text: str) -> list[ArmSpec]:
    """A comma list of arm specs, each at most once."""
    arms = [parse_arm(s) for s in text.split(",") if s.strip()]
    if len({a.spec for a in arms}) != len(arms):
        raise UserError(f"arms {text!r}: an arm is named twice")
    return arms
