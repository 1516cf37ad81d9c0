"""Decision-model templates rendered by llama.cpp's own Jinja engine (what its server prompts a
decision model with) and by onepass: the same text, but for how each prints a JSON float.

The engine is built from the llama.cpp source of the llama-cpp-python release onepass runs
(bench/native_template.py; downloaded once from the package index, compiled once, both kept in the cache folder)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.answering.decision import DecisionPrompter
from app.wire.contract import SystemOneRequest
from bench.native_template import (
    build_renderer,
    compare,
    compiler,
    eval_requests,
    open_prompter,
    release_source,
    release_version,
)
from tests.support.decision_cases import QUESTION_FIRST, QUESTIONS, TEMPLATES, decision_gguf, decision_prompter, serve
from tests.support.skip_groups import skip
from tests.support.tiny_decision import BUILDERS

RENDERED_BY_THE_TEMPLATE = ("kev", "lfm2-d1")  # the causal types whose converters' templates are rendered as is

STATES: list[Any] = [
    "My refund never came. Order #5521, 3 days ago.",
    'Quotes "inside", a back\\slash, a tab\tand lines\nof text, non-ASCII: café, 東京, emoji 🙂',
    "Separators a JSON line may hold as they are: U+2028 \u2028, U+0085 \x85, U+001F \x1f.",
    {"ticket": "My refund never came.", "plan": "Pro", "paid": True, "refund": None, "items": [1, 2, {"n": -3}]},
    ["a list", {"nested": {"deeper": ["x", False]}}, 0, 8.5, 0.25],
    {"price": 19.99, "tax": 0.1, "total": 21.989, "name": "Zoë", "city": "東京"},
]
# Written the way published chat templates often are: whitespace control, indented tags, filters.
STYLED = """{%- set heading = 'Decide about the text.' -%}
<|im_start|>system
{{ heading }}<|im_end|>
<|im_start|>user
{% if state is string -%}
    {{ state | trim }}
{%- else -%}
    {{ state | tojson(indent=2) }}
{%- endif %}

Question ({{ type | upper }}, {{ options | length }} options): {{ instructions \
if instructions is string else instructions | tojson }}
    {% for o in options %}
    {{ o.label }}) {{ o.key }}{% if o.description is not none %} - {{ o.description \
if o.description is string else o.description | tojson }}{% endif %}{% if loop.last %}.{% endif %}

    {% endfor %}
<|im_end|>
<|im_start|>assistant
"""


@pytest.fixture(scope="module")
def renderer() -> Path:
    if compiler() is None:
        skip(
            "native-template", "no C++ compiler (c++, g++ or clang++; or set CXX) to build llama.cpp's template engine"
        )
    try:
        source = release_source(release_version())
    except (OSError, RuntimeError) as error:  # no network, or no such sdist on the index
        skip("native-template", f"the llama-cpp-python {release_version()} sdist could not be downloaded: {error}")
    return build_renderer(source)


@pytest.fixture(scope="module")
def prompters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, DecisionPrompter]]:
    folder = tmp_path_factory.mktemp("native")
    services = {kind: serve(decision_gguf(folder, kind, template)) for kind, template in TEMPLATES.items()}
    (folder / "styled").mkdir()
    services["styled"] = serve(decision_gguf(folder / "styled", "nimble", STYLED))
    (folder / "question-first").mkdir()
    services["question-first"] = serve(decision_gguf(folder / "question-first", "pplx-decider", QUESTION_FIRST))
    for kind in RENDERED_BY_THE_TEMPLATE:
        services[kind] = serve(BUILDERS[kind](folder / f"tiny-{kind}.gguf"))
    yield {kind: decision_prompter(service) for kind, service in services.items()}
    for service in services.values():
        service.close()


def requests(states: list[Any]) -> list[SystemOneRequest]:
    return [SystemOneRequest.model_validate({"model": "m", "state": s, "questions": QUESTIONS}) for s in states]


@pytest.mark.parametrize("kind", [*TEMPLATES, "question-first", "styled", *RENDERED_BY_THE_TEMPLATE])
def test_every_types_template_renders_alike_in_both_engines(
    renderer: Path, prompters: dict[str, DecisionPrompter], kind: str
) -> None:
    """Strings, JSON values of every kind (ints, floats both print alike, booleans, null, nesting),
    option descriptions as text, null and JSON; lev's sorted keys and both orders; nimble's list of
    every question; kev's text values; lfm2-d1's labels and `tojson(indent=2)`. (laya, lfm2-d1-omni
    and clef cut their prompts after rendering: tests/test_native_server.py compares them end to end.)"""
    rendered, differences = compare(prompters[kind], renderer, requests(STATES))
    assert rendered == len(STATES) * (len(QUESTIONS) + (kind == "lev"))
    assert differences == [], differences[0]


def test_llama_cpp_prints_a_json_float_with_six_significant_digits(
    renderer: Path, prompters: dict[str, DecisionPrompter]
) -> None:
    """llama.cpp's engine writes a float as C++ streams do by default (%g): 19.0 as 19 and pi as
    3.14159. onepass passes the number the request spelled. Should a later llama.cpp print floats
    exactly, this fails and docs/decision-models.md should say the two agree."""
    rendered, differences = compare(
        prompters["openjev"], renderer, requests([{"total": 19.0, "pi": 3.141592653589793}])
    )
    assert rendered == len(QUESTIONS) and len(differences) == rendered
    for difference in differences:
        assert '{"total": 19.0, "pi": 3.141592653589793}' in difference.ours
        assert '{"total": 19, "pi": 3.14159}' in difference.theirs
        assert difference.theirs == difference.ours.replace("19.0", "19").replace("3.141592653589793", "3.14159")


def test_llama_cpp_trims_ascii_whitespace_only(renderer: Path, prompters: dict[str, DecisionPrompter]) -> None:
    """Jinja's `trim` is Python's str.strip (every Unicode space); llama.cpp's strips ASCII
    whitespace only, so a state that ends in an ideographic space renders otherwise in a template
    that trims it. onepass keeps Jinja's meaning; should llama.cpp change, this fails."""
    prompter = prompters["styled"]  # trims a string state
    _, differences = compare(prompter, renderer, requests(["Ticket text\u3000"]))
    assert differences and all(
        "Ticket text\u3000" in d.theirs and "Ticket text\u3000" not in d.ours for d in differences
    )
    assert not compare(prompter, renderer, requests(["Ticket text \t\n"]))[1]  # ASCII: alike


def floats(value: Any) -> Iterator[float]:
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from floats(item)
    elif isinstance(value, list):
        for item in value:
            yield from floats(item)


@pytest.mark.real_model
def test_the_converted_default_model_is_prompted_alike_by_llama_cpp(renderer: Path, real_model_path: Path) -> None:
    """make model-decision's file, over every tests/eval item: only prompts whose state holds a float
    that %g prints otherwise than JSON does differ, and only there."""
    decision = real_model_path.with_name(real_model_path.stem + "-decision.gguf")
    if not decision.is_file():
        pytest.fail(f"{decision} is missing: run `make model-decision` (make test does)")
    engine, prompter = open_prompter(decision)
    every = eval_requests()
    try:
        rendered, differences = compare(prompter, renderer, every)
    finally:
        engine.close()
    assert rendered == len(every)
    printed_otherwise = {
        qid
        for request in every
        for qid in request.questions
        if any(json.dumps(f) != format(f, "g") for f in floats(request.state))
    }
    assert {d.where.split(", ")[1] for d in differences} == printed_otherwise
    assert 0 < len(printed_otherwise) < 10
