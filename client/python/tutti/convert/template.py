"""Chat templates: HF's Jinja templates rendered as transformers' apply_chat_template
renders them, and the character spans of the assistant's turns in the result.

The environment is transformers': a sandbox with trim_blocks and lstrip_blocks, the loop
controls, `raise_exception`, `strftime_now` and a `tojson` that does not escape HTML;
the template sees `messages`, `add_generation_prompt` and the tokenizer's special tokens
(`bos_token`, `eos_token`, ...) plus --template-var values. `strftime_now` formats the
fixed --template-date, so a template that prints today's date (Llama 3's) still gives
the same bytes on every run.

Where the assistant's turns are (the trained spans), in the order tried:
  1. `{% generation %}...{% endgeneration %}` blocks, when the template has them (as
     transformers' return_assistant_tokens_mask reads them);
  2. one render with a mark around each assistant message's content, accepted when the
     marks removed it equals the plain render and each turn's surroundings are what a
     two-turn probe showed the template writes around an assistant message (its
     end-of-turn token included);
  3. rendering prefixes turn by turn: turn i spans from the end of the render of the
     turns before it with add_generation_prompt to the end of the render through it,
     each a prefix of the whole (a template for which that fails skips the record).
"""
import json
import re
from datetime import datetime
from typing import List, Optional, Tuple

from .records import Skip

# Noncharacters (never in interchange text) mark places in a render; input text holding
# one is refused as unencodable.
GEN_OPEN, GEN_CLOSE = "\ufdd0", "\ufdd1"
IMAGE_OPEN, IMAGE_CLOSE = "\ufdd2", "\ufdd3"
TURN_OPEN, TURN_CLOSE = "\ufdd4", "\ufdd5"
PROBE_TEXT = "\ufdd6"
RESERVED = re.compile("[\ufdd0-\ufdef]")
RESERVED_UTF8_PREFIX = "\ufdd0".encode()[:2]  # every one of them starts so in UTF-8
_GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")

# ChatML as Qwen2-VL writes it (a default system turn, images as vision_start,
# image_pad, vision_end), with the assistant's turns marked for training.
DEFAULT_TEMPLATE = r"""{%- if messages and messages[0]['role'] != 'system' %}
{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{{- '<|im_start|>' + message['role'] + '\n' }}
{%- if message['content'] is string %}
{%- set text = message['content'] %}
{%- else %}
{%- set ns = namespace(text='') %}
{%- for part in message['content'] %}
{%- if part['type'] == 'image' %}
{%- set ns.text = ns.text + '<|vision_start|><|image_pad|><|vision_end|>' %}
{%- elif part['type'] == 'text' %}
{%- set ns.text = ns.text + part['text'] %}
{%- endif %}
{%- endfor %}
{%- set text = ns.text %}
{%- endif %}
{%- if message['role'] == 'assistant' %}
{%- generation %}{{- text + '<|im_end|>' }}{%- endgeneration %}
{{- '\n' }}
{%- else %}
{{- text + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


class TemplateSetupError(Exception):
    """The template cannot be used at all (bad syntax, unreadable file)."""


def _environment(date: datetime):
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """{% generation %}...{% endgeneration %}: its output between two marks."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return [nodes.Output([nodes.TemplateData(GEN_OPEN)]).set_lineno(lineno), *body,
                    nodes.Output([nodes.TemplateData(GEN_CLOSE)]).set_lineno(lineno)]

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: date.strftime(fmt)
    return env


class ChatTemplate:
    """A compiled chat template. `variables`: the special tokens and --template-var
    values the template sees; `date`: what strftime_now formats."""

    def __init__(self, source: str, variables: dict, date: datetime):
        import jinja2

        self.source = source
        self.variables = dict(variables)
        try:
            self._template = _environment(date).from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateSetupError(f"the chat template does not compile: {e} (line {e.lineno})")
        self.has_generation = bool(_GENERATION_TAG.search(source))
        self.content_format = self._probe_content_format()
        self._around = None if self.has_generation else self._probe_assistant_surroundings()

    def render(self, messages: List[dict], add_generation_prompt: bool = False) -> str:
        """The template's text for messages (generation marks left in)."""
        context = {"tools": None, "documents": None, **self.variables, "messages": messages,
                   "add_generation_prompt": add_generation_prompt}
        try:
            return self._template.render(context)
        except Exception as e:  # a template is user code: any error refuses the record
            raise Skip("template_error", f"the chat template failed: {type(e).__name__}: {e}") from None

    def render_with_spans(self, messages: List[dict]) -> Tuple[str, List[Tuple[int, int]]]:
        """The rendered conversation and the [begin, end) character spans of its assistant
        turns (each with what the template writes to end the turn)."""
        assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if self.has_generation:
            text, spans = _strip_marks(self.render(messages), GEN_OPEN, GEN_CLOSE)
            if assistants and not spans:
                raise Skip("template_error", "the template's {% generation %} blocks marked none "
                           f"of the {len(assistants)} assistant turns")
            return text, spans
        text = self.render(messages)
        spans = self._marked_spans(messages, assistants, text)
        if spans is None:
            spans = self._prefix_spans(messages, assistants, text)
        return text, spans

    # The content forms a template takes.
    def message(self, role: str, pieces: List[str]) -> dict:
        """A message whose content is text pieces (image markers among them), in the form
        the template reads: a list of text parts, or one string."""
        if self.content_format == "parts":
            return {"role": role, "content": [{"type": "text", "text": p} for p in pieces]}
        return {"role": role, "content": "".join(pieces)}

    def _probe_content_format(self) -> str:
        """One string when the template writes it (the marks make images text, and a
        string is the cheaper render), else a list of text parts."""
        for form, content in (("string", PROBE_TEXT), ("parts", [{"type": "text", "text": PROBE_TEXT}])):
            try:
                if self.render([{"role": "user", "content": content}]).count(PROBE_TEXT) == 1:
                    return form
            except Skip:
                pass
        return "string"

    def _probe_assistant_surroundings(self) -> Optional[Tuple[str, str]]:
        """What the template writes between the generation prompt and an assistant
        message's content, and after the content (its end of turn), from a probe."""
        user, reply = self.message("user", ["?"]), self.message("assistant", [PROBE_TEXT])
        try:
            prompt = self.render([user], add_generation_prompt=True)
            whole = self.render([user, reply])
        except Skip:
            return None
        at = whole.find(PROBE_TEXT, len(prompt))
        if not whole.startswith(prompt) or at < 0:
            return None
        return whole[len(prompt):at], whole[at + len(PROBE_TEXT):]

    def _marked_spans(self, messages, assistants, text) -> Optional[List[Tuple[int, int]]]:
        if self._around is None or not assistants:
            return None if assistants else []
        marked = [dict(m) for m in messages]
        for i in assistants:
            m = marked[i]
            if isinstance(m["content"], str):
                m["content"] = TURN_OPEN + m["content"] + TURN_CLOSE
            else:
                m["content"] = ([{"type": "text", "text": TURN_OPEN}] + m["content"] +
                                [{"type": "text", "text": TURN_CLOSE}])
        try:
            stripped, contents = _strip_marks(self.render(marked), TURN_OPEN, TURN_CLOSE)
        except Skip:
            return None
        if stripped != text or len(contents) != len(assistants):
            return None
        head, tail = self._around
        spans = []
        for begin, end in contents:
            if text[begin - len(head):begin] != head or text[end:end + len(tail)] != tail:
                return None
            spans.append((begin - len(head), end + len(tail)))
        return spans

    def _prefix_spans(self, messages, assistants, text) -> List[Tuple[int, int]]:
        spans = []
        for i in assistants:
            before = self.render(messages[:i], add_generation_prompt=True)
            through = self.render(messages[:i + 1])
            if not (text.startswith(through) and through.startswith(before)):
                raise Skip("template_error", f"cannot find assistant turn {i}: the template's "
                           "text for the turns up to it is not a prefix of the whole; give a "
                           "template with {% generation %} blocks (--chat-template)")
            spans.append((len(before), len(through)))
        return spans


def _strip_marks(text: str, open_mark: str, close_mark: str):
    """The text without the marks, and the [begin, end) spans their pairs enclosed."""
    out, spans, pos, length = [], [], 0, 0
    while True:
        begin = text.find(open_mark, pos)
        if begin < 0:
            break
        end = text.find(close_mark, begin + 1)
        if end < 0:
            raise Skip("template_error", "a {% generation %} block is not closed")
        if 0 <= text.find(close_mark, pos, begin) or 0 <= text.find(open_mark, begin + 1, end):
            raise Skip("template_error", "the template's assistant marks are unbalanced "
                       "(a {% generation %} block inside another?)")
        out += [text[pos:begin], text[begin + 1:end]]
        length += begin - pos
        spans.append((length, length + end - begin - 1))
        length += end - begin - 1
        pos = end + 1
    if text.find(close_mark, pos) >= 0:
        raise Skip("template_error", "the template's assistant marks are unbalanced")
    out.append(text[pos:])
    return "".join(out), spans


def load_source(path: Optional[str], tokenizer_dir: Optional[str]) -> Tuple[str, str]:
    """The chat template's text and where it came from: --chat-template (a .jinja file, a
    chat_template.json, or a tokenizer_config.json), else the tokenizer directory's
    chat_template.jinja / chat_template.json / tokenizer_config.json, else the default."""
    import os

    candidates = [path] if path else []
    if not path and tokenizer_dir:
        candidates = [os.path.join(tokenizer_dir, n) for n in
                      ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")]
    for candidate in candidates:
        if not os.path.exists(candidate):
            if candidate == path:
                raise TemplateSetupError(f"--chat-template {path}: no such file")
            continue
        try:
            with open(candidate, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise TemplateSetupError(f"cannot read the chat template {candidate}: {e}")
        if not candidate.endswith(".json"):
            return text, candidate
        found = _template_in_json(text, candidate)
        if found is not None:
            return found, candidate
        if candidate == path:
            raise TemplateSetupError(f"{path} holds no 'chat_template'")
    return DEFAULT_TEMPLATE, "default (ChatML, Qwen2-VL style)"


def _template_in_json(text: str, name: str) -> Optional[str]:
    try:
        value = json.loads(text).get("chat_template")
    except (ValueError, AttributeError) as e:
        raise TemplateSetupError(f"{name} is not a JSON object: {e}")
    if isinstance(value, list):  # named templates: [{"name": "default", "template": ...}]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default", next(iter(named.values()), None))
    return value if isinstance(value, str) else None
