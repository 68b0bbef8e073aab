"""Anthropic SDK against the real server: messages, streaming events, count_tokens, errors."""
import anthropic
import httpx
import pytest

from conftest import API_KEY, MODEL_NAME, tool_call_shots

MESSAGES = [{"role": "user", "content": "Name a colour."}]


def test_messages(anthropic_client):
    m = anthropic_client.messages.create(model=MODEL_NAME, max_tokens=6, messages=MESSAGES, extra_body={"temperature": 0},
                                         system="You are terse.")
    assert m.type == "message" and m.role == "assistant"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert 0 < m.usage.output_tokens <= 6
    with anthropic_client.messages.stream(model=MODEL_NAME, max_tokens=6, messages=MESSAGES, extra_body={"temperature": 0},
                                          system="You are terse.") as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == m.content[0].text
    assert final.stop_reason == m.stop_reason
    assert final.usage.output_tokens == m.usage.output_tokens


def test_stream_event_order(server):
    h = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
    body = {"model": MODEL_NAME, "max_tokens": 3, "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, headers=h, timeout=60) as r:
        events = [line[len("event: "):] for line in r.iter_lines() if line.startswith("event: ")]
    assert events[0] == "message_start"
    assert events[-2:] == ["message_delta", "message_stop"]
    assert "content_block_start" in events and "content_block_delta" in events
    assert events.index("content_block_stop") > events.index("content_block_delta")


def test_tools_and_tool_results(anthropic_client):
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]
    m = anthropic_client.messages.create(model=MODEL_NAME, max_tokens=4, messages=msgs, tools=tools)
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_tool_use(anthropic_client):
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    kw = dict(model=MODEL_NAME, max_tokens=40, messages=tool_call_shots("London"), tools=tools,
              extra_body={"temperature": 0})
    m = anthropic_client.messages.create(**kw)
    assert m.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in m.content] == [("tool_use", "get_weather", {"city": "London"})]
    assert m.content[0].id.startswith("toolu_")
    # The SDK rebuilds the input from the streamed input_json_delta events.
    with anthropic_client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in final.content] == [("tool_use", "get_weather", {"city": "London"})]


def test_count_tokens(anthropic_client):
    n = anthropic_client.messages.count_tokens(model=MODEL_NAME, messages=MESSAGES)
    assert n.input_tokens > 0


def test_errors(server, anthropic_client):
    with pytest.raises(anthropic.BadRequestError) as e:
        anthropic_client.messages.create(model=MODEL_NAME, max_tokens=0, messages=MESSAGES)
    assert e.value.status_code == 400
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/v1/messages", json={"model": MODEL_NAME, "messages": MESSAGES},
                   headers={"x-api-key": API_KEY})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    bad = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model=MODEL_NAME, max_tokens=2, messages=MESSAGES)
