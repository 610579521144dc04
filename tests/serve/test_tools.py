"""`vpo serve`'s tool calls: the tool format read once from the chat template, tools and tool
messages rendered through the checkpoint's own template (a Qwen2.5 template with tools on the
byte-level BPE fixture), the model's `<tool_call>` blocks (Llama 3.1: its JSON calls) parsed
into `message.tool_calls`, streamed as a `tool_calls` delta, and refused by name where the
template has no tool format."""

import dataclasses
import json
import pathlib

import pytest

from vpo.errors import RequestError
from vpo.io import hf
from vpo.serve.engine import Update
from vpo.serve.parse import parse_chat
from vpo.serve.protocol import Completion, Limits, chat_response
from vpo.serve.stream import Streamer
from vpo.serve.tools import ToolFormat, before_calls, parse_tool_calls, tool_format

FIXTURES = pathlib.Path(__file__).parent.parent / "fixtures"
BPE = FIXTURES / "hf" / "qwen2_bpe"
QWEN_TOOLS = (FIXTURES / "chat_templates" / "qwen2_5_tools.jinja").read_text()
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}}}}}
LLAMA_SNIPPET = ('{%- if tools %}Given the following functions, respond with a JSON for a '
                 'function call: {"name": function name, "parameters": dictionary}{% endif %}')


@pytest.fixture(scope="module")
def tokenizer():
    """The BPE fixture's tokenizer with a Qwen2.5 chat template that renders tools."""
    return dataclasses.replace(hf.load_tokenizer(BPE), chat_template=QWEN_TOOLS)


def _limits(tok, fmt=None):
    return Limits("m", 700, 32, max_rows=8,
                  tool_format=tool_format(tok.chat_template) if fmt is None else fmt)


def test_the_tool_format_is_read_from_the_template():
    assert tool_format(QWEN_TOOLS) is ToolFormat.HERMES
    assert tool_format(LLAMA_SNIPPET) is ToolFormat.LLAMA_JSON
    assert tool_format((BPE / "tokenizer_config.json").read_text()) is ToolFormat.NONE
    assert tool_format((FIXTURES / "hf" / "qwen3_tied" / "chat_template.jinja").read_text()) \
        is ToolFormat.NONE
    assert tool_format(None) is ToolFormat.NONE


def test_hermes_calls_are_parsed_and_a_broken_one_leaves_the_text():
    text = ('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
            '</tool_call>\n<tool_call>{"name": "neg", "arguments": "{\\"x\\": 3}"}</tool_call>')
    content, calls = parse_tool_calls(text, ToolFormat.HERMES)
    assert content == "Let me add."
    assert [c["function"]["name"] for c in calls] == ["add", "neg"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert json.loads(calls[1]["function"]["arguments"]) == {"x": 3}
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    assert parse_tool_calls('<tool_call>{"name": "add"}</tool_call>', ToolFormat.HERMES)[0] \
        is None
    for bad in ('<tool_call>{"name": "add", "arguments": {</tool_call>',  # not JSON
                '<tool_call>{"arguments": {}}</tool_call>',  # no name
                '<tool_call>{"name": "add", "arguments": {"a": 1}}',  # cut before its end
                "just text"):
        assert parse_tool_calls(bad, ToolFormat.HERMES) == (bad, [])
    assert parse_tool_calls(text, ToolFormat.NONE) == (text, [])


def test_llama_json_calls_are_parsed():
    content, calls = parse_tool_calls('{"name": "add", "parameters": {"a": 1, "b": 2}}',
                                      ToolFormat.LLAMA_JSON)
    assert content is None and calls[0]["function"]["name"] == "add"
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    _, two = parse_tool_calls('<|python_tag|>{"name": "a", "parameters": {}}; '
                              '{"name": "b", "parameters": {"x": 1}}', ToolFormat.LLAMA_JSON)
    assert [c["function"]["name"] for c in two] == ["a", "b"]
    for text in ("The sum is 3.", '{"a": 1}', '{"name": "add", "parameters": 3}'):
        assert parse_tool_calls(text, ToolFormat.LLAMA_JSON) == (text, [])


def test_a_stream_holds_back_what_could_be_a_tool_call():
    assert before_calls("Sure. <tool_", ToolFormat.HERMES) == "Sure. "
    assert before_calls("Sure. <tool_call>{", ToolFormat.HERMES) == "Sure. "
    assert before_calls("Sure. <b>", ToolFormat.HERMES) == "Sure. <b>"
    assert before_calls(' {"name"', ToolFormat.LLAMA_JSON) == ""
    assert before_calls("It is 3", ToolFormat.LLAMA_JSON) == "It is 3"
    assert before_calls("Sure. <tool_", ToolFormat.NONE) == "Sure. <tool_"


def test_tools_and_tool_messages_render_through_the_template(tokenizer):
    limits = _limits(tokenizer)
    assert limits.tool_format is ToolFormat.HERMES
    ask = [{"role": "user", "content": "What is 1 + 2?"}]
    gen = parse_chat({"messages": ask, "tools": [ADD], "parallel_tool_calls": True}, tokenizer,
                     limits)
    prompt = tokenizer.decode(gen.prompts[0], skip_special_tokens=False)
    assert "<tools>\n" + json.dumps(ADD) + "\n</tools>" in prompt
    assert gen.tool_calls is ToolFormat.HERMES
    plain = parse_chat({"messages": ask}, tokenizer, limits)
    assert "<tools>" not in tokenizer.decode(plain.prompts[0], skip_special_tokens=False)
    assert plain.tool_calls is ToolFormat.NONE
    history = [*ask, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "name": "add", "content": "3"}]
    gen = parse_chat({"messages": history, "tools": [ADD], "tool_choice": "none"}, tokenizer,
                     limits)
    prompt = tokenizer.decode(gen.prompts[0], skip_special_tokens=False)
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}'
            '\n</tool_call><|im_end|>') in prompt  # arguments as the object the model wrote
    assert "<tool_response>\n3\n</tool_response>" in prompt
    assert gen.tool_calls is ToolFormat.NONE  # tool_choice none: tools shown, none parsed


def test_tool_requests_are_refused_by_name(tokenizer):
    limits = _limits(tokenizer)
    ask = [{"role": "user", "content": "hi"}]
    cases = [({"tools": [ADD], "tool_choice": "required"}, "tool_choice"),
             ({"tools": [ADD], "tool_choice": {"type": "function",
                                               "function": {"name": "add"}}}, "tool_choice"),
             ({"tools": [{"type": "function"}]}, "tools"),
             ({"tools": [ADD], "parallel_tool_calls": False}, "parallel_tool_calls"),
             ({"tools": [ADD], "messages": [{"role": "user", "content": "x", "tool_calls": [
                 {"function": {"name": "add", "arguments": "{"}}]}]}, "messages"),
             ({"messages": [{"role": "assistant", "content": "", "tool_calls": [
                 {"function": {"name": "add", "arguments": "[1]"}}]}]}, "messages"),
             ({"tool_choice": "required"}, "tool_choice"),
             ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages")]
    for extra, param in cases:
        with pytest.raises(RequestError) as e:
            parse_chat({"messages": ask, **extra}, tokenizer, limits)
        assert e.value.param == param and e.value.status == 422, (extra, str(e.value))
    none = _limits(tokenizer, ToolFormat.NONE)  # a template without a tool format
    for extra, words in (({"tools": [ADD]}, "no tool format"),
                         ({"messages": [*ask, {"role": "assistant", "content": "", "tool_calls": [
                             {"function": {"name": "add", "arguments": "{}"}}]}]},
                          r"messages\[1\].tool_calls.*no tool format"),
                         ({"messages": [{"role": "tool", "content": "3", "tool_call_id": "c"}]},
                          r"messages\[0\].tool_call_id")):
        with pytest.raises(RequestError, match=words) as e:
            parse_chat({"messages": ask, **extra}, tokenizer, none)
        assert e.value.status == 422 and e.value.code == "unsupported_parameter"


def _answer(tokenizer, text):
    ids = tuple(tokenizer.encode(text))
    return Completion(ids, (-0.5,) * len(ids), (), "stop", text)


def test_an_answer_with_a_tool_call_is_a_tool_calls_message(tokenizer):
    gen = parse_chat({"messages": [{"role": "user", "content": "1+2?"}], "tools": [ADD]},
                     tokenizer, _limits(tokenizer))
    said = 'On it.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    body = chat_response(gen, [_answer(tokenizer, said), _answer(tokenizer, "3")], tokenizer,
                         "m")
    first, second = body["choices"]
    assert first["finish_reason"] == "tool_calls" and first["message"]["content"] == "On it."
    call = first["message"]["tool_calls"][0]
    assert call["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    assert second["finish_reason"] == "stop" and second["message"] == {"role": "assistant",
                                                                        "content": "3"}


def test_a_streamed_tool_call_comes_as_a_tool_calls_delta(tokenizer):
    gen = parse_chat({"messages": [{"role": "user", "content": "1+2?"}], "tools": [ADD],
                      "stream": True}, tokenizer, _limits(tokenizer))
    said = 'On it. <tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    done = _answer(tokenizer, said)
    ids = done.token_ids
    streamer = Streamer(gen, tokenizer, "m")
    chunks = []
    for a in range(0, len(ids), 3):  # the engine's updates, 3 tokens each
        last = a + 3 >= len(ids)
        chunks += streamer.chunks(Update(0, ids[a:a + 3], (-0.5,) * len(ids[a:a + 3]), (),
                                         done if last else None))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    text = "".join(d.get("content", "") for d in deltas)
    assert text == "On it." and "<" not in text
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    assert len(calls) == 1 and calls[0]["index"] == 0
    assert calls[0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.fixture(scope="module")
def served_url(tmp_path_factory):
    """`vpo serve --policy hf:CHECKPOINT` of the BPE fixture with the Qwen2.5 tools template,
    under uvicorn on a free port → (base URL, limits)."""
    import shutil

    from tests.serve.test_serve import _args
    from vpo.cli.serve import build
    from vpo.serve.app import make_app, serving

    folder = tmp_path_factory.mktemp("ckpt") / "qwen_tools"
    shutil.copytree(BPE, folder)
    (folder / "chat_template.jinja").write_text(QWEN_TOOLS)
    engine, limits = build(_args("--policy", f"hf:{folder}", "--slots", "2", "--max-tokens",
                                 "8", "--max-prompt-tokens", "600", "--chunk", "8"))
    engine.start()
    with serving(make_app(engine, limits)) as port:
        yield f"http://127.0.0.1:{port}/v1", limits
    engine.close()


def test_a_tool_round_trip_with_the_openai_client(served_url):
    """The checkpoint's tool format is decided when it is loaded; tools in, an assistant tool
    call and a tool message in the history, streamed or not: 200 from the openai client."""
    openai = pytest.importorskip("openai")
    url, limits = served_url
    assert limits.tool_format is ToolFormat.HERMES
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "What is 1 + 2?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    r = client.chat.completions.create(model=limits.model, messages=messages, tools=[ADD],
                                       max_tokens=4, seed=0)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert r.model_extra["prompt_token_ids"] and choice.model_extra["token_ids"]
    stream = client.chat.completions.create(model=limits.model, messages=messages,
                                            tools=[ADD], max_tokens=4, seed=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == (choice.message.content or "")
    with pytest.raises(openai.UnprocessableEntityError, match="tool_choice"):
        client.chat.completions.create(model=limits.model, messages=messages, tools=[ADD],
                                       tool_choice="required", max_tokens=4)
    client.close()
