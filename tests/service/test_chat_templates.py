"""specwire_client.chat renders chat templates as transformers' apply_chat_template does (the
same text for the same messages and flags, on real-world template layouts), marks assistant
spans for loss masks (equal to transformers' return_assistant_tokens_mask where the template has
generation blocks), and records what a rendering depended on."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from specwire_client.chat import ChatTemplate, TemplateRecord, tokenizer_encoder

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "chat_templates"
TOKENIZER = REPO / "models" / "tiny-qwen3" / "tokenizer.json"
SPECIAL = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}}}}]
CONVERSATIONS = [
    [{"role": "user", "content": "def add(a, b):"}],
    [{"role": "system", "content": "You write Python."},
     {"role": "user", "content": "Sort a list."},
     {"role": "assistant", "content": "Use sorted(xs).  "}],
    [{"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "<think>\nsay hi\n</think>\n\nHello!"},
     {"role": "user", "content": "Weather in Oslo?"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"type": "function", "function": {"name": "get_weather",
                                           "arguments": {"city": "Oslo"}}}]},
     {"role": "tool", "content": "{\"temp\": -3}"},
     {"role": "assistant", "content": "It is -3 °C.", "reasoning_content": "read the tool"}],
    [{"role": "user", "content": "  spaced  "}, {"role": "assistant", "thinking": "hm",
                                                  "content": "ok"}],
]
FLAGS = [{}, {"enable_thinking": False}, {"enable_thinking": True}]


def hf_tokenizer(template: str) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER), **SPECIAL)
    tok.chat_template = template
    return tok


@pytest.mark.parametrize("name", ["qwen3.jinja", "llama3.jinja", "chatml_generation.jinja"])
def test_render_equals_apply_chat_template(name):
    template = (DATA / name).read_text()
    ours = ChatTemplate(template, name, SPECIAL)
    hf = hf_tokenizer(template)
    cases = 0
    for messages in CONVERSATIONS:
        for flags in FLAGS:
            for gen in (False, True):
                for tools in ((None, TOOLS) if name == "qwen3.jinja" else (None,)):
                    want = hf.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=gen, tools=tools,
                                                  **flags)
                    got = ours.render(messages, add_generation_prompt=gen, tools=tools,
                                      **flags)
                    assert got == want, (name, messages, flags, gen, tools)
                    cases += 1
    assert cases >= 24


def test_loss_mask_equals_transformers_assistant_mask_with_generation_blocks():
    template = (DATA / "chatml_generation.jinja").read_text()
    ours = ChatTemplate(template, "chatml_generation.jinja", SPECIAL)
    hf = hf_tokenizer(template)
    encode = tokenizer_encoder(TOKENIZER)
    for messages in CONVERSATIONS[1:]:
        prepared = ours.prepare(messages, encode)
        want = hf.apply_chat_template(messages, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        assert prepared.input_ids == list(want["input_ids"])
        assert prepared.loss_mask == list(want["assistant_masks"])
        assert sum(prepared.loss_mask) > 0


def test_loss_mask_from_the_turns_each_assistant_message_adds():
    template = (DATA / "llama3.jinja").read_text()
    ours = ChatTemplate(template, "llama3.jinja", SPECIAL)
    encode = tokenizer_encoder(TOKENIZER)
    hf = hf_tokenizer(template)
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b c"},
                {"role": "user", "content": "d"}, {"role": "assistant", "content": "e f g"}]
    p = ours.prepare(messages, encode)
    assert p.input_ids == hf.encode(p.text, add_special_tokens=False)
    masked = hf.decode([t for t, m in zip(p.input_ids, p.loss_mask) if m])
    assert "b c" in masked and "e f g" in masked and "a" not in masked.replace("assistant", "")
    # A template that rewrites earlier turns (Qwen3 drops their reasoning) cannot be split this
    # way: a clear error naming the fix.
    qwen = ChatTemplate((DATA / "qwen3.jinja").read_text(), "qwen3.jinja", SPECIAL)
    with pytest.raises(ValueError, match="generation"):
        qwen.prepare(CONVERSATIONS[2], encode)
    single = qwen.prepare(CONVERSATIONS[1], encode, enable_thinking=False)
    assert sum(single.loss_mask) > 0


def test_model_directory_sources_and_records(tmp_path):
    template = (DATA / "llama3.jinja").read_text()
    a = tmp_path / "a"
    a.mkdir()
    (a / "tokenizer_config.json").write_text(json.dumps({"chat_template": template,
                                                         "bos_token": "<s>"}))
    t = ChatTemplate.from_model_dir(a)
    assert t.source == "tokenizer_config.json" and t.special_tokens["bos_token"] == "<s>"
    assert t.render([{"role": "user", "content": "x"}]).startswith("<s><|start_header_id|>")
    (a / "chat_template.jinja").write_text("{{ messages[0].content }}")
    assert ChatTemplate.from_model_dir(a).source == "chat_template.jinja"
    b = tmp_path / "b"
    b.mkdir()
    (b / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "default", "template": template}, {"name": "tool_use", "template": "T"}]}))
    assert ChatTemplate.from_model_dir(b, "tool_use").template == "T"
    with pytest.raises(KeyError, match="rag"):
        ChatTemplate.from_model_dir(b, "rag")
    with pytest.raises(FileNotFoundError):
        ChatTemplate.from_model_dir(tmp_path)
    r1 = t.record(enable_thinking=False, add_tools=True)
    assert r1.to_json()["flags"] == {"add_tools": True, "enable_thinking": False}
    assert TemplateRecord.from_json(json.loads(r1.text())) == r1
    assert r1 != t.record(enable_thinking=True)
    assert ChatTemplate(template + " ").digest != t.digest
    # Templates are sandboxed as in transformers.
    bad = ChatTemplate("{{ ''.__class__.__mro__ }}")
    with pytest.raises(Exception):
        bad.render([{"role": "user", "content": "x"}])
    boom = ChatTemplate("{{ raise_exception('no system role') }}")
    with pytest.raises(Exception, match="no system role"):
        boom.render([])


def test_the_extractor_contract_names_the_targets_chat_template(server_factory, tmp_path):
    """The contract's chat_template_digest is the digest a TemplateRecord carries."""
    import shutil

    from specwire_client import ExtractorClient
    model = tmp_path / "with-template"
    shutil.copytree(REPO / "models" / "tiny-qwen3", model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"},
                               {"name": "default",
                                "template": (DATA / "llama3.jinja").read_text()}]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    server = server_factory(model, metrics=False)
    with ExtractorClient(server.address, timeout=60) as c:
        digest = c.model_info().chat_template_digest
    assert digest == ChatTemplate.from_model_dir(model).digest
    assert digest.startswith("xxh3-128:")
    server.stop()
    (model / "chat_template.jinja").write_text((DATA / "qwen3.jinja").read_text())
    server = server_factory(model, metrics=False)
    with ExtractorClient(server.address, timeout=60) as c:
        assert c.model_info().chat_template_digest == ChatTemplate.from_model_dir(model).digest
    server.stop()
    with ExtractorClient(server_factory(REPO / "models" / "tiny-qwen3",
                                        metrics=False).address, timeout=60) as c:
        assert c.model_info().chat_template_digest == ""  # no template shipped
