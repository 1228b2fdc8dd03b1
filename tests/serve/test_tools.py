"""Tool calling on /v1/chat/completions with the official openai client: tools and earlier calls reach the
chat template, replies in the Hermes/Qwen2.5 form come back as OpenAI ``tool_calls`` (whole and streamed,
never leaking a half-written ``<tool_call>`` as text), and a template that cannot render tools is a 400."""

from __future__ import annotations

import json

import pytest

from kubetune.serve.tools import ToolStream, parse_tool_calls

from .conftest import LiveServer

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
TWO = CALL + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


# --- parsing ---------------------------------------------------------------------------------------
def test_calls_are_parsed_with_the_text_before_them():
    content, calls = parse_tool_calls("Let me check.\n" + TWO)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_weather"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Zürich"}, {"city": "Oslo"}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]
    content, calls = parse_tool_calls(CALL)
    assert content is None and [c["function"]["name"] for c in calls] == ["get_weather"]  # a call alone: no content


@pytest.mark.parametrize("text", [
    "Sunny, 18°C.",  # no call
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zür',  # cut by max_tokens
    "<tool_call>\nnot json\n</tool_call>",
    '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
    CALL + "\nand then some text",
])
def test_anything_but_well_formed_calls_stays_text(text):
    assert parse_tool_calls(text) == (text, [])


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 1000])
def test_streaming_holds_back_exactly_what_may_be_a_call(size):
    for reply, want_text, want_calls in [("Let me check.\n" + CALL, "Let me check.\n", 1), ("a <tool x> b <tool_cal", "a <tool x> b <tool_cal", 0), (CALL[:-3], CALL[:-3], 0)]:
        stream = ToolStream()
        sent = "".join(stream.feed(reply[i : i + size]) for i in range(0, len(reply), size))
        assert "<tool_call>" not in sent
        rest, calls = stream.finish()
        assert sent + rest == want_text and len(calls) == want_calls


# --- the server ------------------------------------------------------------------------------------
class ScriptedEngine:
    """Stands in for the generation engine: answers every request with ``reply``, a few characters at a time."""

    def __init__(self) -> None:
        self.reply = ""
        self.prompts: list[list[int]] = []
        self.on_step = None
        self.running = 0
        self.waiting = 0
        self.alive = True

    def start(self) -> None:
        pass

    def shutdown(self, timeout: float = 10.0) -> None:
        pass

    def submit(self, req) -> None:
        from kubetune.serve.engine import EngineOutput

        self.prompts.append(list(req.prompt_ids))
        pieces = [self.reply[i : i + 4] for i in range(0, len(self.reply), 4)] if req.stream else [self.reply]
        for k, piece in enumerate(pieces):
            req.on_output(EngineOutput(piece, completion_tokens=k + 1))
        req.on_output(EngineOutput("", finish_reason="stop", completion_tokens=len(pieces)))


@pytest.fixture(scope="module")
def tool_server(tiny_model, artifacts):
    """Model 'tiny-chat' with the chatml template (tools render), adapter 'beta' with the builtin plain one."""
    from transformers import AutoTokenizer

    from kubetune.data.templates import CHAT_TEMPLATES
    from kubetune.serve.app import create_app
    from kubetune.serve.loading import LoadedModels
    from kubetune.serve.options import ServeOptions
    from kubetune.serve.sources import resolve_sources

    plain = AutoTokenizer.from_pretrained(tiny_model)
    chatml = AutoTokenizer.from_pretrained(tiny_model)
    chatml.chat_template = CHAT_TEMPLATES["chatml"].jinja  # what a run trained with dataset.chat_template: chatml saves
    plan = resolve_sources("builtin://tiny-chat", {"beta": str(artifacts.beta)})
    engine = ScriptedEngine()
    loaded = LoadedModels(engine=engine, tokenizer=plain, chat_tokenizers={plan.model_name: chatml}, context_length=512, default_temperature=0.0, default_top_p=1.0)
    server = LiveServer(create_app(plan, ServeOptions(max_model_len=512), loaded=loaded))
    server.engine, server.tok, server.tools_model, server.plain_model = engine, chatml, plan.model_name, "beta"
    yield server
    server.close()


def test_a_reply_with_calls_comes_back_as_tool_calls(tool_server):
    tool_server.engine.reply = "Checking.\n" + TWO
    r = tool_server.client().chat.completions.create(
        model=tool_server.tools_model, messages=[{"role": "user", "content": "Weather in Zürich and Oslo?"}], tools=[WEATHER]
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Zürich"}), ("get_weather", {"city": "Oslo"})]
    prompt = tool_server.tok.decode(tool_server.engine.prompts[-1])
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt  # the model saw the tools


def test_streamed_calls_arrive_as_tool_call_deltas_and_no_markup_leaks(tool_server):
    tool_server.engine.reply = "Checking.\n" + CALL
    stream = tool_server.client().chat.completions.create(
        model=tool_server.tools_model, messages=[{"role": "user", "content": "Weather in Zürich?"}], tools=[WEATHER], stream=True
    )
    text, calls, reasons = "", [], []
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            calls += c.delta.tool_calls or []
            reasons += [c.finish_reason] if c.finish_reason else []
    assert text == "Checking.\n" and "<tool" not in text
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Zürich"} and calls[0].id.startswith("call_")
    assert reasons == ["tool_calls"]


def test_the_conversation_continues_with_the_call_and_its_result(tool_server):
    tool_server.engine.reply = "It is 18°C in Zürich."
    r = tool_server.client().chat.completions.create(
        model=tool_server.tools_model,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18°C"},
        ],
    )
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == "It is 18°C in Zürich."
    assert not r.choices[0].message.tool_calls
    prompt = tool_server.tok.decode(tool_server.engine.prompts[-1])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>' in prompt  # arguments as an object
    assert "<|im_start|>tool\n18°C<|im_end|>" in prompt


def test_tool_choice_none_returns_the_text_as_is(tool_server):
    tool_server.engine.reply = CALL
    r = tool_server.client().chat.completions.create(
        model=tool_server.tools_model, messages=[{"role": "user", "content": "hi"}], tools=[WEATHER], tool_choice="none"
    )
    assert r.choices[0].message.content == CALL and r.choices[0].finish_reason == "stop"


def test_what_the_server_cannot_do_with_tools_is_a_400_naming_the_field(tool_server):
    import openai

    client = tool_server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=tool_server.plain_model, messages=[{"role": "user", "content": "hi"}], tools=[WEATHER])
    assert e.value.body["param"] == "tools" and "does not render tools" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=tool_server.tools_model, messages=[{"role": "user", "content": "hi"}], tools=[WEATHER], tool_choice="required")
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=tool_server.tools_model, messages=[{"role": "user", "content": "hi"}], tools=[{"type": "function", "function": {"description": "x"}}])
    assert e.value.body["param"] == "tools" and "no function name" in e.value.body["message"]
    bad_call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=tool_server.tools_model, messages=[{"role": "user", "content": "hi"}, bad_call], tools=[WEATHER])
    assert e.value.body["param"] == "messages[1].tool_calls" and "not valid JSON" in e.value.body["message"]


@pytest.mark.parametrize("name", ["f", "user", "im_start", "Paris"])
def test_a_name_found_elsewhere_in_the_prompt_does_not_pass_for_rendered_tools(tool_server, name):
    """`f` is in "of", `user` and `im_start` in every ChatML turn, `Paris` in the question: none of them shows the
    plain template rendered the tool or the call (issue 14). The template that renders tools takes them all."""
    import openai

    client = tool_server.client()
    ask = [{"role": "user", "content": "What is the weather of Paris?"}]
    tool = {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=tool_server.plain_model, messages=ask, tools=[tool])
    assert e.value.body["param"] == "tools" and f"the function '{name}' is missing" in e.value.body["message"]
    history = [*ask, {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": name, "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "18°C"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=tool_server.plain_model, messages=history)
    assert e.value.body["param"] == "messages[1].tool_calls" and f"the call to '{name}' is missing" in e.value.body["message"]
    tool_server.engine.reply = "Sunny."
    r = client.chat.completions.create(model=tool_server.tools_model, messages=history, tools=[tool])
    assert r.choices[0].message.content == "Sunny."
