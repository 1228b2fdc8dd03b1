"""Tool calling in training data: ``tools`` and assistant ``tool_calls`` in the OpenAI form (and the forms
datasets really use: arguments as JSON strings, flat calls, LLaMA-Factory's ShareGPT ``function_call`` /
``observation`` turns with a ``tools`` JSON column) are rendered by the chat template, and the calls are
trained like any answer; templates that cannot render them are row errors that say what to set."""

from __future__ import annotations

import json

import pytest

from kubetune.data.formats import RowError, inner_keys, normalize
from kubetune.data.templates import CHAT_TEMPLATES, JinjaTemplate, resolve_template
from kubetune.errors import DataError

from .conftest import IGNORE, trained_runs, write_rows

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"name": "get_time", "description": "Local time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}


def _call(name, args, id_=None):
    return {"type": "function", "function": {"name": name, "arguments": args}, **({"id": id_} if id_ else {})}


def _weather_row(*, system=True, content="", arguments=None):
    msgs = [{"role": "system", "content": "Be brief."}] if system else []
    msgs += [
        {"role": "user", "content": "Weather in Zürich and the time there?"},
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [_call("get_weather", arguments or {"city": "Zürich"}, "c1"), _call("get_time", {"tz": "Europe/Zurich"}, "c2")],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "18°C, sunny"},
        {"role": "tool", "tool_call_id": "c2", "name": "get_time", "content": "14:05"},
        {"role": "assistant", "content": "18°C and sunny; it is 14:05."},
    ]
    return {"messages": msgs, "tools": [WEATHER, TIME]}


def _norm(row):
    return normalize(row, "messages" if "messages" in row else "sharegpt", inner_keys({}), train_on_inputs=False)


LONG = {"max_seq_length": 2048}  # the tools block alone is a few hundred tokens of the tiny tokenizer
CALLS_TEXT = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Zurich"}}\n</tool_call><|im_end|>'
)


# --- formats -----------------------------------------------------------------------------------
def test_openai_rows_normalize_to_messages_tools_and_calls():
    chat = _norm(_weather_row())
    assert [m[0] for m in chat.messages] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert [m[2] for m in chat.messages] == [False, False, True, False, False, True]  # the call turn is trained
    assert chat.tools[0] == WEATHER
    assert chat.tools[1] == {"type": "function", "function": TIME}  # a bare schema gets OpenAI's wrapper
    assert chat.extras[2]["tool_calls"][0] == _call("get_weather", {"city": "Zürich"}, "c1")
    assert chat.extras[3] == {"name": "get_weather", "tool_call_id": "c1"}
    assert chat.has_tools


def test_arguments_as_json_strings_flat_calls_and_null_content_are_accepted():
    row = _weather_row()
    row["tools"] = json.dumps(row["tools"])  # datasets often store tools as a JSON string column
    row["messages"][2]["content"] = None
    row["messages"][2]["tool_calls"] = [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}},  # as OpenAI's API returns it
        {"name": "get_time", "arguments": {"tz": "Europe/Zurich"}},  # flat
    ]
    chat = _norm(row)
    assert chat.messages[2][1] == ""
    assert [c["function"] for c in chat.extras[2]["tool_calls"]] == [
        {"name": "get_weather", "arguments": {"city": "Zürich"}},
        {"name": "get_time", "arguments": {"tz": "Europe/Zurich"}},
    ]
    assert len(chat.tools) == 2


def test_llama_factory_sharegpt_function_call_and_observation_turns():
    row = {
        "conversations": [
            {"from": "human", "value": "Weather in Zürich?"},
            {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Zürich"}})},
            {"from": "observation", "value": "18°C, sunny"},
            {"from": "gpt", "value": "18°C and sunny."},
        ],
        "tools": json.dumps([WEATHER["function"]]),
    }
    chat = _norm(row)
    assert [(m[0], m[2]) for m in chat.messages] == [("user", False), ("assistant", True), ("tool", False), ("assistant", True)]
    assert chat.extras[1]["tool_calls"] == [_call("get_weather", {"city": "Zürich"})]
    assert chat.tools == [WEATHER]


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda r: r["messages"][1].update(tool_calls=[_call("f", {})]), r"messages\[1\]: tool_calls belong to assistant messages \(this one is 'user'\)"),
        (lambda r: r["messages"][2].update(tool_calls=[{"function": {"name": "f", "arguments": "{not json"}}]), r"messages\[2\]\.tool_calls\[0\]\.arguments is a string but not valid JSON"),
        (lambda r: r["messages"][2].update(tool_calls=[{"function": {"arguments": {}}}]), r"messages\[2\]\.tool_calls\[0\] has no function name"),
        (lambda r: r["messages"][2].update(tool_calls=[_call("f", [1, 2])]), r"messages\[2\]\.tool_calls\[0\]\.arguments must be a JSON object, got list"),
        (lambda r: r.update(tools="[{oops"), r"tools is a string but not valid JSON"),
        (lambda r: r.update(tools=[{"type": "function", "function": {"description": "x"}}]), r"tools\[0\] has no function name"),
    ],
)
def test_malformed_tool_rows_say_what_is_wrong(change, problem):
    row = _weather_row()
    change(row)
    with pytest.raises(RowError, match=problem):
        _norm(row)


# --- chatml's tool format: the fast renderer, its Jinja twin and transformers' masks -------------
@pytest.mark.parametrize("system", [True, False])
@pytest.mark.parametrize("content", ["", "Let me look that up."])
def test_chatml_fast_renderer_equals_its_jinja_twin_with_tools(multi_tokenizer, system, content):
    tpl = CHAT_TEMPLATES["chatml"]
    chat = _norm(_weather_row(system=system, content=content))
    msgs = [{"role": r, "content": c, **((chat.extras[i] or {}))} for i, (r, c, _) in enumerate(chat.messages)]
    for gp in (False, True):
        mine = tpl.render(chat.messages, tools=chat.tools, extras=chat.extras, add_generation_prompt=gp).text
        theirs = multi_tokenizer.apply_chat_template(msgs, tools=chat.tools, chat_template=tpl.jinja, tokenize=False, add_generation_prompt=gp)
        assert mine == theirs
    assert "<tools>\n" + json.dumps(WEATHER, ensure_ascii=False) in mine
    assert '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Zurich"}}\n</tool_call>' in mine


def test_chatml_trains_the_calls_and_the_final_answer_exactly_as_transformers_masks_them(multi_tokenizer, tmp_path, prepare):
    rows = [_weather_row(), _weather_row(system=False, content="Let me look that up.")]
    prep = prepare(write_rows(tmp_path / "rows.jsonl", rows), dataset={"chat_template": "chatml"}, training=LONG, tok=multi_tokenizer)
    for row, got in zip(rows, prep.train):
        chat = _norm(row)
        msgs = [{"role": r, "content": c, **((chat.extras[i] or {}))} for i, (r, c, _) in enumerate(chat.messages)]
        ref = multi_tokenizer.apply_chat_template(
            msgs, tools=chat.tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, add_special_tokens=False
        )
        assert got["input_ids"] == list(ref["input_ids"])
        assert [lab != IGNORE for lab in got["labels"]] == [bool(m) for m in ref["assistant_masks"]]
    first = trained_runs(multi_tokenizer, prep.train[0]["input_ids"], prep.train[0]["labels"])
    assert first == [CALLS_TEXT, "18°C and sunny; it is 14:05.<|im_end|>"]


# --- the tokenizer's own template ------------------------------------------------------------------
# Qwen2.5's tool format in the shape of its template: a default system prompt, tool results as user turns.
QWEN_LIKE = (
    "{% if tools %}{{ '<|im_start|>system\\n' }}{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{% else %}{{ 'You are a helpful assistant.' }}{% endif %}{{ '\\n\\n# Tools\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}{{ '\\n</tools><|im_end|>\\n' }}"
    "{% elif messages[0]['role'] == 'system' %}{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '<|im_start|>user\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|im_start|>assistant' }}"
    "{% if message['content'] %}{{ '\\n' + message['content'] }}{% endif %}"
    "{% for call in message['tool_calls'] or [] %}{{ '\\n<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' + (call['function']['arguments'] | tojson) + '}\\n</tool_call>' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% elif message['role'] == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_the_tokenizers_own_tool_template_renders_and_trains_the_calls(tokenizer, tmp_path, prepare):
    tokenizer.chat_template = QWEN_LIKE
    tpl = resolve_template(tokenizer, None)
    assert isinstance(tpl, JinjaTemplate)
    rows = [_weather_row(), _weather_row(content="Let me look that up.")]
    prep = prepare(write_rows(tmp_path / "rows.jsonl", rows), training=LONG, tok=tokenizer)
    text = tokenizer.decode(prep.train[0]["input_ids"])
    assert "<tool_response>\n18°C, sunny\n</tool_response>" in text and '"description": "Current weather of a city"' in text
    assert trained_runs(tokenizer, prep.train[0]["input_ids"], prep.train[0]["labels"]) == [CALLS_TEXT, "18°C and sunny; it is 14:05.<|im_end|>"]
    assert trained_runs(tokenizer, prep.train[1]["input_ids"], prep.train[1]["labels"])[0] == "Let me look that up.\n" + CALLS_TEXT


def test_a_template_that_drops_tool_calls_is_a_row_error_naming_the_fix(tokenizer, tmp_path, prepare):
    # The builtin tiny-chat template renders role and content only: the calls would silently vanish.
    with pytest.raises(DataError, match=r"rows\.jsonl:1: the tokenizer's chat template does not render 'tools'.*dataset\.chat_template: chatml"):
        prepare(write_rows(tmp_path / "rows.jsonl", [_weather_row()]), tok=tokenizer)
    row = _weather_row()
    del row["tools"]
    with pytest.raises(DataError, match=r"does not render tool_calls \(the call to 'get_weather' is missing"):
        prepare(write_rows(tmp_path / "rows2.jsonl", [row]), tok=tokenizer)
    # named chatml works with the same tokenizer
    prep = prepare(write_rows(tmp_path / "rows3.jsonl", [_weather_row()]), dataset={"chat_template": "chatml"}, training=LONG, tok=tokenizer)
    assert trained_runs(tokenizer, prep.train[0]["input_ids"], prep.train[0]["labels"])[0] == CALLS_TEXT


def test_registry_templates_without_a_tool_format_refuse_tool_rows(multi_tokenizer, tmp_path, prepare):
    with pytest.raises(DataError, match=r"rows\.jsonl:1: the llama3 chat template has no format for tools and tool calls"):
        prepare(write_rows(tmp_path / "rows.jsonl", [_weather_row()]), dataset={"chat_template": "llama3"}, tok=multi_tokenizer)


# A name the template text or the conversation already contains must not pass for a rendered one (issue 14):
# `f` is in "of", `user` and `im_start` in every ChatML turn, `Zürich` in the question.
@pytest.mark.parametrize("name", ["f", "user", "im_start", "Zürich"])
def test_a_name_found_elsewhere_in_the_text_does_not_pass_for_rendered_tools(tokenizer, tmp_path, prepare, name):
    tool = {"type": "function", "function": {"name": name, "description": "x", "parameters": {"type": "object", "properties": {}}}}
    row = {"messages": [{"role": "user", "content": "What is the weather of Zürich?"}, {"role": "assistant", "content": "Sunny."}], "tools": [tool]}
    with pytest.raises(DataError, match=rf"does not render 'tools' \(the function '{name}' is missing"):
        prepare(write_rows(tmp_path / "rows.jsonl", [row]), tok=tokenizer)
    call = {"role": "assistant", "content": "", "tool_calls": [_call(name, {"city": "Zürich"}, "c1")]}
    row = {"messages": [{"role": "user", "content": "What is the weather of Zürich?"}, call,
                        {"role": "tool", "tool_call_id": "c1", "content": "18°C"}, {"role": "assistant", "content": "Sunny."}]}
    with pytest.raises(DataError, match=rf"does not render tool_calls \(the call to '{name}' is missing"):
        prepare(write_rows(tmp_path / "rows2.jsonl", [row]), tok=tokenizer)


@pytest.mark.parametrize("name", ["f", "user"])
def test_a_template_that_renders_tools_accepts_short_and_template_like_names(tokenizer, tmp_path, prepare, name):
    tokenizer.chat_template = QWEN_LIKE
    tool = {"type": "function", "function": {"name": name, "description": "x", "parameters": {"type": "object", "properties": {}}}}
    call = {"role": "assistant", "content": "", "tool_calls": [_call(name, {"city": "Zürich"}, "c1")]}
    row = {"messages": [{"role": "user", "content": "Weather?"}, call, {"role": "tool", "tool_call_id": "c1", "content": "18°C"},
                        {"role": "assistant", "content": "Sunny."}], "tools": [tool]}
    prep = prepare(write_rows(tmp_path / "rows.jsonl", [row]), training=LONG, tok=tokenizer)
    assert f'{{"name": "{name}", "arguments": {{"city": "Zürich"}}}}' in tokenizer.decode(prep.train[0]["input_ids"])


def test_unrendered_tool_name_falls_back_to_whole_names_when_the_template_refuses_sentinels():
    """A template that checks its names (here: against a fixed list, which the sentinels are not on) is judged on
    its real text, by whole names: `f` inside "of" still does not count."""
    from kubetune.data.templates import unrendered_tool_name

    def strict(tools, msgs, *, show_tools=True, show_calls=True):
        names = [t["function"]["name"] for t in tools or ()]
        calls = [c["function"]["name"] for m in msgs for c in m.get("tool_calls") or ()]
        if any(n != "f" for n in names + calls):
            raise ValueError("unknown function name")
        text = " ".join(m["content"] or "" for m in msgs)
        return text + (" ".join(f"<tool {n}>" for n in names) if show_tools else "") + (" ".join(f"call({c})" for c in calls) if show_calls else "")

    tool = {"type": "function", "function": {"name": "f"}}
    msgs = [{"role": "user", "content": "weather of Oslo"}, {"role": "assistant", "content": "", "tool_calls": [_call("f", {})]}]
    assert unrendered_tool_name(strict, [tool], msgs) is None
    assert unrendered_tool_name(lambda t, m: strict(t, m, show_tools=False), [tool], msgs[:1]) == ("tools", 0, "f")
    assert unrendered_tool_name(lambda t, m: strict(t, m, show_calls=False), None, msgs) == ("tool_calls", 1, "f")
