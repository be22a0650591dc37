#!/usr/bin/env python3
"""Renders chat-template fixtures with transformers itself (the oracle).

Writes tests/fixtures/chat_template/cases.json: a list of cases, each
  {"name", "template" (a file name in tests/fixtures/chat_template/),
   "messages" (list of message objects), "add_generation_prompt" (bool),
   "kwargs" (extra template variables: bos_token, eos_token, enable_thinking ...),
   and either "expected" (the exact rendered text) or "error" (the exception text)}.

Besides the two Qwen templates (required, exact), a few more MoE families' templates from
llama.cpp's models/templates (DeepSeek-V3.1, Kimi-K2, GLM-4.6, gpt-oss, MiniMax-M2,
Qwen3-Coder) are rendered on seeded random conversations with tools, reasoning and tool calls.
They are copied from --llama-templates DIR (llama.cpp's models/templates, e.g. inside the
llama-cpp-python sdist under vendor/llama.cpp/models/templates) when given, else the copies
already in tests/fixtures/chat_template/ are reused.

The rendering goes through transformers.utils.chat_template_utils.render_jinja_template,
which is what tokenizer.apply_chat_template calls: ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loopcontrols, raise_exception, strftime_now, namespace, and
messages normalised (None-valued keys dropped, reasoning fields aliased).

strftime_now() reads a fixed local time, FIXED_LOCAL_TIME, instead of the clock (gpt-oss's
template prints "Current date: ..."), and every case records it as "local_time", which the
C++ test injects: the fixtures, and the test, are the same on any day.

Usage: python3 scripts/gen_chat_cases.py [--llama-templates DIR]   (needs transformers, jinja2)
"""
import argparse
import json
import pathlib
import random
import shutil

import datetime

import transformers.utils.chat_template_utils as chat_template_utils
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "chat_template"
ASSETS = pathlib.Path("/tmp/assets")

FIXED_LOCAL_TIME = datetime.datetime(2025, 3, 14, 15, 9, 26)


class _FixedDatetime(datetime.datetime):
    """datetime whose now() is FIXED_LOCAL_TIME: what the template's strftime_now() sees."""

    @classmethod
    def now(cls, tz=None):
        return FIXED_LOCAL_TIME


# transformers' strftime_now calls `datetime.now()` through its module's global name.
chat_template_utils.datetime = _FixedDatetime

QWEN_TOKENS = {"eos_token": "<|im_end|>"}  # Qwen's tokenizer_config has bos_token null

# Other MoE families' templates (llama.cpp models/templates names), rendered on random conversations.
MOE_TEMPLATES = [
    "deepseek-ai-DeepSeek-V3.1.jinja",
    "moonshotai-Kimi-K2.jinja",
    "GLM-4.6.jinja",
    "openai-gpt-oss-120b.jinja",
    "MiniMax-M2.jinja",
    "Qwen3-Coder.jinja",
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name"}, "days": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}}, "unit": {"type": "string", "enum": ["C", "F"]}}}}}]

# Small templates that exercise constructs beyond the two Qwen templates; jinja2 is still the oracle.
EXTRA_TEMPLATES = {
    "constructs_loop.jinja": (
        "{%- for m in messages %}"
        "{{ loop.index }}/{{ loop.length }} {{ loop.revindex0 }} {{ m.role|upper }} {{ m['content']|trim|length }} "
        "[{{ m.content[:3] }}][{{ m.content[-2:] }}][{{ m.content[::-1] }}][{{ m.content[1:-1:2] }}]"
        "{% if not loop.last %}|{% endif %}\n"
        "{% endfor %}"
        "{%- for k, v in {'a': 1, 'b': [1, 2.5, none, true]}.items() %}{{ k }}={{ v }};{% endfor %}\n"
        "{%- for i in range(5) if i != 2 %}{% if i == 4 %}{% break %}{% endif %}{{ i }},{% endfor %}\n"
        "{%- for i in range(1, 8, 3) %}{% if loop.first %}{% continue %}{% endif %}{{ i }}{% else %}none{% endfor %}\n"
        "{%- for x in [] %}{{ x }}{% else %}empty{% endfor %}\n"
    ),
    "constructs_expr.jinja": (
        "{%- set ns = namespace(count=0, names=[]) %}\n"
        "{%- for m in messages %}{% set ns.count = ns.count + 1 %}{% endfor %}\n"
        "count={{ ns.count }} n={{ messages|length }}\n"
        "{{ 7 // 2 }} {{ 7 / 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ -3 + 1 }} {{ 1.5 * 2 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }}\n"
        "{{ 'a' ~ 1 ~ none ~ true }} {{ 'x' * 3 }} {{ [1, 2] + [3] }} {{ (1, 'b') }} {{ {'k': 'v', 'n': none} }}\n"
        "{{ 'ell' in 'hello' }} {{ 3 not in [1, 2] }} {{ 'a' in {'a': 1} }} {{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }}\n"
        "{{ 'yes' if messages|length > 1 else 'no' }} {{ none is none }} {{ undefined_thing is defined }} {{ 3 is odd }}"
        " {{ 'a' is string }} {{ 1 is number }} {{ [] is iterable }} {{ {} is mapping }} {{ true is boolean }}"
        " {{ 4 is divisibleby(2) }} {{ 4 is even }} {{ false is false }} {{ x is undefined }}\n"
        "{{ ' a b  c '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a-b-c'.split('-', 1) }} {{ 'xxhixx'.strip('x') }}"
        " {{ 'Hello'.replace('l', 'L') }} {{ 'hello world'.title() }} {{ 'ABC'.lower() }} {{ 'abc'.upper() }}"
        " {{ 'hello'.capitalize() }} {{ 'abc'.find('c') }} {{ 'a b'.startswith(('x', 'a')) }}\n"
        "{{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true)|join('-') }} {{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }}"
        " {{ 'abc'|list }} {{ [1, 2]|reverse|list }} {{ -5|abs }} {{ '42'|int + 1 }} {{ '2.5'|float }} {{ 3|string ~ 'x' }}"
        " {{ none|default('dflt') }} {{ missing|default('dflt2') }} {{ ''|default('e', true) }} {{ [1, 1, 2]|unique|list }}"
        " {{ {'b': 1, 'a': 2}|dictsort }} {{ 'hi'|replace('i', 'o') }} {{ [1, 2, 3]|sum }} {{ [4, 9]|max }} {{ [4, 9]|min }}"
        " {{ 2.567|round(2) }} {{ 2.5|round }} {{ 'x'|center(5) }}|\n"
        "{{ messages|map(attribute='role')|join(',') }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }}"
        " {{ messages|rejectattr('role', 'eq', 'user')|map(attribute='content')|list }}"
        " {{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('even')|list }} {{ messages[0]|tojson }}"
        " {{ {'a': [1, 'é', none, true, 1.5]}|tojson }} {{ {'a': 1, 'b': [2]}|tojson(indent=2) }}"
        " {{ 'caf\\u00e9 \\n \\x41'|tojson }} {{ {'a': 1}|items|list }}\n"
        "{{ messages[0].get('content') }} {{ messages[0].get('nope', 'fallback') }} {{ messages[0].keys()|list }}"
        " {{ messages[-1]['role'] }} {{ messages[0].nope }}|{{ (messages|first).role }} {{ bos_token }}{{ eos_token }}\n"
        "{%- set a, b = 1, 2 %} {{ a + b }}{% set block %}captured {{ a }}{% endset %} {{ block|upper }}\n"
        "{#- comment -#}\n"
        "{{ '{{ not a tag }}' }} {% raw %}{{ raw }} {% if %}{% endraw %} {{ \"dq\\\"s\" }} {{ 'it\\'s' }}\n"
    ),
    "constructs_whitespace.jinja": (
        "<s>\n"
        "{% for m in messages %}\n"
        "    {% if m.role == 'user' %}\n"
        "    U: {{ m.content }}\n"
        "    {% else %}\n"
        "    A: {{ m.content }}\n"
        "    {% endif %}\n"
        "{% endfor %}\n"
        "  {# a comment #}\n"
        "  x {% if true %}inline{% endif %} y\n"
        "  {%+ if true %}kept{% endif +%}\n"
        "  {{- ' stripped-left ' -}}  \n"
        "  {{ bos_token }} end {%- if add_generation_prompt %} GEN{% endif %}\n"
    ),
    "constructs_macro.jinja": (
        "{%- set greeting = 'Hi' %}\n"
        "{%- macro tag(name, body='', close=true) -%}\n"
        "  <{{ name }}>{{ body }}{% if close %}</{{ name }}>{% endif %}\n"
        "{%- endmacro %}\n"
        "{%- macro walk(x, depth=0) -%}\n"
        "  {%- if x is mapping -%}{ {%- for k, v in x.items() %}{{ k }}: {{ walk(v, depth + 1) }}"
        "{% if not loop.last %}, {% endif %}{% endfor -%} }\n"
        "  {%- elif x is sequence and x is not string -%}[{% for v in x %}{{ walk(v, depth + 1) }}{{ ',' if not loop.last }}"
        "{% endfor %}]@{{ depth }}\n"
        "  {%- else -%}{{ x }}{%- endif -%}\n"
        "{%- endmacro %}\n"
        "{%- macro greet(who) -%}{{ greeting }} {{ who }}{{ varargs|join('+') }}{{ kwargs|dictsort }}{%- endmacro %}\n"
        "{%- for m in messages %}{{ tag(m.role, m.content) }}{{ tag('br', close=false) }}\n{% endfor %}"
        "{%- set rendered = tag('b', body=messages|length) %}{{ rendered|upper }}\n"
        "{{ walk({'a': [1, {'b': none}], 'c': 'd'}) }}\n"
        "{{ greet('you', 1, 2, mood='ok') }}|{{ greet() }}|{{ tag }}\n"
    ),
    "raise_system.jinja": (
        "{%- if messages[0]['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}"
        "{%- endif %}"
        "{%- for message in messages %}"
        "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{%- endif %}"
        "{{ bos_token + '[' + message['role'] + '] ' + message['content'] | trim + eos_token }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}[assistant] {% endif %}"
    ),
}

# One-liners checked against jinja2 while building the interpreter; joined into one template.
MISC_SNIPPETS = [
    '{%- if true -%}\n  a  \n{%- endif -%}\nb',
    '  {% if true %}\n\tx\n  {% endif %}\n  y {# c #}\n\t{# c2 #}\nz\n',
    "{{- '  a  ' -}}  \n  b  {{ 'c' -}}\n  d",
    '{% raw -%}  {{x}}  {%- endraw %}|{%raw%}\n a{%endraw%}',
    '{{ \'\\u00e9\\t|\\\\n|\\x41\' }}{{ "a" \'b\' }}{{ \'it\'\'s\' }}',
    '{{ 1_000 }} {{ 1e3 }} {{ 3.0 // 2 }} {{ -7 % 3.0 }} {{ 2**0.5 }} {{ 10 / 4 }} {{ 1 / 3 }} {{ 1e100 }} {{ 123456789.0 * 1000 }} {{ true + 1 }} {{ -0.0 }} {{ 12345678901234567.0 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1.5e300 * 1e10 }}',
    "{% for x in messages %}{{ loop.previtem.role if loop.previtem is defined }}>{{ loop.nextitem['role'] if not loop.last else '-' }};{{ loop.revindex }}{% endfor %}",
    "{% for a, b in [[1,2],[3,4]] %}{{ a * b }},{% endfor %}{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}{{ {'x': 1}.items()|list }}",
    "{{ [1,2,3][1:] }} {{ 'héllo'[1] }} {{ 'héllo'[::-1] }} {{ 'héllo'[-10:2] }} {{ [1,2,3][::-2] }} {{ 'abc'[5:] }}|{{ [1,2][5] }}|",
    "{{ x if y }}|{{ 'a' if false }}|{{ none ~ '' }}|{{ 'abc' * 0 }}|{{ ' x '.strip() | length }}|{{ '%s' }}|{{ loop }}|{{ '0' is string and '0' }}|{{ [] | first }}|",
    '{% set ns = namespace(a=[], n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content|length %}{% set ns.a = ns.a + [m.role] %}{% endfor %}{{ ns.n }} {{ ns.a }}',
    '{{ messages[0][\'content\'] | tojson }} {{ messages | tojson }} {{ {\'a\': {\'b\': []}, \'c\': {}} | tojson(indent=2) }} {{ \'x\\u0001\\u007f\\"\' | tojson }}',
    "{{ 'b' > 'a' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2.5 }} {{ 'x' ~ 1.0 }} {{ a is not defined }} {{ none is not none }} {{ 1 in [1.0] }}",
    'a\n\n',
    '{% if messages %}\n{% for m in messages %}\n{{ m.role }}\n{% endfor %}\n{% endif %}\n',
    '{%- for m in messages %}{%- if loop.index0 == 0 %}{{ bos_token }}{% endif %}{{ m.content|trim }}{%- if not loop.last %}\n{% endif %}{% endfor %}',
    "{{ messages|map(attribute='content')|map('upper')|join('|') }} {{ messages|selectattr('role','in',['user'])|map(attribute='role')|list }} {{ messages|length is odd }}",
    "{{ 'a b c'.split(' ', 1) }} {{ 'a  b'.split(' ') }} {{ '  a b  '.rsplit(None, 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'abc'.replace('', '-') }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'hello world'.title() }} {{ 'x'.join(['a','b']) }}",
    "{{ ' \\u3000x\\xa0 '.strip() }}|{{ 'xyx'.lstrip('x') }}|{{ 'a\\nb\\n'.splitlines() }}|{{ 'ab'.endswith('b') }}|{{ 'ab'.startswith('') }}",
    "{{ 5|string|length }} {{ [3,1,2]|sort|first }} {{ ['b','A','a']|sort }} {{ ['b','A','a']|sort(case_sensitive=true) }} {{ {'b':1,'A':2}|dictsort }} {{ [1,'a']|string }}",
    "{{ 'x'|center(4) }}|{{ 'ab'|center(5) }}|{{ 'abc'|center(6) }}|{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'one two  three'|wordcount }}",
    "{{ 2.675|round(2) }} {{ 3.5|round }} {{ 4.5|round }} {{ 2.4|round(0, 'ceil') }} {{ -1.5|round }} {{ 42|float }} {{ 'x'|int }} {{ '3.9'|int }} {{ ' 7 '|int }}",
    '{% for i in range(3) %}{% for j in range(3) %}{% if j == 1 %}{% continue %}{% endif %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{{ j }} {% endfor %}{% endfor %}',
    "{{ messages[0].content.upper() }} {{ messages[-1].role|capitalize }} {{ (messages|last).content[:2] }} {{ messages[0].missing is none }} {{ messages[0].get('role') }}",
    '{% set x %}\n  a {{ 1 }}\n{% endset %}[{{ x }}]',
    "{{ 'a' if messages|length > 100 else 'b' if messages|length > 1 else 'c' }}",
    "{{ [1, 2, 3]|sum(start=10) }} {{ [1.5, 2]|sum }} {{ []|max }}| {{ ['a','B']|max }} {{ [1, 2, 2, 3]|unique|list }} {{ [[1], [2]]|map('first')|list }}",
    '{%- set tools = none %}{%- if tools is not none and tools|length > 0 %}T{% else %}N{% endif %}',
    '{% if messages[0].content is string %}S{% endif %}{% if messages is sequence %}Q{% endif %}{% if messages[0] is mapping %}M{% endif %}{% if 3 is integer %}I{% endif %}{% if 3.0 is float %}F{% endif %}{% if messages is iterable %}T{% endif %}',
]
EXTRA_TEMPLATES["constructs_misc.jinja"] = "\n---\n".join(MISC_SNIPPETS)


def random_conversations(seed, count):
    """Seeded random conversations mixing roles, <think> tags, tool responses and unicode."""
    rng = random.Random(seed)
    pieces = ["<think>", "</think>", "\n", "\n\n", " ", "hello", "é😊", "<tool_response>", "</tool_response>",
              "{{ x }}", "{%", "\t", "ß", "x"]

    def content():
        return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))

    convs = []
    for _ in range(count):
        msgs = []
        for _ in range(rng.randint(1, 6)):
            role = rng.choice(["system", "user", "user", "assistant", "assistant", "tool"])
            m = {"role": role, "content": content()}
            if role == "assistant" and rng.random() < 0.2:
                m["reasoning_content"] = rng.choice([content(), None])
            msgs.append(m)
        convs.append((msgs, rng.random() < 0.5))
    return convs


def rich_conversations(seed, count):
    """Seeded random conversations with reasoning_content, tool calls, tool results and tools."""
    rng = random.Random(seed)
    pieces = ["<think>", "</think>", "\n", "\n\n", " ", "hello", "é😊", "{{ x }}", "\t", "ß", "x"]

    def content():
        return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))

    convs = []
    for _ in range(count):
        msgs = []
        for k in range(rng.randint(1, 5)):
            role = rng.choice(["system", "user"]) if k == 0 else rng.choice(["user", "assistant", "assistant", "tool"])
            m = {"role": role, "content": content()}
            if role == "assistant" and rng.random() < 0.3:
                m["reasoning_content"] = content()
            if role == "assistant" and rng.random() < 0.25:
                args = rng.choice([{"city": "Paris", "days": 2}, '{"city": "Oslo"}'])
                m["tool_calls"] = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]
            if role == "tool":
                m.update(tool_call_id="call_1", name="get_weather")
            msgs.append(m)
        kwargs = {"bos_token": "<s>", "eos_token": "</s>"}
        if rng.random() < 0.3:
            kwargs["tools"] = TOOLS
        if rng.random() < 0.2:
            kwargs["enable_thinking"] = rng.random() < 0.5
        convs.append((msgs, rng.random() < 0.5, kwargs))
    return convs


U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731
S = lambda c: {"role": "system", "content": c}  # noqa: E731

COMMON_CONVERSATIONS = [
    ("single_user", [U("Hello!")]),
    ("system_user", [S("You are a helpful assistant."), U("What is 2+2?")]),
    ("multi_turn", [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke."), A("Why did the chicken cross the road?"), U("Why?")]),
    ("system_multi_turn", [S("Be brief."), U("Hi"), A("Hello."), U("Bye")]),
    ("unicode_emoji", [U("Héllo wörld 你好 🌍🚀 — naïve café"), A("¡Hola! 😊"), U("ñ ü ß ∑ 𝔘")]),
    ("empty_content", [U(""), A(""), U("")]),
    ("jinja_looking_text", [U("Render {{ x }} and {% if y %}z{% endif %} {# c #} literally"), A("{{ messages }}")]),
    ("multiline_content", [U("line1\nline2\n\n  indented\n"), A("\n\nanswer\n")]),
    ("second_system_midway", [U("Hi"), S("New instructions"), U("Go")]),
    ("ends_with_assistant", [U("Q"), A("A")]),
    ("whitespace_content", [U("   "), A(" \t\n")]),
]

QWEN3_EXTRA = [
    ("think_last_turn", [U("Solve 1+1"), A("<think>\nEasy: 1+1=2.\n</think>\n\nThe answer is 2.")]),
    ("think_earlier_turns_stripped", [U("Q1"), A("<think>\nreason one\n</think>\n\nanswer one"), U("Q2"), A("<think>reason two</think>answer two"), U("Q3")]),
    ("think_without_open_tag", [U("Q"), A("partial reasoning\n</think>\n\nfinal")]),
    ("reasoning_content_field", [U("Q1"), {"role": "assistant", "content": "A1", "reasoning_content": "R1"}, U("Q2"), {"role": "assistant", "content": "A2", "reasoning_content": "R2\n"}]),
    ("tool_response_user_turn", [U("weather?"), A("calling"), U("<tool_response>\nsunny\n</tool_response>")]),
    ("tool_role_messages", [U("weather?"), {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "22C"}, A("It is sunny.")]),
]

QWEN25_EXTRA = [
    ("think_text_kept", [U("Q"), A("<think>r</think>a"), U("Q2")]),
    ("tool_calls_and_tool_role", [U("weather?"), {"role": "assistant", "content": "Let me check.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "units": "C"}}}]}, {"role": "tool", "content": "sunny"}, A("Sunny.")]),
]


def render(template_text, messages, add_generation_prompt, kwargs):
    """Returns {"expected": text} or {"error": message, "error_type": jinja2 exception class}."""
    try:
        chat = _normalize_chat_messages(messages)
        rendered, _ = render_jinja_template(
            conversations=[chat], chat_template=template_text, add_generation_prompt=add_generation_prompt, **kwargs
        )
        return {"expected": rendered[0]}
    except Exception as e:  # noqa: BLE001 - the oracle's error is the expected value
        # TemplateError itself is what raise_exception throws: its text is the template's own.
        return {"error": str(e), "error_type": type(e).__name__}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-templates", type=pathlib.Path, help="llama.cpp models/templates directory")
    opts = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    templates = {}
    for src, name in (("Qwen-Qwen3-0.6B.jinja", "qwen3.jinja"), ("Qwen-Qwen2.5-7B-Instruct.jinja", "qwen2_5.jinja")):
        if (ASSETS / src).exists():
            shutil.copyfile(ASSETS / src, OUT / name)
        templates[name] = (OUT / name).read_text()
    for name in MOE_TEMPLATES:
        if opts.llama_templates and (opts.llama_templates / name).exists():
            shutil.copyfile(opts.llama_templates / name, OUT / name)
        if (OUT / name).exists():
            templates[name] = (OUT / name).read_text()
        else:
            print(f"warning: {name} not found; pass --llama-templates")
    for name, text in EXTRA_TEMPLATES.items():
        (OUT / name).write_text(text)
        templates[name] = text

    plan = []
    for conv_name, msgs in COMMON_CONVERSATIONS + QWEN3_EXTRA:
        for agp in (False, True):
            plan.append(("qwen3.jinja", f"{conv_name}_agp{int(agp)}", msgs, agp, dict(QWEN_TOKENS)))
    plan.append(("qwen3.jinja", "enable_thinking_false", [U("Hi")], True, dict(QWEN_TOKENS, enable_thinking=False)))
    plan.append(("qwen3.jinja", "enable_thinking_true", [U("Hi")], True, dict(QWEN_TOKENS, enable_thinking=True)))
    plan.append(("qwen3.jinja", "empty_messages", [], True, dict(QWEN_TOKENS)))
    for conv_name, msgs in COMMON_CONVERSATIONS + QWEN25_EXTRA:
        for agp in (False, True):
            plan.append(("qwen2_5.jinja", f"{conv_name}_agp{int(agp)}", msgs, agp, dict(QWEN_TOKENS)))
    for tname, seed in (("qwen3.jinja", 3), ("qwen2_5.jinja", 25)):
        for k, (msgs, agp) in enumerate(random_conversations(seed, 20)):
            plan.append((tname, f"random_{k}", msgs, agp, dict(QWEN_TOKENS)))
    for seed, tname in enumerate(MOE_TEMPLATES):
        if tname in templates:
            for k, (msgs, agp, kwargs) in enumerate(rich_conversations(100 + seed, 12)):
                plan.append((tname, f"random_{k}", msgs, agp, kwargs))
    llama_tokens = {"bos_token": "<s>", "eos_token": "</s>"}
    for tname in ("constructs_loop.jinja", "constructs_expr.jinja", "constructs_whitespace.jinja", "constructs_misc.jinja",
                  "constructs_macro.jinja"):
        for conv_name, msgs in (COMMON_CONVERSATIONS[1], COMMON_CONVERSATIONS[2], COMMON_CONVERSATIONS[4]):
            plan.append((tname, conv_name, msgs, tname.endswith("whitespace.jinja"), dict(llama_tokens)))
    plan.append(("raise_system.jinja", "alternating_ok", [U(" Hi "), A("Yo"), U("Q")], True, dict(llama_tokens)))
    plan.append(("raise_system.jinja", "system_raises", [S("sys"), U("Hi")], False, dict(llama_tokens)))
    plan.append(("raise_system.jinja", "not_alternating_raises", [U("a"), U("b")], False, dict(llama_tokens)))

    cases = []
    for tname, case_name, msgs, agp, kwargs in plan:
        cases.append({"name": f"{tname.removesuffix('.jinja')}/{case_name}", "template": tname, "messages": msgs,
                      "add_generation_prompt": agp, "kwargs": kwargs,
                      "local_time": FIXED_LOCAL_TIME.isoformat(), **render(templates[tname], msgs, agp, kwargs)})
    (OUT / "cases.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases to {OUT / 'cases.json'}")
    for c in cases:
        if "error" in c:
            print("  error case:", c["name"], "->", c["error_type"], c["error"][:80])


if __name__ == "__main__":
    main()
