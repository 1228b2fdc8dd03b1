"""Chat templates: the fast renderers equal their Jinja twins, masks equal transformers' own
generation masks, every answer ends with the end-of-turn token, and the tokenizer's own templates
(consistent or not, with or without an end-of-turn token) are handled and reported."""

from __future__ import annotations

import pytest

from kubetune.data.templates import CHAT_TEMPLATES, JinjaTemplate, resolve_template
from kubetune.errors import DataError

from .conftest import IGNORE, trained_runs, write_rows

CONVERSATIONS = [
    [("user", "Hi", False), ("assistant", "Hello.", True)],
    [("system", "Be brief.", False), ("user", "2+2?", False), ("assistant", "4.", True)],
    [("user", " padded question \n", False), ("assistant", "  padded answer  ", True)],
    [("system", "S", False), ("user", "a", False), ("assistant", "b", True), ("user", "c", False), ("assistant", "d", True)],
    [("user", "Ça va? 日本 🚀", False), ("assistant", "Très bien — 東京 🚀", True)],
    [("user", "Hi", False), ("assistant", "skip me", False), ("user", "Again", False), ("assistant", "train me", True)],
]
TOOL_CONVERSATION = [("user", "Weather?", False), ("assistant", "Let me check.", True), ("tool", "sunny", False), ("assistant", "Sunny.", True)]


def _msgs(conv):
    return [{"role": r, "content": c, **({"weight": 0} if r == "assistant" and not t else {})} for r, c, t in conv]


def _fits(template, conv):
    return all(r in template.roles for r, _, _ in conv)


@pytest.mark.parametrize("name", list(CHAT_TEMPLATES))
def test_fast_renderer_equals_its_jinja_twin(multi_tokenizer, name):
    tpl = CHAT_TEMPLATES[name]
    for conv in CONVERSATIONS + [TOOL_CONVERSATION]:
        if not _fits(tpl, conv):
            continue
        for gp in (False, True):
            mine = tpl.render(conv, add_generation_prompt=gp).text
            theirs = multi_tokenizer.apply_chat_template(_msgs(conv), chat_template=tpl.jinja, tokenize=False, add_generation_prompt=gp)
            assert mine == theirs, (name, conv, gp)


@pytest.mark.parametrize("name", list(CHAT_TEMPLATES))
def test_masks_equal_transformers_generation_masks(multi_tokenizer, tmp_path, prepare, name):
    """Our trained tokens are exactly the tokens transformers marks inside {% generation %}."""
    tpl = CHAT_TEMPLATES[name]
    convs = [c for c in CONVERSATIONS if _fits(tpl, c) and all(t for r, _, t in c if r == "assistant")]
    rows = [{"messages": _msgs(c)} for c in convs]
    prep = prepare(write_rows(tmp_path / "rows.jsonl", rows), dataset={"chat_template": name}, tok=multi_tokenizer)
    for conv, got in zip(convs, prep.train):
        ref = multi_tokenizer.apply_chat_template(
            _msgs(conv), tokenize=True, return_dict=True, return_assistant_tokens_mask=True, add_special_tokens=False
        )
        assert got["input_ids"] == list(ref["input_ids"]), name
        mask = [lab != IGNORE for lab in got["labels"]]
        assert mask == [bool(m) for m in ref["assistant_masks"]], (name, conv)


@pytest.mark.parametrize("name", list(CHAT_TEMPLATES))
def test_every_answer_ends_with_the_end_of_turn_token(multi_tokenizer, tmp_path, prepare, name):
    tpl = CHAT_TEMPLATES[name]
    convs = [c for c in CONVERSATIONS if _fits(tpl, c)]
    prep = prepare(write_rows(tmp_path / "rows.jsonl", [{"messages": _msgs(c)} for c in convs]), dataset={"chat_template": name}, tok=multi_tokenizer)
    trims = name in ("llama3", "gemma")
    for conv, row in zip(convs, prep.train):
        want = [(c.strip() if trims else c) + tpl.eot for r, c, t in conv if r == "assistant" and t]
        assert trained_runs(multi_tokenizer, row["input_ids"], row["labels"]) == want, name
    # the named template is installed on the tokenizer, so it is saved with the adapter and used at inference
    assert multi_tokenizer.chat_template == tpl.jinja


def test_roles_a_template_cannot_render_are_row_errors(multi_tokenizer, tmp_path, prepare):
    rows = [{"messages": _msgs(TOOL_CONVERSATION)}]
    with pytest.raises(DataError, match=r"rows\.jsonl:1: the mistral chat template has no 'tool' role"):
        prepare(write_rows(tmp_path / "rows.jsonl", rows), dataset={"chat_template": "mistral"}, tok=multi_tokenizer)
    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]}]
    with pytest.raises(DataError, match=r"rows\.jsonl:1: the gemma chat template needs roles alternating"):
        prepare(write_rows(tmp_path / "rows.jsonl", rows), dataset={"chat_template": "gemma"}, tok=multi_tokenizer)


def test_named_template_needs_its_special_tokens(tokenizer, tmp_path, prepare):
    src = write_rows(tmp_path / "rows.jsonl", [{"text": "x"}])
    with pytest.raises(DataError, match=r"'llama3' needs the special token\(s\) <\|begin_of_text\|>"):
        prepare(src, dataset={"chat_template": "llama3"})


def test_tokenizers_own_chatml_template_uses_the_fast_path(tokenizer):
    lines = []
    tpl = resolve_template(tokenizer, None, log=lines.append)
    assert tpl == CHAT_TEMPLATES["chatml"]  # the registry's fast renderer
    assert isinstance(tpl.own, JinjaTemplate) and tpl.own.tokenizer is tokenizer  # conversations with tools: the tokenizer's own
    assert "renders exactly like chatml" in lines[0]


# --- the tokenizer's own templates that are not in the registry ----------------------------------
CUSTOM_WITH_EOS = (
    "{% for m in messages %}{{ '### ' + m['role'] + ':\\n' + m['content'] + eos_token + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '### assistant:\\n' }}{% endif %}"
)
CUSTOM_NO_EOT = (
    "{% for m in messages %}{{ m['role'] + ':\\n' + m['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:\\n' }}{% endif %}"
)
# Renders the number of messages first: a prefix never renders like the start of the whole conversation.
CUSTOM_INCONSISTENT = "{{ 'turns=' + (messages | length | string) + '\\n' }}" + CUSTOM_WITH_EOS
# A default system prompt plus generation markers: not a registry template, masks come from the markers.
CUSTOM_MARKERS = (
    "{{ '<|im_start|>system\\nDefault.<|im_end|>\\n' }}"
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ROWS = [
    {"messages": [{"role": "user", "content": "Capital of Japan?"}, {"role": "assistant", "content": "Tokyo."}]},
    {"messages": [{"role": "user", "content": "a?"}, {"role": "assistant", "content": "b."}, {"role": "user", "content": "c?"}, {"role": "assistant", "content": "d."}]},
]
WANT = [["Tokyo.<|im_end|>"], ["b.<|im_end|>", "d.<|im_end|>"]]


@pytest.mark.parametrize(
    "template,stat,warning",
    [
        (CUSTOM_WITH_EOS, None, None),
        (CUSTOM_NO_EOT, "eos_inserted_rows", "emits no end-of-turn token"),
        (CUSTOM_INCONSISTENT, "prefix_inconsistent_rows", "prefix by prefix"),
        (CUSTOM_MARKERS, None, None),
    ],
    ids=["own-template-with-eos", "own-template-without-eot", "own-template-prefix-inconsistent", "own-template-generation-markers"],
)
def test_tokenizers_own_template(tokenizer, tmp_path, prepare, template, stat, warning):
    tokenizer.chat_template = template
    assert isinstance(resolve_template(tokenizer, None), JinjaTemplate)
    prep = prepare(write_rows(tmp_path / "rows.jsonl", ROWS))
    assert prep.stats["chat_template"] == "tokenizer"
    for row, want in zip(prep.train, WANT):
        assert trained_runs(tokenizer, row["input_ids"], row["labels"]) == want
    if stat:
        assert prep.stats[stat] == 2
        assert any(warning in w for w in prep.stats["warnings"]), prep.stats["warnings"]
    else:
        assert not prep.stats["warnings"]


def test_prefix_inconsistent_template_is_warned_about_at_choice(tokenizer):
    tokenizer.chat_template = CUSTOM_INCONSISTENT
    lines = []
    resolve_template(tokenizer, None, log=lines.append)
    assert any("renders a conversation prefix differently" in ln for ln in lines)


# --- model families whose own template lacks generation markers: TRL's training version locates the answers ----
@pytest.mark.parametrize(
    "family,want",
    [
        ("qwen2_5", WANT),  # a default system prompt: not the registry's chatml; markers give exact answer spans
        # Qwen3 drops earlier turns' reasoning (prefix-inconsistent as shipped); TRL's training version keeps every
        # turn as rendered and marks the empty think block as part of each answer, which the model emits itself.
        ("qwen3", [["<think>\n\n</think>\n\nTokyo.<|im_end|>"], ["<think>\n\n</think>\n\nb.<|im_end|>", "<think>\n\n</think>\n\nd.<|im_end|>"]]),
    ],
)
def test_a_known_model_family_template_uses_trls_training_version(tokenizer, tmp_path, prepare, family, want):
    from trl import chat_template_utils as trl_templates

    tokenizer.chat_template = getattr(trl_templates, f"{family}_chat_template")  # the template as the model ships it
    lines = []
    tpl = resolve_template(tokenizer, None, log=lines.append)
    assert isinstance(tpl, JinjaTemplate) and "TRL's training version" in lines[-1], lines
    prep = prepare(write_rows(tmp_path / "rows.jsonl", ROWS))
    for row, expected in zip(prep.train, want):
        assert trained_runs(tokenizer, row["input_ids"], row["labels"]) == expected
    assert not prep.stats.get("prefix_inconsistent_rows") and not prep.stats["warnings"], prep.stats["warnings"]
    assert tokenizer.chat_template == getattr(trl_templates, f"{family}_chat_template")  # what is saved stays the model's own
