"""Decision-model GGUFs: the System One format of llama.cpp's own server, on onepass's prefix cache.

A decision GGUF names its format in `<arch>.decision.type`, ships a Jinja template named `systemone`
(`tokenizer.chat_template.systemone`) and may ship temperatures `<arch>.decision.temperature.<question
type>[.<bucket>]`. onepass serves all nine types llama.cpp's server does. This module prompts the
causal ones, whose state's prefix the cache keeps (app/answering/encoders.py the others):

- openjev: labels A-Z then a-z (all 52 single tokens), the i-th label for the i-th option; the template
  gets no labels and derives them from the position; noul lists true first;
- lev: labels A..Z then AA..ZZ (the single-token ones, at most 255), given to the template; noul lists
  false first but is read as a 9-point rating (0 certainly no .. 8 certainly yes) at the first 9
  labels; a choice of several options is asked twice, in forward and reversed order (the labels
  keep their display order), and the two readings averaged; every JSON object's keys sorted;
- nimble: lev's labels, one reading, and the template also gets every question of the request;
- pplx-decider: lev's labels, one reading;
- lfm2-d1: labels per question (yes/no, the level digits, an option code each), each read as the
  largest logit of its group of tokens (yes/Yes/YES; "A" and " A"); noul lists true first;
- kev: no labels: each option ends at a <|box_end|> token, and its score is q . k / sqrt(n / 2), q the
  first half of the last token's output vector, k the second half of the option's (the model's
  cls.output projection); user text is given to the template as kev's text (app/answering/decision_text.py).

A question's temperature is the file's `<type>.<bucket>`, else `<type>`, else 1.

The cached prefix is found by rendering: the longest common token prefix of two probe questions
about the same state is the state's prefix, shared by every question about it. A template that does
not put the state before the question has none; each question's prompt then follows the part every
prompt shares.

The prompt is tokenized with special tokens parsed (templates write their own control tokens), so
control-token text in the user's strings is broken first: as llama.cpp's server breaks it where it
does (kev's `<|name|>` as `<¦name¦>`), and with a word joiner wherever it remains, so that a state
cannot forge the template's structure.
"""

from __future__ import annotations

import json
import logging
from array import array
from dataclasses import dataclass
from typing import Any, Literal

from app.answering import decision_text
from app.answering.decision_format import CAUSAL, DecisionError, DecisionFormat, Option, options_of
from app.answering.decision_media import PromptImages, described
from app.answering.decision_text import common as _common
from app.answering.decision_text import common_text as _common_text
from app.answering.decision_text import pick_labels
from app.answering.prompter import ContextBound, Plan, Reading, Suffix, TemplateRefused, Tokenizer, TooManyOptions
from app.answering.template_prompter import RATING_POINTS, TemplatePrompter
from app.answering.token_memo import TokenMemo
from app.engine.snapshot import ImageSpan, Prefix
from app.engine.vision import ImageTokens, Vision
from app.wire.contract import (
    MAX_OPTIONS,
    ChoiceQuestion,
    NoulQuestion,
    Question,
    SystemOneRequest,
    Text,
    label_keys,
)
from app.wire.images import NO_MEDIA, Media

log = logging.getLogger("onepass.decision")

BOX_END = "<|box_end|>"  # kev: where an option's output vector is read
PROBE_STATES = ("The first probe text.", "Another text, for the second probe.")
PREFIX_MEMO = 64  # recent states whose prefix is kept, each within the context


@dataclass(frozen=True)
class _Prompt:
    """One variant of a question, rendered: its tokens, the label tokens read at its end (in answer
    order), the positions a head reads (in answer order, then kev's pointer), lfm2-d1's groups and
    the images' spans."""

    tokens: tuple[int, ...]
    label_ids: tuple[int, ...]
    marks: tuple[int, ...] = ()
    groups: tuple[int, ...] = ()
    spans: tuple[ImageSpan, ...] = ()


class DecisionPrompter(TemplatePrompter):
    """Prompts and readings for one decision model, as its format defines them; built at load."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        fmt: DecisionFormat,
        control_texts: set[str],
        vision: Vision | None = None,
        ends: tuple[int | None, int | None] = (None, None),
        bound: ContextBound | None = None,
    ) -> None:
        if fmt.kind not in CAUSAL:
            raise DecisionError(f"{fmt.kind} reads each prompt whole: app/answering/encoders.py prompts it")
        self.labels = pick_labels(tokenizer, fmt.kind)
        if fmt.kind == "kev":
            marker = tokenizer.tokenize(BOX_END, add_bos=False, special=True)
            if len(marker) != 1:
                raise DecisionError(f"a kev decision model needs {BOX_END} as one token")
            self._marker = marker[0]
        super().__init__(tokenizer, fmt, control_texts, vision, ends, bound)
        try:
            probes = [text for state in PROBE_STATES for text in self._probes(state)]
        except TemplateRefused as error:
            raise DecisionError(str(error)) from error
        tokens = [self._tokens(text) for text in probes]
        self.head_tokens = _common(tokens)
        # State first: two different questions about one state share a prefix that holds the state.
        self.state_first = PROBE_STATES[0] in _common_text(probes[0], probes[1])
        self._prefixes = TokenMemo(PREFIX_MEMO, bound)
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
        return len(self.labels) if self.labels else MAX_OPTIONS

    def state_tokens(self, state: str) -> tuple[int, ...]:
        """A state's part of its prefix, after the shared head (the content-free stand-ins' too)."""
        return self._prefix_of(json.dumps(state), ())[len(self.head_tokens) :]

    def plan(self, request: SystemOneRequest) -> Plan:
        """The request's prefix (the longest common one of its prompts, or the state's own), its cache
        key (the prefix's tokens: the template is part of the model's identity) and each question's reading."""
        media, questions = request.media, request.questions
        self._check_limits(questions)
        images = self.images.read(request)
        state = media.substitute(request.state, lambda _: "")  # the images go where the template puts them
        # the state's own prefix first: a template that refuses the state says so about the state
        known = self._prefix_of(json.dumps(state), images) if self.state_first else self.head_tokens
        prompts = {
            qid: self._variants(qid, question, questions, state, images, media) for qid, question in questions.items()
        }
        every = [prompt for variants in prompts.values() for prompt in variants]
        prefix = _common([*([known] if self.state_first or not images else []), *(p.tokens for p in every)])
        # every question keeps a token to decode, and every place a head reads
        keep = min(min(p.marks, default=len(p.tokens) - 1) for p in every)
        prefix = prefix[: min(len(prefix), keep)]
        spans = every[0].spans
        if any(span.offset + span.n_tokens > len(prefix) for span in spans):
            raise TemplateRefused((), "the model's template puts the images after the question")
        planned = []
        for qid, question in questions.items():
            variants = tuple(
                Suffix("", p.tokens[len(prefix) :], p.label_ids, tuple(m - len(prefix) for m in p.marks))
                for p in prompts[qid]
            )
            planned.append((qid, question, self._reading(question, variants, prompts[qid][0].groups)))
        files = {image.sha256: image.data for image in media.images}
        key: tuple[str | bytes, ...] = ("systemone", array("i", prefix).tobytes(), *described(spans))
        return Plan(Prefix(prefix, spans, files), key, planned)

    # Rendering ---------------------------------------------------------------------------------

    def _variants(
        self,
        qid: str,
        question: Question,
        questions: dict[str, Question],
        state: Text,
        images: tuple[ImageTokens, ...] = (),
        media: Media = NO_MEDIA,
    ) -> list[_Prompt]:
        """Each variant of a question, rendered, with what its readout reads in label_keys order."""
        kind = self.format.kind
        answer_order = label_keys(question)
        found = []
        for shown in self.variants_shown(question):
            position = {o.key: i for i, o in enumerate(shown)}  # each label's place in this variant's display
            text = self._render(question, questions, state, qid, shown, images=images, media=media)
            tokens, spans = self._prompt_tokens(text, images)
            if kind == "lev" and isinstance(question, NoulQuestion):
                found.append(_Prompt(tokens, tuple(token for _, token in self.labels[:RATING_POINTS]), spans=spans))
            elif kind == "lfm2-d1":
                _, groups = self._d1_labels(qid, question, shown)
                ordered = [groups[position[key]] for key in answer_order]
                flat = tuple(token for group in ordered for token in group)
                found.append(_Prompt(tokens, flat, groups=tuple(len(group) for group in ordered), spans=spans))
            elif kind == "kev":
                markers = [i for i, token in enumerate(tokens) if token == self._marker]
                if len(markers) != len(shown):
                    raise TemplateRefused(
                        ("questions", qid), "the kev template did not end each option with one marker"
                    )
                marks = (*(markers[position[key]] for key in answer_order), len(tokens) - 1)
                found.append(_Prompt(tokens, (), marks, spans=spans))
            else:
                labels = tuple(self.labels[position[key]][1] for key in answer_order)
                found.append(_Prompt(tokens, labels, spans=spans))
        return found

    def _prompt_tokens(
        self, text: str, images: tuple[ImageTokens, ...]
    ) -> tuple[tuple[int, ...], tuple[ImageSpan, ...]]:
        """A rendered prompt's tokens and its images' spans: tokenized whole without images (as
        llama-server does), else as libmtmd puts them (app/answering/decision_media.py)."""
        if not images:
            return self._tokens(text), ()
        tokens, spans = self.images.tokens(text, images)
        return tuple(tokens), tuple(spans)

    def _d1_labels(self, qid: str, question: Question, shown: list[Option]) -> tuple[list[str], list[tuple[int, ...]]]:
        try:
            return decision_text.d1_labels(self._plain_tokens, question.type, [o.key for o in shown])
        except ValueError as error:
            raise TooManyOptions(qid, "criteria", len(shown), len(shown) - 1, str(error)) from error

    def _plain_tokens(self, text: str) -> list[int]:
        return self.tokenizer.tokenize(text, add_bos=False, special=False)

    def _reading(self, question: Question, variants: tuple[Suffix, ...], groups: tuple[int, ...]) -> Reading:
        n = 2 if isinstance(question, NoulQuestion) else len(question.criteria)
        temperature = self.format.temperature(question.type, n)
        kind = self.format.kind
        if kind == "lev" and isinstance(question, NoulQuestion):
            return Reading(variants, "rating", temperature)
        combine: Literal["one", "mean"] = "mean" if len(variants) > 1 else "one"
        if kind == "lfm2-d1":
            return Reading(variants, combine, temperature, head="groups", groups=groups)
        if kind == "kev":
            return Reading(variants, combine, temperature, head="pointer")
        return Reading(variants, combine, temperature)

    def template_values(
        self,
        question: Question,
        questions: dict[str, Question],
        state: Text,
        qid: str,
        shown: list[Option],
        *,
        n_images: int = 0,
        media: Media = NO_MEDIA,
    ) -> dict[str, Any]:
        """What the systemone template is given to render one variant of one question."""
        kind = self.format.kind
        instructions = question.instructions if question.instructions is not None else ""
        values: dict[str, Any] = {
            "id": qid,
            "type": question.type,
            "instructions": self._user(instructions),
            "state": self._user(state),
            "options": self._options_value(qid, question, shown),
        }
        if kind == "nimble":
            values["questions"] = [
                {
                    "id": other_id,
                    "type": other.type,
                    "instructions": self._user(other.instructions if other.instructions is not None else ""),
                    "options": self._options_value(other_id, other, options_of(other, kind)),
                }
                for other_id, other in questions.items()
            ]
        if kind == "lev":
            values = decision_text.sort_keys(values)
        if kind == "kev":  # kev's template takes text only
            values["state"] = self._user(decision_text.kev_text(state))
            values["instructions"] = self._user(decision_text.kev_text(instructions))
        return PromptImages.values(media, values, n_images)

    def variants_shown(self, question: Question) -> list[list[Option]]:
        """The options in the order each variant shows them (lev shows a choice both ways)."""
        options = options_of(question, self.format.kind)
        if self.format.kind == "lev" and isinstance(question, ChoiceQuestion) and len(options) > 1:
            return [options, options[::-1]]
        return [options]

    def _probes(self, state: Text, images: tuple[ImageTokens, ...] = ()) -> list[str]:
        """The probe questions about `state`, rendered, each under an id of its own: the id of a template
        that prints it is then no part of the state's prefix (nor of the content-free priors')."""
        return [
            self._render(probe, {qid: probe}, state, qid, probe=True, images=images) for qid, probe in _PROBES.items()
        ]

    def _render(
        self,
        question: Question,
        questions: dict[str, Question],
        state: Text,
        qid: str,
        shown: list[Option] | None = None,
        *,
        probe: bool = False,
        images: tuple[ImageTokens, ...] = (),
        media: Media = NO_MEDIA,
    ) -> str:
        shown = shown if shown is not None else self.variants_shown(question)[0]
        values = self.template_values(question, questions, state, qid, shown, n_images=len(images), media=media)
        try:
            return self.render_values(values)
        except Exception as error:  # an untrusted template may fail any way on any input
            loc = ("state",) if probe else ("questions", qid)
            raise TemplateRefused(loc, f"the model's systemone template did not render: {error}") from error

    def render_values(self, values: dict[str, Any]) -> str:
        return self._template.render(**values)

    def _options_value(self, qid: str, question: Question, shown: list[Option]) -> list[dict[str, Any]]:
        kind = self.format.kind
        codes = self._d1_labels(qid, question, shown)[0] if kind == "lfm2-d1" else [code for code, _ in self.labels]
        found = []
        for i, option in enumerate(shown):
            if kind == "kev":
                description = option.description
                if description is not None:
                    description = decision_text.kev_text(description)
                key = decision_text.kev_text(option.key)
                value: dict[str, Any] = {"key": self._user(key), "description": self._user(description)}
            else:
                value = {"key": self._user(option.key), "description": self._user(option.description)}
            if kind != "openjev" and kind != "kev":
                value["label"] = codes[i]
            found.append(value)
        return found

    def _prefix_of(self, state_json: str, images: tuple[ImageTokens, ...]) -> tuple[int, ...]:
        return self._prefixes.get((state_json, images), lambda: self._state_prefix(state_json, images))

    def _state_prefix(self, state_json: str, images: tuple[ImageTokens, ...]) -> tuple[int, ...]:
        state = json.loads(state_json)
        return _common([self._prompt_tokens(text, images)[0] for text in self._probes(state, images)])


_PROBES: dict[str, Question] = {  # ids that differ from their first letter
    "probe": NoulQuestion(type="noul", instructions="Is the text about the weather?"),
    "other": ChoiceQuestion(
        type="choice", instructions="Which colour does it name?", criteria={"red": None, "blue": None}
    ),
}
