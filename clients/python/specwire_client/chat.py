"""Chat datasets ({"messages": [...]}) rendered with the model's own chat template, one way for
training features, export and scoring.

The template comes from the model directory (chat_template.jinja, else tokenizer_config.json's
"chat_template", a string or a list of named templates) and is rendered by Jinja (the registry's
jinja2) in the environment transformers' apply_chat_template uses: a sandbox with trim_blocks and
lstrip_blocks, loop controls, its tojson / raise_exception / strftime_now / dict / namespace,
the tokenizer's special tokens as variables, reasoning fields aliased, and `{% generation %}`
blocks. Template flags (enable_thinking, ...) are keyword settings.

prepare() turns messages into token ids and a loss mask over the assistant turns: from the
template's own `{% generation %}` spans where it has them, else from the text each assistant
message adds (the render of messages[:i] with the generation prompt against that of
messages[:i + 1]). Every prepared sequence carries a TemplateRecord (the template's digest, its
source and the flags): the scorer refuses prompts prepared under another record than the one a
drafter was trained with.
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Union

import xxhash

Message = Mapping[str, Any]
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")


@dataclasses.dataclass(frozen=True)
class TemplateRecord:
    """What a chat rendering depended on: the template text's digest, where it came from, and
    the flags it was rendered with (sorted)."""

    digest: str
    source: str
    flags: tuple[tuple[str, Union[str, int, float, bool, None]], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "source": self.source, "flags": dict(self.flags)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TemplateRecord":
        return cls(digest=str(d["digest"]), source=str(d.get("source", "")),
                   flags=tuple(sorted(dict(d.get("flags") or {}).items())))

    def text(self) -> str:
        """The record as one canonical JSON line (what the scorer compares)."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


@dataclasses.dataclass
class PreparedChat:
    input_ids: list[int]
    loss_mask: list[int]  # 1 on the tokens of assistant turns
    text: str
    record: TemplateRecord


def _environment():
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`: renders its body and records its span."""
        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            # While a render tracks spans: the chunks generated so far, and the spans found.
            environment.extend(generation_spans=None, rendered_blocks=None)

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_span", [jinja2.nodes.ContextReference()]),
                                          [], [], body).set_lineno(lineno)

        def _span(self, context, caller):
            text = caller()
            spans = self.environment.generation_spans
            if spans is not None:
                start = len("".join(self.environment.rendered_blocks))
                spans.append((start, start + len(text)))
            return text

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore-prefixed attributes ({name!r})")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def _plain(value: Any) -> Any:
    """JSON-like copies of what the template sees (never the caller's objects)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _alias_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


class ChatTemplate:
    """One model's chat template."""

    def __init__(self, template: str, source: str = "",
                 special_tokens: Mapping[str, str] | None = None) -> None:
        if not isinstance(template, str) or not template:
            raise ValueError("chat template: empty")
        self.template = template
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.digest = "xxh3-128:" + xxhash.xxh3_128_hexdigest(template.encode("utf-8"))
        self._compiled = _environment().from_string(template)

    @classmethod
    def from_model_dir(cls, path: Union[str, Path], name: str = "default") -> "ChatTemplate":
        """chat_template.jinja, else tokenizer_config.json's chat_template (a named one from a
        list of {"name", "template"}); the special tokens from tokenizer_config.json."""
        d = Path(path)
        config: dict[str, Any] = {}
        if (d / "tokenizer_config.json").is_file():
            config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        special = {}
        for key in _SPECIAL_TOKEN_KEYS:
            v = config.get(key)
            if isinstance(v, Mapping):
                v = v.get("content")
            if isinstance(v, str):
                special[key] = v
        if (d / "chat_template.jinja").is_file():
            return cls((d / "chat_template.jinja").read_text(encoding="utf-8"),
                       "chat_template.jinja", special)
        t = config.get("chat_template")
        if isinstance(t, list):
            named = {e.get("name"): e.get("template") for e in t if isinstance(e, Mapping)}
            if name not in named:
                raise KeyError(f"{d / 'tokenizer_config.json'}: chat_template has no template "
                               f"named {name!r} (has {sorted(map(str, named))})")
            return cls(named[name], f"tokenizer_config.json:{name}", special)
        if not isinstance(t, str):
            raise FileNotFoundError(f"{d}: no chat_template.jinja and no chat_template in "
                                    "tokenizer_config.json")
        return cls(t, "tokenizer_config.json", special)

    def record(self, **flags: Union[str, int, float, bool, None]) -> TemplateRecord:
        return TemplateRecord(self.digest, self.source, tuple(sorted(flags.items())))

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = False,
               tools: Sequence[Mapping[str, Any]] | None = None,
               documents: Sequence[Mapping[str, Any]] | None = None,
               **flags: Any) -> str:
        """The text apply_chat_template(messages, tokenize=False, ...) renders."""
        return self._render(messages, add_generation_prompt, tools, documents, flags, None)

    def _render(self, messages, add_generation_prompt, tools, documents, flags,
                spans: list[tuple[int, int]] | None) -> str:
        chat = _alias_reasoning(_plain(list(messages)))
        for m in chat:
            if not isinstance(m, dict):
                raise TypeError(f"chat messages must be dicts, got {m!r}")
        variables = {**self.special_tokens, **_plain(dict(flags))}
        env = self._compiled.environment
        context = dict(messages=chat, tools=_plain(tools), documents=_plain(documents),
                       add_generation_prompt=add_generation_prompt, **variables)
        if spans is None:
            return self._compiled.render(**context)
        # Streamed, so that a generation block knows where it starts (as transformers does).
        blocks: list[str] = []
        env.generation_spans, env.rendered_blocks = spans, blocks
        try:
            for chunk in self._compiled.generate(**context):
                blocks.append(chunk)
            return "".join(blocks)
        finally:
            env.generation_spans = env.rendered_blocks = None

    def assistant_spans(self, messages: Sequence[Message], **flags: Any) -> tuple[str, list[tuple[int, int]]]:
        """The full render and the character spans of its assistant turns."""
        if re.search(r"\{%-?\s*generation\s*-?%\}", self.template):
            spans: list[tuple[int, int]] = []
            text = self._render(messages, False, None, None, flags, spans)
            return text, spans
        text = self.render(messages, **flags)
        spans = []
        for i, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            before = self.render(messages[:i], add_generation_prompt=True, **flags)
            upto = self.render(messages[:i + 1], **flags)
            if not (upto.startswith(before) and text.startswith(upto)):
                raise ValueError(
                    f"chat template: the render of messages[:{i + 1}] is not a prefix of the "
                    "whole conversation's (the template rewrites earlier turns): give it "
                    "{% generation %} blocks to mark the assistant spans")
            spans.append((len(before), len(upto)))
        return text, spans

    def prepare(self, messages: Sequence[Message],
                encode: Callable[[str], tuple[list[int], list[tuple[int, int]]]],
                **flags: Any) -> PreparedChat:
        """Token ids and the assistant loss mask. `encode(text)` returns (ids, character offsets)
        without added special tokens (the template writes them), e.g. tokenizer_encoder(tok)."""
        text, spans = self.assistant_spans(messages, **flags)
        ids, offsets = encode(text)
        mask = [0] * len(ids)
        for k, (a, b) in enumerate(offsets):
            if any(a < e and b > s for s, e in spans):
                mask[k] = 1
        return PreparedChat(list(ids), mask, text, self.record(**flags))


def tokenizer_encoder(tokenizer: Any) -> Callable[[str], tuple[list[int], list[tuple[int, int]]]]:
    """An encode() for prepare() from a `tokenizers.Tokenizer` (or a tokenizer.json path)."""
    if isinstance(tokenizer, (str, Path)):
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_file(str(tokenizer))

    def encode(text: str) -> tuple[list[int], list[tuple[int, int]]]:
        e = tokenizer.encode(text, add_special_tokens=False)
        return list(e.ids), [tuple(o) for o in e.offsets]

    return encode


def write_prepared_dataset(path: Union[str, Path], conversations: Sequence[Sequence[Message]],
                           template: ChatTemplate,
                           encode: Callable[[str], tuple[list[int], list[tuple[int, int]]]],
                           *, add_generation_prompt: bool = False, **flags: Any) -> TemplateRecord:
    """A JSONL dataset of prepared conversations, one line each:
    {"input_ids": [...], "loss_mask": [...], "chat_template": record} — what specwire-score
    --dataset and FeatureDataset read. With add_generation_prompt the conversations are scoring
    prompts (rendered up to the assistant's turn, loss mask all 0). Returns the record."""
    record = template.record(**flags)
    with open(path, "w", encoding="utf-8") as out:
        for messages in conversations:
            if add_generation_prompt:
                text = template.render(messages, add_generation_prompt=True, **flags)
                ids, _ = encode(text)
                line = {"input_ids": list(ids), "loss_mask": [0] * len(ids)}
            else:
                p = template.prepare(messages, encode, **flags)
                line = {"input_ids": p.input_ids, "loss_mask": p.loss_mask}
            line["chat_template"] = record.to_json()
            out.write(json.dumps(line) + "\n")
    return record
