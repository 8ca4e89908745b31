"""Strict readers of config.json fields: a wrong type, range or value is a ConfigError naming the field.

Nothing is guessed (issue 9): a string is never read as a bool, a float never as an int, NaN/Inf never
pass, and sizes have caps so a typo (``"num_hidden_layers": 1e9``) is refused instead of hanging the
loader. ``None`` (JSON null) counts as absent, as transformers writes it for unset options. Aliases
(the released checkpoints' names next to transformers' names) must agree when both are given.
"""
from __future__ import annotations

import math

from trtllm_dasc.errors import UserError

# generous caps: far above every released model, low enough that a typo cannot make us allocate forever
MAX_LAYERS = 4096
MAX_HEADS = 4096
MAX_HEAD_DIM = 4096
MAX_HIDDEN = 1 << 17
MAX_INTERMEDIATE = 1 << 20
MAX_VOCAB = 1 << 24
MAX_EXPERTS = 1 << 14
MAX_CONV_KERNEL = 64

_ABSENT = object()


class ConfigError(UserError):
    """A config.json that cannot describe a supported hybrid model (message names the field)."""


class MissingField(ConfigError):
    """A required field is absent; the network part of a schema may be absent as a whole (see schema.py)."""


def short_repr(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Fields:
    """Typed access to one JSON object of a config: the top level, or a nested one (linear_attn_config).

    ``where`` names the object in messages, e.g. "qwen3_next config.json" or "kimi_linear config.json
    linear_attn_config"."""

    def __init__(self, raw, where: str):
        if not isinstance(raw, dict):
            raise ConfigError(f"{where} must be a JSON object, got {short_repr(raw)}")
        self.raw, self.where = raw, where

    def fail(self, name: str, what: str, value) -> ConfigError:
        return ConfigError(f"{self.where} field '{name}' {what}, got {short_repr(value)}")

    def pick(self, *names) -> tuple[str, object]:
        """(name, value) of the first alias present and not null; (names[0], _ABSENT) when none is.
        Two aliases given with different values are an error, not a silent choice."""
        found = [(n, self.raw[n]) for n in names if self.raw.get(n) is not None]
        if not found:
            return names[0], _ABSENT
        for n, v in found[1:]:
            if v != found[0][1] or type(v) is not type(found[0][1]):
                raise ConfigError(f"{self.where} fields '{found[0][0]}' ({short_repr(found[0][1])}) and "
                                  f"'{n}' ({short_repr(v)}) disagree")
        return found[0]

    def present(self, *names) -> bool:
        return self.pick(*names)[1] is not _ABSENT

    def _value(self, names, default):
        name, value = self.pick(*names)
        if value is _ABSENT:
            if default is _ABSENT:
                raise MissingField(f"{self.where} lacks required field '{name}'")
            return name, default, True
        return name, value, False

    def int(self, *names, lo: int = 1, hi: int, default=_ABSENT) -> int:
        name, value, defaulted = self._value(names, default)
        if defaulted:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, f"must be an integer in {lo}..{hi}", value)
        if not lo <= value <= hi:
            raise self.fail(name, f"must be in {lo}..{hi}", value)
        return value

    def float(self, *names, lo: float, hi: float = math.inf, lo_open: bool = True, default=_ABSENT) -> float:
        """A finite number (ints accepted) in (lo, hi] (lo_open) or [lo, hi]."""
        name, value, defaulted = self._value(names, default)
        if defaulted:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(name, "must be a number", value)
        x = float(value)
        above = x > lo if lo_open else x >= lo
        if not math.isfinite(x) or not above or x > hi:
            bound = f"{'>' if lo_open else '>='} {lo:g}" + (f" and <= {hi:g}" if hi != math.inf else "")
            raise self.fail(name, f"must be a finite number {bound}", value)
        return x

    def _checked(self, names, default, ok, what: str):
        name, value, defaulted = self._value(names, default)
        if not defaulted and not ok(value):
            raise self.fail(name, what, value)
        return value

    def bool(self, *names, default=_ABSENT) -> bool:
        return self._checked(names, default, lambda v: isinstance(v, bool), "must be true or false (a JSON boolean)")

    def choice(self, *names, choices: tuple, default=_ABSENT):
        return self._checked(names, default, lambda v: isinstance(v, str) and v in choices,
                             f"must be one of {', '.join(map(repr, choices))}")

    def list(self, *names, default=_ABSENT) -> list:
        return self._checked(names, default, lambda v: isinstance(v, list), "must be a JSON list")

    def int_list(self, *names, lo: int, hi: int, default=_ABSENT) -> list[int]:
        name = self.pick(*names)[0]
        values = self.list(*names, default=default)
        for v in values or ():
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ConfigError(f"{self.where} field '{name}' must list integers in {lo}..{hi}, "
                                  f"found {short_repr(v)}")
        return values

    def choice_list(self, *names, choices: tuple, length: int, default=_ABSENT) -> list[str]:
        name = self.pick(*names)[0]
        values = self.list(*names, default=default)
        if values is None:
            return values
        if len(values) != length:
            raise ConfigError(f"{self.where} field '{name}' has {len(values)} entries for {length} layers")
        bad = sorted({short_repr(v) for v in values if not isinstance(v, str) or v not in choices})
        if bad:
            raise ConfigError(f"{self.where} field '{name}' has unknown entr{'y' if len(bad) == 1 else 'ies'} "
                              f"{', '.join(bad)}; expected {' or '.join(map(repr, choices))}")
        return list(values)

    def obj(self, name: str) -> "Fields | None":
        """A nested object, or None when absent/null."""
        value = self.raw.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(name, "must be a JSON object", value)
        return Fields(value, f"{self.where} {name}")
