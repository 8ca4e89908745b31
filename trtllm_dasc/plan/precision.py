"""Horizon-aware precision (issue 35): each kept unit's checkpoint codec follows its retention horizon.

An error written into a unit decays at that unit's own rate (paper Eq. 3): a kept unit whose horizon is just
above W_max forgets its quantisation error within a few hundred tokens, one that remembers for 100k tokens
carries it to the end. So the kept units are split into horizon bands by thresholds H_1 < ... < H_k and
band i (H_i <= H < H_{i+1}, H_0 = W_max, H_{k+1} = inf) stores with codec c_i:

    --precision uniform                      every kept unit in --codec (the paper's arms)
    --precision horizon                      the default bands below: horizon:128,1024:int4,int8,int8
    --precision horizon:H1,H2                int4 below H1, int8 in [H1, H2), native at or above H2
    --precision horizon:H1,H2:int4,int8,native   the codecs named, one more than the thresholds
    --precision horizon...@SEED              the count-matched control: each layer keeps the same number of
                                             units of each codec, given to its kept units at random (seeded by
                                             SEED and the layer), so only the horizon ordering differs

Each rank's units are then packed ragged by codec (one segment per codec) and the TP balance counts bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trtllm_dasc.errors import UserError
from trtllm_dasc.spec import CODECS, MAX_MASK_SEED

UNIFORM = "uniform"
# codecs a band may use: every temporal codec (spec.CODECS, whose widths config.unit_byte_parts counts)
BAND_CODECS = CODECS
# the default bands: INT4 only below 128 tokens of horizon, INT8 above. At W=16, TP8, on the paper-profile
# checkpoints Kimi-Linear holds 10.72x dense capacity (13.09x with --conv-codec int8; uniform INT8 8.17x) and
# Qwen3-Next 4.66x (INT8 4.02x) (`python -m benchmarks precision_capacity`; with the first decay profile, before
# its tails were fitted to the paper's capacities on 12-07: 10.21x, 12.35x, 8.07x and 4.47x, 3.75x). Chosen by the measurements, not
# by the static decay bound: on a trained KDA an INT4 error outlives its horizon (`benchmarks precision_error`),
# and the quality runs (docs/quality.md, 270 paired instances) found these bands -0.09 [-0.37, +0.19] points
# from dense where the earlier default, horizon:1024,8192:int4,int8,native (12.14x), cost -1.39 [-2.87, -0.19]
# (Holm p 0.04). int8 beats fp8 per byte (codec_naive: 0.0065 vs 0.026 RMS-relative), so fp8 is in no default.
DEFAULT_THRESHOLDS = (128, 1024)
DEFAULT_CODECS = ("int4", "int8", "int8")
# two thresholds given without codecs (horizon:H1,H2) keep their documented meaning: the top band exact
THRESHOLD_CODECS = ("int4", "int8", "native")
MAX_THRESHOLD = 2**53


@dataclass(frozen=True, slots=True)
class HorizonBands:
    thresholds: tuple[int, ...]     # H_1 < ... < H_k (tokens)
    codecs: tuple[str, ...]         # k + 1 codecs, band i below thresholds[i]
    shuffle_seed: int | None = None  # set: the count-matched control (bands permuted within each layer)

    def band_of(self, horizons: np.ndarray) -> np.ndarray:
        """Band index per horizon: the number of thresholds at or below it (a horizon equal to H_i is in
        band i, the upper one)."""
        return np.searchsorted(np.asarray(self.thresholds, dtype=np.float64), horizons, side="right")

    def spec(self) -> str:
        seed = "" if self.shuffle_seed is None else f"@{self.shuffle_seed}"
        return f"horizon:{','.join(map(str, self.thresholds))}:{','.join(self.codecs)}{seed}"

    def ranges(self, wmax: int) -> list[tuple[float, float]]:
        lo = [float(wmax), *map(float, self.thresholds)]
        return list(zip(lo, [*map(float, self.thresholds), math.inf]))


def default_bands(wmax: int | None = None, seed: int | None = None) -> HorizonBands:
    """The default bands at this W_max: a threshold at or below W_max goes, with the codec of the band under it
    (kept units all have horizons above W_max, so that band would be empty): at W_max 128 or 512 the default is
    INT8 throughout. At 1024 and above nothing is left to band and check_bands refuses, naming the threshold."""
    ths, codecs = list(DEFAULT_THRESHOLDS), list(DEFAULT_CODECS)
    while wmax is not None and len(ths) > 1 and ths[0] <= wmax:
        ths.pop(0)
        codecs.pop(0)
    return HorizonBands(tuple(ths), tuple(codecs), seed)


def parse_precision(text: str, wmax: int | None = None) -> HorizonBands | None:
    """None for 'uniform'; the bands of a 'horizon[:H1,..[:c0,..]]' spec, normalised. Bad input: UserError."""
    s = str(text).strip()
    if s == UNIFORM:
        return None
    s, at, seed_text = s.partition("@")
    seed = None
    if at:
        seed = _int_upto(seed_text, MAX_MASK_SEED) if seed_text.isascii() and seed_text.isdigit() else None
        if seed is None or seed > MAX_MASK_SEED:
            raise UserError(f"--precision {text!r}: the control's seed after '@' must be an integer in "
                            f"[0, 2^63 - 1], e.g. horizon@1234")
    head, _, rest = s.partition(":")
    if head != "horizon":
        raise UserError(f"--precision must be 'uniform' or 'horizon[:H1,H2[:codec,...]][@seed]', got {text!r}")
    if not rest:
        bands = default_bands(wmax, seed)
    else:
        th_text, colon, codec_text = rest.partition(":")
        parts = [v.strip() for v in th_text.split(",")]
        # ASCII digits only, as the seed: int() would also take '1_000' and other scripts' digits
        if not all((d := p[1:] if p.startswith("-") else p).isascii() and d.isdigit() for p in parts):
            raise UserError(f"--precision {text!r}: thresholds must be a comma list of integers (tokens), "
                            f"e.g. horizon:256,4096")
        ths = tuple(_int_upto(v, MAX_THRESHOLD) for v in parts)
        if None in ths:
            raise UserError(f"--precision {text!r}: thresholds must be integers in [1, 2^53] tokens")
        if colon and not codec_text.strip():
            raise UserError(f"--precision {text!r}: nothing after the second ':'; name one codec per band "
                            "(horizon:H1,H2:c0,c1,c2) or leave the ':' out")
        if codec_text:
            codecs = tuple(c.strip() for c in codec_text.split(","))
        elif len(ths) == len(THRESHOLD_CODECS) - 1:
            codecs = THRESHOLD_CODECS
        else:
            raise UserError(f"--precision {text!r}: {len(ths)} thresholds need {len(ths) + 1} codecs after a "
                            f"second ':' (only two thresholds have default codecs)")
        bands = HorizonBands(ths, codecs, seed)
    check_bands(bands, wmax, text)
    return bands


def _int_upto(text: str, limit: int) -> int | None:
    """A checked '[-]digits' string as an int; None when it has more digits than ``limit`` (out of range anyway).
    int() alone raises a ValueError past python's 4300 digits (sys.int_max_str_digits, leading zeros counted):
    a traceback where every other bad number is refused in one line."""
    sign, digits = ("-", text[1:]) if text.startswith("-") else ("", text)
    digits = digits.lstrip("0") or "0"
    return None if len(digits) > len(str(limit)) else int(sign + digits)


def check_bands(bands: HorizonBands, wmax: int | None, text: str = "") -> None:
    what = f"--precision {text!r}" if text else "--precision"
    ths = bands.thresholds
    if any(isinstance(h, bool) or not isinstance(h, int) or not 1 <= h <= MAX_THRESHOLD for h in ths):
        raise UserError(f"{what}: thresholds must be integers in [1, 2^53] tokens, got {list(ths)}")
    if any(b <= a for a, b in zip(ths, ths[1:])):
        raise UserError(f"{what}: thresholds must increase strictly, got {list(ths)}")
    if wmax is not None and ths and ths[0] <= wmax:
        raise UserError(f"{what}: the first threshold {ths[0]} must exceed --wmax {wmax} (kept units have "
                        f"horizons above W_max, so the lowest band would be empty)")
    if len(bands.codecs) != len(ths) + 1:
        raise UserError(f"{what}: {len(ths)} thresholds need {len(ths) + 1} codecs, got {len(bands.codecs)}")
    for c in bands.codecs:
        if c not in BAND_CODECS:
            raise UserError(f"{what}: unknown codec {c!r}; use one of {'|'.join(BAND_CODECS)}")


def check_device_runs(bands: HorizonBands | None, codec: str = "native") -> None:
    """Refuse a codec this installation cannot run: fp8's torch reference needs torch.float8_e4m3fn."""
    used = set(bands.codecs) if bands else {codec}
    if "fp8" in used:
        import torch
        if not hasattr(torch, "float8_e4m3fn"):
            raise UserError(f"codec fp8 needs torch.float8_e4m3fn (torch >= 2.1); this torch {torch.__version__} "
                            "has none: choose other codecs")


def assign_bands(horizons: list[np.ndarray], retained: list[list[int]], bands: HorizonBands) -> list[list[int]]:
    """Per layer, the band of each kept unit (parallel to retained). With a shuffle seed, each layer's bands
    are permuted among its kept units (numpy's generator seeded by (seed, layer)): the same codec counts per
    layer, hence the same slot bytes at TP 1, on units chosen without regard to their horizons."""
    out = []
    for layer, (h, kept) in enumerate(zip(horizons, retained)):
        row = bands.band_of(np.asarray(h, dtype=np.float64)[kept]) if kept else np.zeros(0, dtype=np.int64)
        if bands.shuffle_seed is not None:
            row = np.random.default_rng([bands.shuffle_seed, layer]).permutation(row)
        out.append(row.tolist())
    return out
