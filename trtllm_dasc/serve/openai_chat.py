"""Chat templates of the OpenAI frontend: /v1/chat/completions' messages rendered into the prompt text, as
transformers' apply_chat_template (what vLLM calls) renders them, with vLLM's two chat options:
- add_generation_prompt (default true): the template's assistant header follows the messages; false: the
  reply's role (message.role, a stream's first delta.role) is the last message's, as vLLM's
  get_chat_request_role labels it;
- continue_final_message (default false): the last message, whatever its role, is left open (no end-of-turn)
  so the model continues it (prefill). Neither vLLM nor transformers' apply_chat_template asks that message to
  be the assistant's (a user's or a system's is continued the same way). Both true is a 400, as vLLM refuses it.
"""
from __future__ import annotations

import json
import os
from datetime import datetime

from trtllm_dasc.errors import UserError
from trtllm_dasc.serve.openai_protocol import APIError

# used when tokenizer_config.json has no chat_template: one "role: content" line per message, then the
# assistant's turn; encoded with the tokenizer's special tokens (BOS) like a plain prompt
FALLBACK_TEMPLATE = "plain"
# transformers' marker (chat_template_utils.render_jinja_template): appended to the final message, its place
# in the rendered text is where that message ends, whatever the template writes after it (its end-of-turn)
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def chat_options(body: dict) -> tuple[bool, bool]:
    """(add_generation_prompt, continue_final_message) of a chat request, validated as vLLM does."""
    add = body.get("add_generation_prompt", True)
    cont = body.get("continue_final_message", False)
    for name, value in (("add_generation_prompt", add), ("continue_final_message", cont)):
        if not isinstance(value, bool):
            raise APIError(f"'{name}' must be a boolean, got {value!r}", name)
    if add and cont:
        # vLLM's ChatCompletionRequest validator: a generation prompt after an open message makes no sense
        raise APIError("cannot set both 'continue_final_message' and 'add_generation_prompt' to true "
                       "(set add_generation_prompt to false to continue the final message)", "continue_final_message")
    return add, cont


class ChatTemplate:
    """tokenizer_config.json's chat_template rendered with jinja2 (as transformers' apply_chat_template,
    the template adds BOS itself), else the plain fallback (FALLBACK_TEMPLATE above)."""

    def __init__(self, tokenizer_dir: str):
        self.source, self.kind, self.special = None, FALLBACK_TEMPLATE, {}
        try:
            with open(os.path.join(tokenizer_dir, "tokenizer_config.json")) as f:
                config = json.load(f)
        except (OSError, ValueError):
            config = {}
        template = config.get("chat_template")
        if isinstance(template, list):    # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = config.get(key)
            self.special[key] = value.get("content") if isinstance(value, dict) else value
        if isinstance(template, str):
            try:
                import jinja2
                import jinja2.sandbox
            except ImportError:
                template = None
            else:
                # what transformers' apply_chat_template gives a template (utils/chat_template_utils.py): loop
                # controls ({% break %} / {% continue %}), strftime_now (Llama 3's date line) and a tojson that
                # keeps non-ASCII text; without them such templates failed to load or to render
                import jinja2.ext
                env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                                   extensions=[jinja2.ext.loopcontrols])
                env.globals["raise_exception"] = _raise
                env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
                env.filters["tojson"] = _tojson
                try:
                    self.source, self.kind = env.from_string(template), "jinja"
                except jinja2.TemplateSyntaxError as e:
                    raise UserError(f"{tokenizer_dir}/tokenizer_config.json: its chat_template does not parse "
                                    f"(line {e.lineno}: {e.message})") from None

    def render(self, messages, add_generation_prompt: bool = True,
               continue_final_message: bool = False) -> tuple[str, bool]:
        """(the prompt text, whether to encode it with the tokenizer's special tokens)."""
        # any last role may be continued (vLLM, transformers): a refusal here was a 400 they would serve
        messages = _messages(messages)
        if self.source is None:
            lines = [f"{m['role']}: {m['content']}" for m in messages]
            # the fallback's end-of-turn is the newline: a continued message is the last line, unended
            return "\n".join(lines + (["assistant:"] if add_generation_prompt else [])), True
        final = messages[-1]["content"]
        if continue_final_message:
            messages[-1] = {**messages[-1], "content": final + CONTINUE_TAG}
        try:
            text = self.source.render(messages=messages, add_generation_prompt=add_generation_prompt, **self.special)
        except APIError:
            raise
        except Exception as e:   # a template error is about the messages it was given
            raise APIError(f"'messages': the chat template failed ({e})", "messages") from None
        return (_cut_at_tag(text, final) if continue_final_message else text), False


def _cut_at_tag(text: str, final: str) -> str:
    """The rendered text up to the end of the final message (transformers' cut: a template that trims the
    message's trailing space trimmed the tag's too, and the text is then right-stripped)."""
    if final.strip() not in text or CONTINUE_TAG.strip() not in text:
        raise APIError("'continue_final_message': the chat template does not keep the final message's text, so "
                       "it cannot be continued", "messages")
    at = text.rindex(CONTINUE_TAG.strip())
    return text[:at] if text[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG else text[:at].rstrip()


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message):
    raise APIError(f"'messages': {message}", "messages")


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise APIError("'messages' must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(f"'messages[{i}]' must be an object with a string 'role'", f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):
            # the parts form: only text parts can be served by a text model
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(f"'messages[{i}].content': only text parts are supported", f"messages[{i}].content")
                texts.append(part["text"])
            content = "\n".join(texts)      # as vLLM joins text parts
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise APIError(f"'messages[{i}].content' must be a string or a list of text parts",
                           f"messages[{i}].content")
        out.append({**m, "content": content})
    return out
