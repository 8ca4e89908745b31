"""Model families: one strict config.json parser per supported ``model_type``, and the registry.

``parse(raw)`` picks the family by ``model_type`` and returns one validated ModelSchema, from which
HybridConfig (config.py) and ModelSpec (model/spec.py) are both built. Sits beside config.py: it imports
nothing of the package but errors.py, so config.py, plan/ and model/ may all use it.
"""
from __future__ import annotations

from trtllm_dasc.families import kimi_linear, qwen3_next
from trtllm_dasc.families.fields import ConfigError, MissingField, short_repr
from trtllm_dasc.families.schema import Family, ModelSchema, NetworkSchema

# model_type -> parse(raw) -> ModelSchema
PARSERS = {qwen3_next.FAMILY.model_type: qwen3_next.parse, kimi_linear.FAMILY.model_type: kimi_linear.parse}
FAMILIES = {qwen3_next.FAMILY.model_type: qwen3_next.FAMILY, kimi_linear.FAMILY.model_type: kimi_linear.FAMILY}
SUPPORTED_MODEL_TYPES = tuple(PARSERS)
ARCHES = {f.arch: f for f in FAMILIES.values()}


def parser_for(model_type):
    """The parser of a model_type; a ConfigError listing the supported ones for any other."""
    parser = PARSERS.get(model_type) if isinstance(model_type, str) else None
    if parser is None:
        raise ConfigError(f"unsupported model_type {short_repr(model_type)}; "
                          f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    return parser


def parse(raw) -> ModelSchema:
    if not isinstance(raw, dict):
        raise ConfigError("config.json must hold a JSON object")
    return parser_for(raw.get("model_type"))(raw)


def family_of_arch(arch) -> Family:
    if not isinstance(arch, str) or arch not in ARCHES:
        raise ConfigError(f"arch must be one of {', '.join(map(repr, ARCHES))}, got {short_repr(arch)}")
    return ARCHES[arch]


__all__ = ["ARCHES", "FAMILIES", "PARSERS", "SUPPORTED_MODEL_TYPES", "ConfigError", "Family", "MissingField",
           "ModelSchema", "NetworkSchema", "family_of_arch", "parse", "parser_for"]
