"""A small set of checks on the real default model (Qwen2.5-Coder-1.5B-Instruct Q4_K_M)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.answering.service import ModelService, distinct_suffixes
from app.calibration import softmax
from app.config_sources import DEFAULT_CONFIG_PATH, load_settings
from app.engine.disk_tier import DiskTier
from app.engine.engine import SuffixTokens
from app.engine.ram_tier import RamTier
from app.engine.snapshot_file import SnapshotIdentity
from app.serving.loading import assemble, load_spec
from app.serving.specs import read_models_config
from app.wire.contract import SystemOneRequest, render_state
from tests.support.llama_calls import LlamaCalls
from tests.support.loading import load_model, own_prompter
from tests.support.settings import isolated_settings

pytestmark = pytest.mark.real_model

TICKET = "I was charged twice for March and want my money back. This is the third time!"


def ask(service: ModelService, state: Any, questions: dict[str, Any]) -> dict[str, Any]:
    request = SystemOneRequest.model_validate({"model": "jev-latest", "state": state, "questions": questions})
    return service.answer(request).wire()


def noul(text: str) -> dict[str, Any]:
    return {"type": "noul", "instructions": text}


OBVIOUS: list[Any] = [
    (TICKET, noul("Does the customer ask for money back?"), True),
    (TICKET, noul("Is the customer praising the company?"), False),
    ("The meeting moved to Friday at 3pm.", noul("Is the meeting on Friday?"), True),
    ("The meeting moved to Friday at 3pm.", noul("Is the meeting on Monday?"), False),
    ({"order": 1234, "status": "delivered"}, noul("Has the order been delivered?"), True),
    ("Je voudrais annuler mon abonnement.", noul("Does the writer want to cancel a subscription?"), True),
    (
        TICKET,
        {
            "type": "choice",
            "instructions": "Which team handles it?",
            "criteria": {"Billing": "Payments and refunds", "Technical": "Bugs and outages", "Sales": "New purchases"},
        },
        "Billing",
    ),
    (
        "The app crashes every time I open the settings page.",
        {
            "type": "choice",
            "instructions": "Which team handles it?",
            "criteria": {"Billing": "Payments and refunds", "Technical": "Bugs and outages"},
        },
        "Technical",
    ),
    (
        "I love this product, it works perfectly!",
        {
            "type": "choice",
            "instructions": "What is the sentiment?",
            "criteria": {"positive": None, "negative": None, "neutral": None},
        },
        "positive",
    ),
    (
        "This is the worst purchase I have ever made. Useless.",
        {
            "type": "choice",
            "instructions": "What is the sentiment?",
            "criteria": {"positive": None, "negative": None, "neutral": None},
        },
        "negative",
    ),
    (
        "Absolutely furious. Nobody answers and I have been waiting for a month!!!",
        {"type": "score", "instructions": "How angry is the writer?", "criteria": ["Calm", "Annoyed", "Furious"]},
        2,
    ),
    (
        # Uncalibrated, this one leaned to the middle level (p = 0.15/0.55/0.30); calibration fixed it.
        "Thanks, everything is fine, no rush at all.",
        {
            "type": "score",
            "instructions": "How urgent is this message?",
            "criteria": ["Not urgent", "Somewhat urgent", "Very urgent"],
        },
        0,
    ),
]


@pytest.mark.parametrize(("state", "question", "expected"), OBVIOUS, ids=range(len(OBVIOUS)))
def test_obvious_questions_are_answered_correctly(
    real_service: ModelService, state: Any, question: dict[str, Any], expected: Any
) -> None:
    answer = ask(real_service, state, {"q": question})["answers"]["q"]
    assert answer["x_label_mass"] > 0.5  # the model answers in the labels we read
    if answer["type"] == "noul":
        assert (answer["noul"] > 0.5) is expected, answer
    elif answer["type"] == "choice":
        assert answer["choice"] == expected, answer
    else:
        probabilities = list(answer["probabilities"].values())
        assert probabilities.index(max(probabilities)) == expected, answer


def test_the_chat_prompt_makes_the_model_emit_labels_without_a_leading_space(real_service: ModelService) -> None:
    engine, prompter = real_service.engine, own_prompter(real_service)
    assert prompter.format.kind == "chat" and not prompter.format.label_space
    plan = real_service.plan(
        SystemOneRequest.model_validate(
            {"model": "m", "state": TICKET, "questions": {"q": noul("Does the customer ask for money back?")}}
        )
    )
    (rendered,) = plan.suffixes()
    variants = [engine.vocab.tokenize(text, special=False)[0] for text in ("Yes", "No", " Yes", " No")]
    snapshot, _ = engine.prefill(plan.prefix)
    (readout,) = engine.decode_suffixes(snapshot, [SuffixTokens(rendered.tokens, variants)]).readouts
    p = softmax(readout.label_logits)
    assert p[0] + p[1] > 0.99, p  # " Yes"/" No" get almost nothing after "assistant\n"


def test_prefix_tokens_are_a_literal_prefix_with_the_real_tokenizer(real_service: ModelService) -> None:
    fmt = own_prompter(real_service).format
    states: list[str | dict[str, Any]] = [TICKET, {"k": [1, 2], "é": "ü"}, "line one\n\nline two\n", "ends?!"]
    for state in states:
        request = SystemOneRequest.model_validate(
            {
                "model": "m",
                "state": state,
                "questions": {
                    "n": noul("Is it a question?"),
                    "c": {"type": "choice", "criteria": {"x": None, "y": "why"}},
                    "s": {"type": "score", "criteria": ["lo", "hi"]},
                },
            }
        )
        plan = real_service.plan(request)
        for rendered in plan.suffixes():
            whole = fmt.head + render_state(state) + fmt.between + rendered.text + fmt.tail
            assert list(plan.prefix.tokens) + list(rendered.tokens) == real_service.engine.vocab.tokenize(whole)


LONG_STATE = " ".join(f"Line {i}: the customer reports that parcel {i} arrived late and damaged." for i in range(75))
LONG_QUESTIONS: dict[str, Any] = {
    "late": noul("Did parcels arrive late?"),
    "tone": {"type": "score", "criteria": ["Calm", "Annoyed", "Furious"]},
}


def test_a_long_state_hit_equals_miss(real_service: ModelService) -> None:
    miss = ask(real_service, LONG_STATE + " (hit test)", LONG_QUESTIONS)
    hit = ask(real_service, LONG_STATE + " (hit test)", LONG_QUESTIONS)
    assert (miss["x_cache"], hit["x_cache"]) == ("miss", "hit")
    assert hit["answers"] == miss["answers"]


def test_a_disk_hit_after_a_restart_equals_a_miss(real_service: ModelService, tmp_path: Path) -> None:
    """Two services over one engine, one folder: the second is the first after a restart."""
    engine, prompter = real_service.engine, own_prompter(real_service)
    identity = SnapshotIdentity(build=engine.build, model=engine.fingerprint.hex(), kv=engine.kv_settings)
    answers = []
    for expected in ("miss", "disk", "hit"):
        if expected != "hit":
            disk = DiskTier(tmp_path, 1 << 30, identity)
            service = assemble("restart", engine, prompter, RamTier(4, 8192), disk=disk)
        answered = ask(service, LONG_STATE + " (disk test)", LONG_QUESTIONS)
        assert answered["x_cache"] == expected
        answers.append(answered["answers"])
        disk.close()  # the write is done before the "restart"; the shared engine stays open
    assert answers[0] == answers[1] == answers[2]


def test_a_restored_long_prefix_equals_a_one_shot_prefill(real_model_path: Path) -> None:
    # A property of the plain kernels: repacked weights and flash attention (which a machine may
    # have chosen for real_service) make a token's numbers depend on its row in the batch, so a
    # prefix prefilled in one piece and in two pieces differs in rounding there. Hit == miss ==
    # cache off stays exact with them too (tests/test_tuning.py): all three take the same pieces.
    service = load_model(
        isolated_settings(model=real_model_path, n_ctx=4096, session_cache_disk_bytes=0, repack="off", flash_attn="off")
    )
    try:
        engine = service.engine
        ask(service, LONG_STATE, LONG_QUESTIONS)
        request = SystemOneRequest.model_validate({"model": "m", "state": LONG_STATE, "questions": LONG_QUESTIONS})
        plan = service.plan(request)
        assert len(plan.prefix.tokens) > 1200
        # Restore (system snapshot + state prefill, then the saved snapshot) == prefill of the whole prefix at once.
        one_shot, _ = engine.prefill(plan.prefix)
        suffixes = distinct_suffixes(plan.suffixes())  # as served
        key = service.states.key(*plan.key)
        cached, hit_again = service.states.ram.get_or_build(key, plan.prefix, lambda: pytest.fail("not cached"))
        assert hit_again
        assert engine.decode_suffixes(one_shot, suffixes).readouts == engine.decode_suffixes(cached, suffixes).readouts
    finally:
        service.close()


def test_question_order_and_ids_do_not_change_answers(real_service: ModelService) -> None:
    questions = {
        "a": noul("Is the customer angry?"),
        "b": {"type": "choice", "criteria": {"Billing": None, "Technical": None}},
        "c": {"type": "score", "criteria": ["low", "medium", "high"]},
    }
    forward = ask(real_service, TICKET, questions)["answers"]
    backward = ask(real_service, TICKET, {f"id-{k}": v for k, v in reversed(questions.items())})["answers"]
    assert {k: forward[k] for k in questions} == {k: backward[f"id-{k}"] for k in questions}


def test_n_questions_cost_one_prefill_and_one_decode(real_service: ModelService, llama_calls: LlamaCalls) -> None:
    questions = {f"q{i}": noul(f"Question {i}?") for i in range(5)}
    ask(real_service, "Any state: this learns the questions' calibration priors.", questions)
    before = llama_calls.decodes
    ask(real_service, "A brand new state for counting decodes.", questions)
    assert llama_calls.decodes - before == 2


def test_questions_that_begin_alike_share_rows_and_answer_as_if_decoded_whole(
    real_model_path: Path, llama_calls: LlamaCalls
) -> None:
    # Under 64 rows, with flash attention and plain kernels, a row's numbers do not depend on the
    # rest of the batch (docs/notes/2026-11-30-prompt-experiments.md), so sharing must change nothing at all.
    service = load_model(
        isolated_settings(model=real_model_path, n_ctx=2048, session_cache_disk_bytes=0, repack="off", flash_attn="on")
    )
    try:
        engine = service.engine
        questions = {f"q{i}": noul(f"Does the ticket mention {topic}?") for i, topic in enumerate(("money", "a date"))}
        ask(service, TICKET, questions)
        plan = service.plan(SystemOneRequest.model_validate({"model": "m", "state": TICKET, "questions": questions}))
        suffixes = distinct_suffixes(plan.suffixes())  # as served
        cached, _ = service.states.ram.get_or_build(
            service.states.key(*plan.key), plan.prefix, lambda: pytest.fail("not cached")
        )
        n_whole = sum(len(suffix.tokens) for suffix in suffixes)
        assert n_whole < 64
        before = llama_calls.rows
        shared = engine.decode_suffixes(cached, suffixes).readouts
        assert llama_calls.rows - before < n_whole - 5  # "Question: Does the ticket mention" once
        engine.shares_suffix_tokens = False
        assert engine.decode_suffixes(cached, suffixes).readouts == shared
    finally:
        service.close()


def test_model_alone_answers_as_the_shipped_config_does(real_model_path: Path) -> None:
    """The default model's fitted temperature belongs to its file (app/known_models.toml), so `-m FILE`
    without models/onepass.toml serves the same numbers as `make run` (which reads that config)."""
    flags = ["--n-ctx", "2048", "--session-cache-disk-bytes", "0", "--repack", "off", "--flash-attn", "off"]
    config = read_models_config(load_settings(flags, {}, default_config=DEFAULT_CONFIG_PATH))
    shipped = next(spec for spec in config.models if spec.name == config.default_model)
    (alone,) = read_models_config(load_settings([*flags, "-m", str(real_model_path)], {})).models
    assert shipped.path == alone.path == real_model_path.resolve()
    assert shipped.known == alone.known == "default"
    assert shipped.settings == alone.settings and alone.settings.calibration_temperature == 0.45
    answers = []
    for spec in (shipped, alone):
        service = load_spec(spec)
        try:
            answers.append(ask(service, TICKET, {"refund": noul("Does the customer ask for money back?")})["answers"])
        finally:
            service.close()
    assert answers[0] == answers[1]  # exact floats
