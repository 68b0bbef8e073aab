"""Structured output through the real server and the official SDKs: JSON
schemas (response_format, the SDK's parse() helper, the Responses API's
text.format), vLLM's structured_outputs (choice, regex, grammar) and guided_*
fields, streaming, and the 400s for constraints that cannot be compiled.

test_schema_corpus drives every schema of tests/data/json_schemas (335 real
schemas from four projects) through the server and validates each finished
output with the `jsonschema` library."""
import concurrent.futures
import json
import pathlib
import re

import httpx
import jsonschema
import openai
import pydantic
import pytest

from conftest import API_KEY, MODEL_NAME

ROOT = pathlib.Path(__file__).resolve().parents[2]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0},
                   "pets": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a person as JSON."}]


def test_response_format_json_schema(openai_client):
    for temperature in (0, 0.9):
        r = openai_client.chat.completions.create(
            model=MODEL_NAME, messages=ASK, max_tokens=200, temperature=temperature, seed=7,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
        c = r.choices[0]
        assert c.finish_reason == "stop", c
        value = json.loads(c.message.content)
        jsonschema.validate(value, PERSON)
        # Properties come in the order the schema lists them.
        assert list(value) == ["name", "age", "pets"]


def test_sdk_parse_with_pydantic(openai_client):
    class City(pydantic.BaseModel):
        name: str
        country: str
        # A bound keeps the 135M model from writing digits until max_tokens.
        population: int = pydantic.Field(ge=0, le=99_000_000)

    r = openai_client.chat.completions.parse(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Tell me about Paris."}], max_tokens=120,
        temperature=0, response_format=City)
    city = r.choices[0].message.parsed
    assert isinstance(city, City)


def test_json_object_and_streaming(openai_client):
    kwargs = dict(model=MODEL_NAME, messages=ASK, max_tokens=120, temperature=0,
                  response_format={"type": "json_object"})
    full = openai_client.chat.completions.create(**kwargs)
    chunks = list(openai_client.chat.completions.create(stream=True, **kwargs))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    if full.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert text.lstrip().startswith("{")


def test_choice_regex_grammar(openai_client):
    r = openai_client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Is water wet?"}], max_tokens=10, temperature=0.8,
        n=4, seed=1, extra_body={"structured_outputs": {"choice": ["yes", "no", "it depends"]}})
    assert {c.message.content for c in r.choices} <= {"yes", "no", "it depends"}
    r = openai_client.completions.create(model=MODEL_NAME, prompt="Call me at", max_tokens=20, temperature=1.0, seed=3,
                                         extra_body={"guided_regex": r"\(\d{3}\) \d{3}-\d{4}"})
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", r.choices[0].text), r.choices[0].text
    grammar = 'root ::= "The answer is " digit+ "."\ndigit ::= [0-9]'
    r = openai_client.completions.create(model=MODEL_NAME, prompt="Q: 6 x 7?\nA:", max_tokens=20, temperature=0,
                                         extra_body={"structured_outputs": {"grammar": grammar}})
    assert re.fullmatch(r"The answer is [0-9]+\.", r.choices[0].text), r.choices[0].text


def test_responses_text_format(openai_client):
    r = openai_client.responses.create(
        model=MODEL_NAME, input="Describe a person.", max_output_tokens=200, temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), PERSON)


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
      "properties": {"a": {"$ref": "#/$defs/missing"}}}}}}, "response_format"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
    ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"guided_json": {"type": "object"}, "response_format": {"type": "json_object"}}, "guided_json"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
])
def test_bad_constraints_are_400(openai_client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=8, extra_body=extra)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param, e.value.body
    # The server is unharmed.
    r = openai_client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=4)
    assert r.choices[0].message.content is not None


def test_metrics(server, openai_client):
    """Compilations by result and masked rows are counted in /metrics."""
    before = server.metric("deepinfer:structured_output_masked_rows_total")
    openai_client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=5,
                                          extra_body={"structured_outputs": {"regex": "[a-z]{3,5}"}})
    assert server.metric("deepinfer:structured_output_masked_rows_total") > before
    assert server.metric("deepinfer:structured_output_compilations_total", result="compiled") >= 1
    invalid = server.metric("deepinfer:structured_output_compilations_total", result="invalid")
    with pytest.raises(openai.BadRequestError):
        openai_client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=5,
                                              extra_body={"structured_outputs": {"regex": "[unclosed"}})
    # The engine's figures are published after each step.
    openai_client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=2)
    assert server.metric("deepinfer:structured_output_compilations_total", result="invalid") == invalid + 1


# Keywords XGrammar accepts but does not enforce while generating (it warns
# and approximates: oneOf as anyOf, uniqueItems ignored, ...). An output may
# break only these; the test counts such outputs apart from the valid ones.
# minLength/maxLength are ignored next to a pattern.
UNENFORCED = {"uniqueItems", "oneOf", "not", "if", "then", "else", "dependencies", "dependentRequired",
              "dependentSchemas", "allOf", "propertyNames", "contains", "format", "minLength", "maxLength",
              "multipleOf"}


def test_schema_corpus(server):
    """Every schema of the corpus: compiled (or refused with a 400 that says
    why), and every output that finished validates against its schema, apart
    from keywords the grammar engine does not enforce (counted and reported)."""
    # split("\n"), not splitlines(): schemas hold raw U+2028 and friends inside strings.
    lines = (ROOT / "tests/data/json_schemas/schemas.jsonl").read_text(encoding="utf-8").split("\n")
    corpus = [json.loads(line) for line in lines if line.strip()]
    assert len(corpus) >= 200

    def run(entry):
        # Compact JSON (vLLM's disable_any_whitespace): with any whitespace
        # allowed, the 135M model spends its budget on blank space.
        body = {"model": MODEL_NAME, "max_tokens": 256, "temperature": 0,
                "messages": [{"role": "user", "content": "Write an example JSON document for this schema: "
                              + entry["id"].rsplit("/", 1)[-1]}],
                "structured_outputs": {"json": entry["schema"], "disable_any_whitespace": True}}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=900,
                       headers={"Authorization": f"Bearer {API_KEY}"})
        return entry, r

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        results = list(pool.map(run, corpus))
    rejected, truncated, valid, unenforced = {}, 0, 0, {}
    for entry, r in results:
        if r.status_code == 400:
            err = r.json()["error"]
            assert err["param"] == "structured_outputs" and err["message"], err
            rejected[entry["id"]] = err["message"].splitlines()[0][:160]
            continue
        assert r.status_code == 200, (entry["id"], r.text)
        choice = r.json()["choices"][0]
        if choice["finish_reason"] == "length":
            truncated += 1
            continue
        assert choice["finish_reason"] == "stop", (entry["id"], choice)
        value = json.loads(choice["message"]["content"])
        validator = jsonschema.validators.validator_for(entry["schema"])(entry["schema"])
        errors = list(validator.iter_errors(value))
        broken = {e.validator for e in errors}
        assert broken <= UNENFORCED, (entry["id"], [e.message for e in errors])
        if errors:
            unenforced[entry["id"]] = sorted(broken)
        else:
            valid += 1
    print(f"\nschema corpus: {len(corpus)} schemas, {valid} outputs valid, {len(unenforced)} valid but for "
          f"unenforced keywords, {truncated} cut by max_tokens, {len(rejected)} rejected at compile time")
    for sid, keywords in sorted(unenforced.items()):
        print(f"  unenforced {sid}: {', '.join(keywords)}")
    for sid, why in sorted(rejected.items()):
        print(f"  rejected {sid}: {why}")
    assert valid + len(unenforced) + truncated + len(rejected) == len(corpus)
    # Most schemas compile, and a third of the outputs (the 135M model loops
    # inside long strings on many) finish inside the token budget — every one
    # of them valid.
    assert len(rejected) <= len(corpus) // 4
    assert valid + len(unenforced) >= len(corpus) // 3


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "strict": True,
    "parameters": {"type": "object", "properties": {"timezone": {"enum": ["UTC", "CET", "PST"]}},
                   "required": ["timezone"], "additionalProperties": False}}}
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}


def test_tool_choice_named_and_required(openai_client):
    """A named function or "required" constrains the output to a call whose
    arguments satisfy the tool's schema — from a 135M model that on its own
    rarely calls tools at all."""
    ask = [{"role": "user", "content": "What should I wear in Oslo today?"}]
    for choice, expect in (({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
                           ("required", {"get_weather", "get_time"})):
        for temperature in (0, 1.0):
            r = openai_client.chat.completions.create(model=MODEL_NAME, messages=ask, tools=[WEATHER, TIME],
                                                      tool_choice=choice, max_tokens=80, temperature=temperature,
                                                      seed=2)
            c = r.choices[0]
            assert c.finish_reason == "tool_calls", c
            assert len(c.message.tool_calls) == 1
            call = c.message.tool_calls[0].function
            assert call.name in expect
            jsonschema.validate(json.loads(call.arguments), TOOL_SCHEMAS[call.name])
    # Streamed: the deltas reassemble into the same call.
    kwargs = dict(model=MODEL_NAME, messages=ask, tools=[WEATHER, TIME], tool_choice="required", max_tokens=80,
                  temperature=0)
    full = openai_client.chat.completions.create(**kwargs).choices[0].message.tool_calls[0].function
    name, args, finish = None, "", None
    for chunk in openai_client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            name = d.function.name or name
            args += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, json.loads(args), finish) == (full.name, json.loads(full.arguments), "tool_calls")


def test_tool_choice_auto_with_strict_tool(openai_client):
    """tool_choice "auto" and a strict tool: the model still chooses between
    text and a call, and its call (it makes one after the few-shot turns)
    has arguments valid for the schema."""
    from conftest import tool_call_shots
    strict = {"type": "function", "function": {
        "name": "get_weather", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"], "additionalProperties": False}}}
    r = openai_client.chat.completions.create(model=MODEL_NAME, messages=tool_call_shots("Tokyo"), tools=[strict],
                                              max_tokens=60, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    for call in c.message.tool_calls:
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), strict["function"]["parameters"])
    # Text stays possible.
    r = openai_client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Say hi."}],
                                              tools=[strict], max_tokens=10, temperature=0)
    assert r.choices[0].message.content


def test_tool_choice_conflicts_are_400(openai_client):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=[WEATHER], tool_choice="required",
                                              response_format={"type": "json_object"}, max_tokens=8)
    assert e.value.body["param"] == "tool_choice"


def test_anthropic_tool_choice(anthropic_client):
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in (WEATHER, TIME)]
    for choice, expect in (({"type": "tool", "name": "get_weather"}, {"get_weather"}),
                           ({"type": "any"}, {"get_weather", "get_time"})):
        m = anthropic_client.messages.create(model=MODEL_NAME, max_tokens=160, tools=tools, tool_choice=choice,
                                             messages=[{"role": "user", "content": "Plan my day in Rome."}])
        assert m.stop_reason == "tool_use", m
        uses = [b for b in m.content if b.type == "tool_use"]
        assert len(uses) == 1 and uses[0].name in expect
        jsonschema.validate(uses[0].input, TOOL_SCHEMAS[uses[0].name])
