"""Decision-model GGUFs: the System One format of llama.cpp's own server, on onepass's prefix cache.

A decision GGUF names its format in `<arch>.decision.type`, ships a Jinja template named `systemone`
(`tokenizer.chat_template.systemone`) and may ship temperatures `<arch>.decision.temperature.<question
type>[.<bucket>]`. onepass serves the types whose answer is the logits of single-token labels at the
end of the prompt, as the format defines them:

- openjev: labels A-Z then a-z (all 52 single tokens), the i-th label for the i-th option; the template
  gets no labels and derives them from the position; noul lists true first;
- lev: labels A..Z then AA..ZZ (the single-token ones, at most 255), given to the template; noul lists
  false first but is read as a 9-point rating (0 certainly no .. 8 certainly yes) at the first 9
  labels; a choice of several options is asked twice, in forward and reversed order (the labels
  keep their display order), and the two readings averaged; every JSON object's keys sorted;
- nimble: lev's labels, one reading, and the template also gets every question of the request;
- pplx-decider: lev's labels, one reading.

Types that need a readout llama.cpp's logits cannot give (kev, laya, clef, lfm2-d1, lfm2-d1-omni) are
refused at load. A question's temperature is the file's `<type>.<bucket>`, else `<type>`, else 1.

The cached prefix is found by rendering: the longest common token prefix of two probe questions
about the same state is the state's prefix, shared by every question about it. A template that does
not put the state before the question has none; each question's prompt then follows the part every
prompt shares.

The prompt is tokenized with special tokens parsed (templates write their own control tokens), so
control-token text in the user's strings is broken with a word joiner first: a state cannot forge
the template's structure.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import string
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.answering.prompter import Plan, Reading, Suffix, TemplateRefused, Tokenizer, TooManyOptions
from app.contract import ChoiceQuestion, NoulQuestion, Question, ScoreQuestion, SystemOneRequest, Text, label_keys

log = logging.getLogger("onepass.decision")

SERVED = ("openjev", "lev", "nimble", "pplx-decider")
NOT_SERVED = {
    "kev": "its answer is a pointer head (the dot product of hidden vectors at <|box_end|> markers), "
    "which needs per-token embeddings that this build does not read",
    "laya": "its answer is an encoder head read at [MASK] markers from the embeddings output, "
    "which this build does not read",
    "clef": "it scores every option from one joint prompt's embeddings rows, which this build does not read",
    "lfm2-d1": "its outputs are maxima over groups of label tokens (yes/Yes/YES, keys as codes), "
    "a readout this build does not implement",
    "lfm2-d1-omni": "its answer is an encoder head read at marker tokens, which this build does not read",
}
TEMPLATE_KEY = "tokenizer.chat_template.systemone"
MAX_LABELS = 255
RATING_POINTS = 9  # lev's noul: a rating from 0 (certainly no) to 8 (certainly yes)
WORD_JOINER = "\u2060"
PROBE_STATES = ("The first probe text.", "Another text, for the second probe.")
PREFIX_MEMO = 64  # recent states whose prefix is kept
# Recent prompts whose tokens are kept: a repeated request (a cache hit) would otherwise tokenize
# its whole state again for every question.
PROMPT_MEMO = 128


class DecisionError(ValueError):
    """A decision GGUF onepass cannot serve correctly: refused at load, never served wrong."""


@dataclass(frozen=True)
class DecisionFormat:
    kind: str  # one of SERVED
    template: str
    temperatures: dict[str, float]  # "<question type>[.<bucket>]" -> T

    def temperature(self, question_type: str, n_options: int) -> float:
        bucket = _bucket(self.kind, n_options)
        return self.temperatures.get(f"{question_type}.{bucket}", self.temperatures.get(question_type, 1.0))


def _bucket(kind: str, n: int) -> str:
    if kind == "lev":
        return "small" if n <= 8 else "mid" if n <= 26 else "large"
    return "2" if n <= 2 else "3_5" if n <= 5 else "6_10" if n <= 10 else "11"


def read_format(metadata: Callable[[str], str | None], keys: Sequence[str]) -> DecisionFormat | None:
    """The file's decision format; None for an ordinary model. Raises DecisionError for a decision
    model onepass cannot serve (a type it does not read, no template, a bad temperature)."""
    arch = metadata("general.architecture") or ""
    prefix = f"{arch}.decision."
    declared = metadata(prefix + "type")
    if declared is None:
        return None
    kind = declared.strip().lower().replace("_", "-")
    if kind in NOT_SERVED:
        raise DecisionError(f"decision type {declared!r} is not served by onepass: {NOT_SERVED[kind]}")
    if kind not in SERVED:
        raise DecisionError(f"unknown decision type {declared!r}; onepass serves {', '.join(SERVED)}")
    template = metadata(TEMPLATE_KEY)
    if not template:
        raise DecisionError(f"a {kind} decision model needs a 'systemone' template ({TEMPLATE_KEY})")
    temperatures = {}
    for key in keys:
        if key.startswith(prefix + "temperature."):
            text = metadata(key) or ""
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value) or value <= 0:
                raise DecisionError(f"invalid decision temperature: {key} = {text!r}")
            temperatures[key.removeprefix(prefix + "temperature.")] = value
    return DecisionFormat(kind, template, temperatures)


def pick_labels(tokenizer: Tokenizer, kind: str) -> tuple[tuple[str, int], ...]:
    """The type's label codes as (text, token): each must be one token, written with no space before."""
    letters = list(string.ascii_uppercase)
    if kind == "openjev":
        found = []
        for code in letters + list(string.ascii_lowercase):
            ids = tokenizer.tokenize(code, add_bos=False, special=False)
            if len(ids) != 1:
                raise DecisionError(f"openjev needs the 52 letters as single tokens; {code!r} is {len(ids)} tokens")
            found.append((code, ids[0]))
        return tuple(found)
    picked: dict[int, str] = {}
    for code in letters + ["".join(pair) for pair in product(letters, repeat=2)]:
        ids = tokenizer.tokenize(code, add_bos=False, special=False)
        if len(ids) == 1 and ids[0] not in picked:
            picked[ids[0]] = code
            if len(picked) == MAX_LABELS:
                break
    if not picked:
        raise DecisionError(f"the vocabulary has no single-token labels for a {kind} model")
    return tuple((code, token) for token, code in picked.items())


@dataclass(frozen=True)
class _Option:
    key: str  # the answer's label key: "true"/"false", an option name, a level index
    description: Any  # the raw JSON value, or None


def _options(question: Question, true_first: bool) -> list[_Option]:
    if isinstance(question, NoulQuestion):
        criteria = question.criteria
        true = _Option("true", criteria.true if criteria is not None else None)
        false = _Option("false", criteria.false if criteria is not None else None)
        return [true, false] if true_first else [false, true]
    if isinstance(question, ChoiceQuestion):
        return [_Option(name, description) for name, description in question.criteria.items()]
    assert isinstance(question, ScoreQuestion)
    return [_Option(str(i), level) for i, level in enumerate(question.criteria)]


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(item) for item in value]
    return value


def _tojson(value: Any, indent: int | None = None) -> str:
    """The JSON text of a value as templates print it: key order kept, non-ASCII as itself."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


class DecisionPrompter:
    """Prompts and readings for one decision model, as its format defines them; built at load."""

    layout = "state-first"

    def __init__(self, tokenizer: Tokenizer, fmt: DecisionFormat, control_texts: set[str]) -> None:
        """`control_texts`: the vocabulary's control tokens' texts (Engine.control_texts)."""
        self.tokenizer = tokenizer
        self.format = fmt
        self.decision_type = fmt.kind
        self.labels = pick_labels(tokenizer, fmt.kind)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # templates are untrusted
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_template_error
        self._template = env.from_string(fmt.template)
        self._controls = sorted((t for t in control_texts if len(t) > 1), key=len, reverse=True)
        self._tokens = functools.lru_cache(maxsize=PROMPT_MEMO)(self._tokenize)
        try:
            probes = [self._render(probe, {"probe": probe}, state) for state in PROBE_STATES for probe in _PROBES]
        except TemplateRefused as error:
            raise DecisionError(str(error)) from error
        tokens = [self._tokens(text) for text in probes]
        self.head_tokens = _common(tokens)
        # State first: two different questions about one state share a prefix that holds the state.
        self.state_first = PROBE_STATES[0] in _common_text(probes[0], probes[1])
        self._prefix_of = functools.lru_cache(maxsize=PREFIX_MEMO)(self._state_prefix)
        log.info(
            "decision model (%s): %d labels, at most %d options; %s",
            fmt.kind,
            len(self.labels),
            self.max_options,
            "the template puts the state first: each state's prefix is cached"
            if self.state_first
            else f"the template does not put the state before the question: no state cache, each question's "
            f"prompt follows the {len(self.head_tokens)} tokens every prompt shares",
        )

    @property
    def max_options(self) -> int:
        return len(self.labels)

    @property
    def identity(self) -> str:
        return "\0".join(["systemone", self.format.kind, self.format.template])

    def state_tokens(self, state: str) -> tuple[int, ...]:
        """A state's part of its prefix, after the shared head (the content-free stand-ins' too)."""
        return self._prefix_of(json.dumps(state))[len(self.head_tokens) :]

    def plan(self, request: SystemOneRequest) -> Plan:
        """The request's prefix (the longest common one of its prompts, or the state's own), its cache
        key (the prefix's tokens: the template is part of the model's identity) and each question's reading."""
        state, questions = request.state, request.questions
        self._check_limits(questions)
        # the state's own prefix first: a template that refuses the state says so about the state
        known = self._prefix_of(json.dumps(state)) if self.state_first else self.head_tokens
        prompts = {qid: self._variants(qid, question, questions, state) for qid, question in questions.items()}
        every = [tokens for variants in prompts.values() for tokens, _ in variants]
        prefix = _common([known, *every])
        shortest = min(len(tokens) for tokens in every)
        prefix = prefix[: min(len(prefix), shortest - 1)]  # every question keeps a token to decode
        planned = []
        for qid, question in questions.items():
            variants = tuple(Suffix("", tokens[len(prefix) :], label_ids) for tokens, label_ids in prompts[qid])
            planned.append((qid, question, self._reading(question, variants)))
        return Plan(prefix, ("systemone", array("I", prefix).tobytes()), planned)

    # Rendering ---------------------------------------------------------------------------------

    def _check_limits(self, questions: dict[str, Question]) -> None:
        """Every question's options fit the model's labels (a noul counts 2, or lev's nine ratings)."""
        for qid, question in questions.items():
            if isinstance(question, ChoiceQuestion | ScoreQuestion):
                needed = len(question.criteria)
            else:
                needed = RATING_POINTS if self.format.kind == "lev" else 2
            if needed > self.max_options:
                message = (
                    f'"criteria" has {needed} options, at most {self.max_options} are supported by this '
                    f"{self.format.kind} model"
                )
                raise TooManyOptions(qid, "criteria", needed, self.max_options, message)

    def _variants(
        self, qid: str, question: Question, questions: dict[str, Question], state: Text
    ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """(the prompt's tokens, the label ids read in label_keys order) for each variant."""
        kind = self.format.kind
        answer_order = label_keys(question)
        found = []
        for shown in self.variants_shown(question):
            tokens = self._tokens(self._render(question, questions, state, qid, shown))
            if kind == "lev" and isinstance(question, NoulQuestion):
                label_ids = tuple(token for _, token in self.labels[:RATING_POINTS])
            else:  # each option's label is the one at its place in this variant's display
                position = {o.key: i for i, o in enumerate(shown)}
                label_ids = tuple(self.labels[position[key]][1] for key in answer_order)
            found.append((tokens, label_ids))
        return found

    def _reading(self, question: Question, variants: tuple[Suffix, ...]) -> Reading:
        n = 2 if isinstance(question, NoulQuestion) else len(question.criteria)
        temperature = self.format.temperature(question.type, n)
        if self.format.kind == "lev" and isinstance(question, NoulQuestion):
            return Reading(variants, "rating", temperature)
        return Reading(variants, "mean" if len(variants) > 1 else "one", temperature)

    def template_values(
        self, question: Question, questions: dict[str, Question], state: Text, qid: str, shown: list[_Option]
    ) -> dict[str, Any]:
        """What the systemone template is given to render one variant of one question."""
        kind = self.format.kind
        values: dict[str, Any] = {
            "id": qid,
            "type": question.type,
            "instructions": self._user(question.instructions if question.instructions is not None else ""),
            "state": self._user(state),
            "options": self._options_value(shown),
        }
        if kind == "nimble":
            values["questions"] = [
                {
                    "id": other_id,
                    "type": other.type,
                    "instructions": self._user(other.instructions if other.instructions is not None else ""),
                    "options": self._options_value(_options(other, true_first=False)),
                }
                for other_id, other in questions.items()
            ]
        if kind == "lev":
            values = _sorted_keys(values)
        values["images"] = []
        return values

    def variants_shown(self, question: Question) -> list[list[_Option]]:
        """The options in the order each variant shows them (lev shows a choice both ways)."""
        options = _options(question, true_first=self.format.kind == "openjev")
        if self.format.kind == "lev" and isinstance(question, ChoiceQuestion) and len(options) > 1:
            return [options, options[::-1]]
        return [options]

    def _render(
        self,
        question: Question,
        questions: dict[str, Question],
        state: Text,
        qid: str = "probe",
        shown: list[_Option] | None = None,
    ) -> str:
        shown = shown if shown is not None else self.variants_shown(question)[0]
        values = self.template_values(question, questions, state, qid, shown)
        try:
            return self.render_values(values)
        except Exception as error:  # an untrusted template may fail any way on any input
            loc = ("state",) if qid == "probe" else ("questions", qid)
            raise TemplateRefused(loc, f"the model's systemone template did not render: {error}") from error

    def render_values(self, values: dict[str, Any]) -> str:
        return self._template.render(**values)

    def _options_value(self, shown: list[_Option]) -> list[dict[str, Any]]:
        found = []
        for i, option in enumerate(shown):
            value: dict[str, Any] = {"key": self._user(option.key), "description": self._user(option.description)}
            if self.format.kind != "openjev":
                value["label"] = self.labels[i][0]
            found.append(value)
        return found

    def _user(self, value: Any) -> Any:
        """User text with any control token's text broken, so it stays text when specials are parsed."""
        if isinstance(value, str):
            for control in self._controls:
                if control in value:
                    value = value.replace(control, control[0] + WORD_JOINER + control[1:])
            return value
        if isinstance(value, dict):
            return {self._user(key): self._user(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self._user(item) for item in value]
        return value

    def _tokenize(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.tokenize(text, add_bos=False, special=True))

    def _state_prefix(self, state_json: str) -> tuple[int, ...]:
        state = json.loads(state_json)
        return _common([self._tokens(self._render(probe, {"probe": probe}, state)) for probe in _PROBES])


def _raise_template_error(message: str) -> None:
    raise TemplateError(message)


def _common(sequences: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The longest common prefix."""
    first = sequences[0]
    n = len(first)
    for other in sequences[1:]:
        n = min(n, len(other))
        for i in range(n):
            if other[i] != first[i]:
                n = i
                break
    return tuple(first[:n])


def _common_text(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


_PROBES: tuple[Question, ...] = (
    NoulQuestion(type="noul", instructions="Is the text about the weather?"),
    ChoiceQuestion(type="choice", instructions="Which colour does it name?", criteria={"red": None, "blue": None}),
)
