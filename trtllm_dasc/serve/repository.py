"""Fill the Triton model repository templates (model_repo/) into a servable repository.

Like TensorRT-LLM's tools/fill_template.py: templates hold ``${name}`` placeholders; a build fills them
from the engine directory's options. Every placeholder must be given (a forgotten one is an error naming
it, never a literal ``${...}`` reaching tritonserver); files other than config.pbtxt are copied as they are.
"""
from __future__ import annotations

import os
import re
import shutil
import string

from trtllm_dasc.errors import UserError
from trtllm_dasc.spec import DEFAULT_CODEC, DEFAULT_CONV_CODEC, DEFAULT_PRECISION

# the served model (TensorRT-LLM's name); with --no-decoupled it is a plain forwarder and the engine runs in
# ENGINE_MODEL (decoupled), which is then what a streaming client inside the server has to call
SERVED_MODEL = "tensorrt_llm"
ENGINE_MODEL = "tensorrt_llm_engine"


def streaming_model(decoupled: bool) -> str:
    """The model that streams the engine's tokens in an engine directory built decoupled or not."""
    return SERVED_MODEL if decoupled else ENGINE_MODEL


TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "model_repo")


def fill_text(text: str, values: dict, where: str) -> str:
    template = string.Template(text)
    wanted = {m.group("braced") or m.group("named") for m in template.pattern.finditer(text)
              if m.group("braced") or m.group("named")}
    missing = sorted(wanted - set(values))
    if missing:
        raise UserError(f"{where}: no value for template variable(s) {', '.join(missing)}")
    return template.substitute({k: str(v) for k, v in values.items()})


def fill_model(name: str, out_repo: str, values: dict, templates: str = TEMPLATES) -> str:
    """Copy model ``name`` from ``templates`` into ``out_repo`` with its config.pbtxt filled."""
    src = os.path.join(templates, name)
    if not os.path.isdir(src):
        raise UserError(f"no model template {name!r} in {templates}")
    dst = os.path.join(out_repo, name)
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    config = os.path.join(dst, "config.pbtxt")
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(fill_text(text, values, f"{name}/config.pbtxt"))
    return dst


def add_parameters(model_dir: str, params: dict) -> None:
    """Append string parameters to a filled model's config.pbtxt (Triton reports them in the model config)."""
    config = os.path.join(model_dir, "config.pbtxt")
    with open(config, "a") as f:
        for key, value in params.items():
            text = str(value).replace("\\", "\\\\").replace('"', '\\"')
            f.write(f'parameters: {{\n  key: "{key}"\n  value: {{ string_value: "{text}" }}\n}}\n')


def add_alias(out_repo: str, alias: str, target: str, templates: str = TEMPLATES, *, template: str = "",
              decoupled: bool | None = None, instances: int = 0) -> str:
    """A second name for the filled model ``target``: its config.pbtxt under ``alias`` (same I/O and
    batching) with the forwarding model.py of ``templates/<template or alias>`` (a BLS call to ``target``,
    so the engine loads once). ``decoupled`` set: that transaction policy instead of the target's;
    ``instances``: that many model instances (a non-decoupled forwarder blocks an instance per request)."""
    src = os.path.join(templates, template or alias)
    if not os.path.isdir(src):
        raise UserError(f"no model template {alias!r} in {templates}")
    dst = os.path.join(out_repo, alias)
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "config.pbtxt"))
    with open(os.path.join(out_repo, target, "config.pbtxt")) as f:
        text = f.read()
    head = f'name: "{target}"\n'
    if head not in text:
        raise UserError(f"{target}/config.pbtxt does not name the model {target!r}")
    text = text.replace(head, f'name: "{alias}"\n', 1)
    if decoupled is not None:
        text, n = re.subn(r"decoupled: (true|false)", f"decoupled: {str(decoupled).lower()}", text, count=1)
        if n != 1:
            raise UserError(f"{target}/config.pbtxt has no model_transaction_policy to change")
    if instances:
        text, n = re.subn(r"(instance_group \[\s*\{\s*count: )\d+", rf"\g<1>{int(instances)}", text, count=1)
        if n != 1:
            raise UserError(f"{target}/config.pbtxt has no instance_group count to change")
    with open(os.path.join(dst, "config.pbtxt"), "w") as f:
        f.write(text)
    add_parameters(dst, {"alias_of": target})
    return dst


def rename_model(out_repo: str, name: str, new: str) -> str:
    """Move the filled model ``name`` to ``new`` (directory and the config's name line)."""
    src, dst = os.path.join(out_repo, name), os.path.join(out_repo, new)
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    os.rename(src, dst)
    config = os.path.join(dst, "config.pbtxt")
    with open(config) as f:
        text = f.read()
    head = f'name: "{name}"\n'
    if head not in text:
        raise UserError(f"{name}/config.pbtxt does not name the model {name!r}")
    with open(config, "w") as f:
        f.write(text.replace(head, f'name: "{new}"\n', 1))
    return dst


def lossy_parts(wmax: int, codec: str, precision: str = DEFAULT_PRECISION,
                conv_codec: str = DEFAULT_CONV_CODEC) -> list[str]:
    """What makes a restored prefix differ from the state it was stored from, each as the flag that sets it:
    omitted units (W_max > 0: nr zero-fills them, wr replays a window), a lossy temporal codec, a horizon band in
    a lossy codec (conservatively: a band the plan leaves empty still counts), a lossy conv codec. Empty: exact."""
    from trtllm_dasc.plan.precision import parse_precision
    parts = []
    if wmax != 0:
        parts.append(f"--wmax {wmax}")
    if codec != DEFAULT_CODEC:
        parts.append(f"--codec {codec}")
    bands = parse_precision(precision)
    if bands is not None and any(c != DEFAULT_CODEC for c in bands.codecs):
        parts.append(f"--precision {precision}")
    if conv_codec != DEFAULT_CONV_CODEC:
        parts.append(f"--conv-codec {conv_codec}")
    return parts


def cache_policy(wmax: int, policy: str, codec: str, precision: str = DEFAULT_PRECISION,
                 conv_codec: str = DEFAULT_CONV_CODEC) -> str:
    """One line saying how a cached prefix is restored: exact only when every stored unit is stored exactly
    (lossy_parts), else approximate (dasc's lossy compression)."""
    name = (f"dasc-{policy} W_max={wmax}" + (f" {codec}" if codec != DEFAULT_CODEC else "")
            + (f" precision {precision}" if precision != DEFAULT_PRECISION else "")
            + (f" conv {conv_codec}" if conv_codec != DEFAULT_CONV_CODEC else ""))
    lossy = lossy_parts(wmax, codec, precision, conv_codec)
    if not lossy:
        return f"{name}: cached prefixes are exact"
    exact = f"--wmax 0 --codec {DEFAULT_CODEC}"
    if any(p.startswith("--precision") for p in lossy):
        exact += f" --precision {DEFAULT_PRECISION}"
    if any(p.startswith("--conv-codec") for p in lossy):
        exact += f" --conv-codec {DEFAULT_CONV_CODEC}"
    return (f"{name}: cached prefixes are approximate (a greedy output may change once its prefix is cached); "
            f"{exact} for an exact cache")
