#!/usr/bin/env python3
"""Reference data for the C++ chat-template renderer (tests/unit/jinja).

Renders conversations with the exact Jinja environment transformers uses in
apply_chat_template (ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True) + loopcontrols, its tojson / raise_exception / strftime_now /
namespace / dict), obtained from transformers itself, and writes
tests/data/chat_template/<family>.json (+ <family>.jinja for templates read from
model files) and snippets.json (small language-feature cases).

Messages are passed to the template as given (no transformers-side message
rewriting), with bos_token/eos_token from the model's config. strftime_now is
pinned to 2024-07-26 14:05:09 so the output is deterministic.

Sources: ../shared/tokenizers/<family>/tokenizer_config.json (gpt-oss ships no
chat template in that file, so it has no reference data), the tokenizer.chat_template
metadata of models/SmolLM2-135M-Instruct.Q4_1.gguf (read with the `gguf` package),
and hand-written templates in tests/data/chat_template/*.jinja (Llama 3.1-style
tools template with date handling, Mistral and Llama 2 styles with raise_exception,
and a synthetic feature template).

Usage: pip install transformers jinja2 gguf && python3 scripts/gen_chat_template_reference.py
"""
import copy
import datetime
import json
import os
import sys

import jinja2
from transformers.utils.chat_template_utils import _compile_jinja_template

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "tokenizers")
OUT = os.path.join(ROOT, "tests", "data", "chat_template")
FIXED_NOW = datetime.datetime(2024, 7, 26, 14, 5, 9)


def strftime_now(fmt):
    return FIXED_NOW.strftime(fmt)


def render(source, messages, tools, add_generation_prompt, extra, bos, eos):
    template = _compile_jinja_template(source)
    kwargs = dict(extra or {})
    return template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                           bos_token=bos, eos_token=eos, strftime_now=strftime_now, **kwargs)


def token_text(config, key):
    v = config.get(key)
    if isinstance(v, dict):
        return v.get("content", "")
    return v or ""


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — with \"quotes\" and ünïcode",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                       "required": ["query"]},
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]

TRICKY = "Literal {{ 1 + 1 }} and {% if true %}x{% endif %} and {# c #} and <|im_end|> <｜User｜> <end_of_turn> [INST]"
UNICODE = "Héllo wörld — 你好，世界 🌍👩‍👩‍👧 مرحبا שלום café (NFD: cafe\u0301) \u00a0nbsp"


def base_conversations():
    """(name, messages, extra) shared by all families."""
    return [
        ("single_user", [{"role": "user", "content": "Hello!"}], None),
        ("system_user", [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": "What is 2+2?"}], None),
        ("multi_turn", [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello! How can I help?"},
                        {"role": "user", "content": "Tell me a joke."}], None),
        ("no_system_multi", [{"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"},
                             {"role": "user", "content": "Three"}, {"role": "assistant", "content": "Four"}], None),
        ("unicode", [{"role": "user", "content": UNICODE}, {"role": "assistant", "content": "✓ " + UNICODE[::-1]},
                     {"role": "user", "content": "🙂"}], None),
        ("template_breaking", [{"role": "system", "content": TRICKY}, {"role": "user", "content": TRICKY},
                               {"role": "assistant", "content": "}}{{%}"}, {"role": "user", "content": "{%- raw %}"}],
         None),
        ("whitespace", [{"role": "user", "content": "  \n\tpadded question \n\n"},
                        {"role": "assistant", "content": "\n\nanswer with\nlines  \n"},
                        {"role": "user", "content": " "}], None),
        ("empty_content", [{"role": "user", "content": ""}], None),
        ("escapes", [{"role": "user", "content": "back\\slash \"dq\" 'sq' tab\there cr\r\nlf \u0001 \u007f"}], None),
        ("long", [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "word " * i}
                  for i in range(12)], None),
        ("json_content", [{"role": "user", "content": json.dumps({"a": [1, 2, {"b": None}], "c": "d"})}], None),
        ("extra_keys", [{"role": "user", "content": "Hi", "name": "bob", "id": 7}], None),
    ]


def tool_conversations(args_as_string, content_none):
    def args(d):
        return json.dumps(d, ensure_ascii=False) if args_as_string else d

    call_content = None if content_none else ""
    return [
        ("tools_user", [{"role": "system", "content": "You can call tools."},
                        {"role": "user", "content": "Weather in Paris?"}], TOOLS, None),
        ("tools_no_system", [{"role": "user", "content": "Weather in Paris?"}], [WEATHER_TOOL], None),
        ("tool_call_roundtrip", [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": call_content, "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": args({"city": "Paris", "unit": "celsius"})}}]},
            {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
            {"role": "assistant", "content": "It is 21°C and clear in Paris."},
            {"role": "user", "content": "Thanks!"}], TOOLS, None),
        ("parallel_tool_calls", [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": call_content, "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": args({"city": "Paris"})}},
                {"type": "function", "function": {"name": "get_weather", "arguments": args({"city": "Rome"})}}]},
            {"role": "tool", "content": "21"},
            {"role": "tool", "content": "25"}], TOOLS, None),
    ]


def family_cases(family):
    cases = []
    for name, messages, extra in base_conversations():
        cases.append((name, messages, None, extra))
    if family == "deepseek_v3":
        cases += tool_conversations(args_as_string=True, content_none=True)
    elif family in ("qwen3", "features"):
        cases += tool_conversations(args_as_string=False, content_none=False)
        cases += [
            ("think_in_content", [{"role": "user", "content": "2+2?"},
                                  {"role": "assistant", "content": "<think>\nsimple\n</think>\n\n4"},
                                  {"role": "user", "content": "3+3?"},
                                  {"role": "assistant", "content": "<think>add</think>6"}], None, None),
            ("reasoning_field", [{"role": "user", "content": "Why?"},
                                 {"role": "assistant", "content": "Because.", "reasoning_content": "Let me think."}],
             None, None),
            ("enable_thinking_false", [{"role": "user", "content": "Quick answer"}], None, {"enable_thinking": False}),
            ("enable_thinking_true", [{"role": "user", "content": "Slow answer"}], None, {"enable_thinking": True}),
            ("tool_response_user", [{"role": "user", "content": "<tool_response>x</tool_response>"},
                                    {"role": "assistant", "content": "<think>t</think>ok"}], None, None),
            ("tool_call_string_args", [
                {"role": "user", "content": "Search"},
                {"role": "assistant", "content": "Calling.", "tool_calls": [
                    {"type": "function", "function": {"name": "search", "arguments": "{\"query\": \"x\"}"}}]},
                {"role": "tool", "content": "result"}], TOOLS, None),
        ]
    elif family == "llama3_tools":
        cases += [c for c in tool_conversations(args_as_string=False, content_none=False)
                  if c[0] != "parallel_tool_calls"]
        cases += [
            ("parallel_calls_rejected", tool_conversations(False, False)[3][1], TOOLS, None),
            ("tools_in_system", [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Q"}], TOOLS,
             {"tools_in_user_message": False}),
            ("builtin_tools", [{"role": "user", "content": "Search it"},
                               {"role": "assistant", "tool_calls": [{"type": "function", "function": {
                                   "name": "brave_search", "arguments": {"query": "jinja"}}}]},
                               {"role": "ipython", "content": {"results": ["a", "b"]}}],
             None, {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}),
            ("date_string", [{"role": "user", "content": "Date?"}], None, {"date_string": "01 Jan 2030"}),
            ("tools_without_user", [{"role": "system", "content": "only system"}], TOOLS, None),
        ]
    elif family == "gemma3":
        cases += [
            ("content_parts", [{"role": "system", "content": [{"type": "text", "text": "System as parts"}]},
                               {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  What is this?  "}]}],
             None, None),
            ("roles_not_alternating", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], None, None),
            ("assistant_first", [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}], None, None),
            ("invalid_content_type", [{"role": "user", "content": 42}], None, None),
        ]
    elif family in ("mistral", "llama2"):
        cases += [
            ("roles_not_alternating", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], None, None),
            ("assistant_first", [{"role": "assistant", "content": "a"}], None, None),
            ("tool_role", [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}], None, None),
        ]
    return cases


def build(family, source, bos, eos, drop_cases=()):
    out_cases = []
    for name, messages, tools, extra in family_cases(family):
        if name in drop_cases:
            continue
        for agp in (True, False):
            case = {"name": f"{name}/{'gen' if agp else 'nogen'}", "messages": messages, "tools": tools,
                    "add_generation_prompt": agp, "extra": extra}
            try:
                case["expected"] = render(source, copy.deepcopy(messages), copy.deepcopy(tools), agp, extra, bos, eos)
            except jinja2.exceptions.TemplateError as e:
                # raise_exception raises TemplateError itself; other failures are subclasses.
                case["error"] = str(e)
                case["raised"] = type(e) is jinja2.exceptions.TemplateError
            except Exception as e:  # noqa: BLE001 - template misuse such as None + str
                case["error"] = f"{type(e).__name__}: {e}"
                case["raised"] = False
            out_cases.append(case)
    return {"family": family, "bos_token": bos, "eos_token": eos, "now": FIXED_NOW.isoformat(), "cases": out_cases}


def write_json(path, data):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")


def gguf_template(path):
    """(template, bos_token, eos_token) from a GGUF file's tokenizer metadata."""
    from gguf import GGUFReader
    reader = GGUFReader(path)

    def scalar(key):
        field = reader.fields[key]
        return field.parts[field.data[0]]

    tokens = reader.fields["tokenizer.ggml.tokens"]
    def token(i):
        return bytes(tokens.parts[tokens.data[int(i)]]).decode("utf-8")

    template = bytes(scalar("tokenizer.chat_template")).decode("utf-8")
    return (template, token(scalar("tokenizer.ggml.bos_token_id")[0]),
            token(scalar("tokenizer.ggml.eos_token_id")[0]))


def main():
    families = {}
    for family in ("deepseek_v3", "qwen3", "llama3_1", "gemma3", "gptoss"):
        with open(os.path.join(SHARED, family, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        source = config.get("chat_template")
        if source is None:
            print(f"{family}: no chat_template in tokenizer_config.json (skipped)", file=sys.stderr)
            continue
        with open(os.path.join(OUT, f"{family}.jinja"), "w", encoding="utf-8") as f:
            f.write(source)
        families[family] = (source, token_text(config, "bos_token"), token_text(config, "eos_token"))
    smol, smol_bos, smol_eos = gguf_template(os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    with open(os.path.join(OUT, "smollm2.jinja"), "w", encoding="utf-8") as f:
        f.write(smol)
    families["smollm2"] = (smol, smol_bos, smol_eos)
    for family, bos, eos in (("llama3_tools", "<|begin_of_text|>", "<|eot_id|>"), ("mistral", "<s>", "</s>"),
                             ("llama2", "<s>", "</s>"), ("features", "<BOS>", "<EOS>")):
        with open(os.path.join(OUT, f"{family}.jinja"), encoding="utf-8") as f:
            families[family] = (f.read(), bos, eos)
    for family, (source, bos, eos) in families.items():
        data = build(family, source, bos, eos)
        write_json(os.path.join(OUT, f"{family}.json"), data)
        n_err = sum("error" in c for c in data["cases"])
        print(f"{family}: {len(data['cases'])} cases ({n_err} errors)", file=sys.stderr)
    write_json(os.path.join(OUT, "snippets.json"), build_snippets())


def build_snippets():
    out = []
    for source, context in SNIPPETS:
        item = {"template": source, "context": context}
        try:
            item["expected"] = _compile_jinja_template(source).render(strftime_now=strftime_now, **context)
        except Exception as e:  # noqa: BLE001
            item["error"] = f"{type(e).__name__}: {e}"
        out.append(item)
    print(f"snippets: {len(out)} ({sum('error' in s for s in out)} errors)", file=sys.stderr)
    return out


# (template, context) pairs covering the language features one by one.
SNIPPETS = [
    # literals and printing (Python str/repr)
    ("{{ 1 }} {{ -3 }} {{ 1.0 }} {{ 2.5e-7 }} {{ 1e16 }} {{ 123456789.125 }} {{ 0.1 + 0.2 }}", {}),
    ("{{ true }} {{ False }} {{ none }} {{ None }} {{ 'a\\tb\\n' }} {{ \"q'uote\" }}", {}),
    ("{{ [1, 'a', none, true, 1.5, [2], {'k': \"it's\"}] }} {{ (1,) }} {{ (1, 'x') }} {{ {} }} {{ [] }}", {}),
    ("{{ 'abc' 'def' }} {{ '\\u00e9\\x41' }} {{ \"\\\\\" }}", {}),
    # arithmetic and operators
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", {}),
    ("{{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ 'a' ~ 1 ~ none ~ true }} {{ [1] + [2] }}", {}),
    ("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 'b' in 'abc' }} {{ 2 not in [1, 3] }} {{ 'k' in {'k': 1} }}", {}),
    ("{{ not true }} {{ true and 'x' }} {{ 0 or 'y' }} {{ none or [] }} {{ 'a' if false }}|{{ 'a' if 1 else 'b' }}", {}),
    ("{{ -x | abs }} {{ x | abs }} {{ -(3) }}", {"x": -4}),
    # attribute / item access, slices
    ("{{ d.a }} {{ d['b'][1] }} {{ d.b[-1] }} {{ l[1:] }} {{ l[::-1] }} {{ l[:-1] }} {{ l[::2] }} {{ s[1:3] }} {{ s[::-1] }} {{ s[0] }}",
     {"d": {"a": 1, "b": [1, 2, 3]}, "l": [1, 2, 3, 4], "s": "héllo"}),
    ("{{ d.missing }}|{{ d.missing is defined }}|{{ l[10] is undefined }}|{{ d.items is defined }}", {"d": {}, "l": []}),
    ("{{ missing.attr }}", {}),
    ("{{ missing() }}", {}),
    ("{{ 1 + missing }}", {}),
    ("{% for x in missing %}x{% else %}empty{% endfor %} {{ missing | length }} {{ missing | default('dflt') }}", {}),
    # statements
    ("{% set a = 1 %}{% set b, c = [2, 3] %}{{ a }}{{ b }}{{ c }}{% set t = 1, 2 %}{{ t }}", {}),
    ("{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]{% set y | upper %}up{% endset %}{{ y }}", {}),
    ("{% if a %}A{% elif b %}B{% else %}C{% endif %}", {"a": 0, "b": "yes"}),
    ("{% for i in range(3) %}{{ i }}{% endfor %} {% for i in range(1, 10, 3) %}{{ i }}{% endfor %} {% for i in range(5, 0, -2) %}{{ i }}{% endfor %}", {}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {% for k in d %}{{ k }}{% endfor %} {% for c in 'ab' %}{{ c }}.{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("{% for x in xs if x is odd %}{{ loop.index }}:{{ x }}/{{ loop.length }}{% if not loop.last %},{% endif %}{% endfor %}", {"xs": [1, 2, 3, 4, 5]}),
    ("{% for x in xs %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a','b','c') }} {% endfor %}", {"xs": [10, 20, 30]}),
    ("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {"xs": [1, 2, 3, 4, 5]}),
    ("{% for row in rows %}{% for c in row %}{{ loop.index }}{% endfor %}|{{ loop.index }} {% endfor %}", {"rows": [[1, 2], [3]]}),
    ("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", {}),
    ("{% set ns = namespace(x=1, l=[]) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}", {}),
    ("{% macro m(a, b='B', c=none) %}<{{ a }}|{{ b }}|{{ c }}>{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m('x', b='y', c='z') }}", {}),
    ("{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}", {}),
    ("{% filter upper %}hello {{ name }}{% endfilter %}", {"name": "bob"}),
    ("{% raw %}{{ not rendered }}{% endraw %}", {}),
    ("{{ raise_exception('custom failure: ' ~ 42) }}", {}),
    ("{{ strftime_now('%Y-%m-%d %H:%M:%S %d %b %Y %A') }}", {}),
    # whitespace control
    ("a  {{- ' b ' -}}  c\n  {%- if true %}  d  {% endif -%}\n e", {}),
    ("line1\n    {% if true %}\n    inner\n    {% endif %}\nline2\n", {}),
    ("  {%+ if true %}x{% endif %}\n{% if true +%}\ny{% endif %}", {}),
    ("{# comment #}\n  {# indented comment #}\nz", {}),
    ("a\r\nb\rc {{ 'x' }}\n", {}),
    # filters
    ("{{ 'Hello World' | lower }} {{ 'hi there' | upper }} {{ 'hello wORLD' | title }} {{ 'hELLO' | capitalize }} {{ '  pad  ' | trim }}|{{ 'xxhixx' | trim('x') }}", {}),
    ("{{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ [1, 2, 3] | join(', ') }} {{ 'abc' | join('.') }} {{ xs | join('/', attribute='n') }}", {"xs": [{"n": "p"}, {"n": "q"}]}),
    ("{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }} {{ [3, 1, 2] | sort(reverse=true) }} {{ xs | sort(attribute='k') | map(attribute='k') | list }}", {"xs": [{"k": 2}, {"k": 1}]}),
    ("{{ [1, 2, 2, 'a', 'A'] | unique | list }} {{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }} {{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'xyz' | first }}", {}),
    ("{{ [1, 2, 3, 4] | select('even') | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ [1, 5, 10] | select('gt', 3) | list }} {{ [1, 2] | select('in', [2, 3]) | list }}", {}),
    ("{{ xs | selectattr('a') | list }} {{ xs | rejectattr('a') | list }} {{ xs | selectattr('a', 'equalto', 2) | list }} {{ xs | map(attribute='a') | list }} {{ xs | map(attribute='b', default='D') | list }}", {"xs": [{"a": 1}, {"a": 0}, {"a": 2}]}),
    ("{{ ['a', 'b'] | map('upper') | list }} {{ [1.5, 2.5] | map('round') | list }} {{ [' a', 'b '] | map('trim') | join }}", {}),
    ("{{ d | tojson }} {{ d | tojson(indent=2) }} {{ d | tojson(sort_keys=true) }} {{ 'é\"\\n</script>' | tojson }} {{ [] | tojson(indent=2) }} {{ {} | tojson }}", {"d": {"b": [1, 2.0, None, True], "a": {"x": "ü"}}}),
    ("{{ d | tojson(separators=(',', ':')) }} {{ d | tojson(ensure_ascii=true) }} {{ d | tojson(indent='\t') }}", {"d": {"k": ["é", "😀"]}}),
    ("{{ '42' | int }} {{ '3.7' | int }} {{ 'x' | int }} {{ 'x' | int(5) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 'y' | float }} {{ 3 | float }} {{ 5 | string }} {{ none | string }}", {}),
    ("{{ 2.5 | round }} {{ 3.5 | round }} {{ 3.14159 | round(2) }} {{ 3.1 | round(0, 'ceil') }} {{ 3.9 | round(method='floor') }} {{ -2 | abs }} {{ 5 | round }}", {}),
    ("{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(width=3, blank=true) }}", {}),
    ("{{ [1, 2, 3] | length }} {{ 'héllo' | length }} {{ {'a': 1} | count }} {{ 'one two  three' | wordcount }} {{ [1, 2, 3] | sum }} {{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }}", {}),
    ("{{ d | items | list }} {{ d | dictsort }} {{ d | list }} {{ none | default('n') }} {{ '' | default('e', true) }} {{ 0 | d(5) }}", {"d": {"b": 1, "a": 2}}),
    ("{{ s | e }} {{ '<b>' | escape }} {{ '<i>' | safe }}", {"s": "<a href=\"x\">&'</a>"}),
    ("{{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ [1, 2, 3] | batch(2, 0) | list }} {{ '%s-%s' | format('a', 1) }} {{ 'x' | attr('upper') is defined }}", {}),
    # tests
    ("{{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }} {{ true is number }} {{ 'a' is string }} {{ [] is sequence }} {{ {} is mapping }} {{ 'a' is iterable }} {{ 3 is iterable }}", {}),
    ("{{ none is none }} {{ 1 is none }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }}", {}),
    ("{{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 2 is gt 1 }} {{ 'a' is in 'abc' }} {{ 1 is not in [1] }} {{ x is defined }} {{ y is undefined }} {{ 'abc' is lower }} {{ x is sameas none }}", {"x": None}),
    # string methods
    ("{{ ' a b '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a\n\n'.rstrip('\n') }}|{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }}", {}),
    ("{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }} {{ 'hello'.replace('l', 'L') }} {{ 'hello'.upper() }} {{ 'HeLLo'.lower() }} {{ 'hi there'.title() }} {{ 'hELLO'.capitalize() }}", {}),
    ("{{ 'hello'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }} {{ ', '.join(['a', 'b']) }} {{ '{} and {}'.format(1, 'x') }} {{ '{name}!'.format(name='n') }} {{ 'a\nb'.splitlines() }} {{ '12'.isdigit() }}", {}),
    ("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }}", {"d": {"a": 1, "b": 2}}),
    ("{{ [1, 2, 3].index(2) }} {{ [1, 1, 2].count(1) }} {{ (1, 2) | list }}", {}),
    # errors
    ("{{ 1 + 'a' }}", {}),
    ("{{ 'a' < 1 }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ [1, 2] | nosuchfilter }}", {}),
    ("{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("{% set x = 1 %}{% set x.attr = 2 %}", {}),
    ("{% include 'other.html' %}", {}),
    ("{% if true %}unclosed", {}),
    ("{{ 'unterminated }}", {}),
    ("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", {}),
]


if __name__ == "__main__":
    main()
