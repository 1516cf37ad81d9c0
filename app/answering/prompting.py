"""onepass's own prompt: the system + state prefix, one suffix per question, single-token answer labels.

A prompt is   head | state | between | question block | tail
where head (system prompt, start of the user turn) is the same for every request, head +
state + between is the cached prefix, and block + tail is a question's suffix. With a
chat template the pieces come from rendering the model's own template once, at load time,
around marker strings; without one a plain layout is used.

User text (state, questions, option names) is tokenized with special-token parsing off,
so text such as "<|im_end|>" in a request cannot forge the template's control tokens.

A request's images go in the user turn before the state, in prompt order, each as the model's vision
projector puts it (its own text around the image's cells): head | images | state | between. Their
placeholders in the state are dropped (the images are before it), and each image's SHA-256, cells
and positions are in the prefix's key.
"""

from __future__ import annotations

import logging
import string
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from itertools import product
from typing import Literal

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.answering.prompter import (
    ContextBound,
    Plan,
    QuestionSet,
    Reading,
    Suffix,
    TemplateRefused,
    Tokenizer,
    TooManyOptions,
)
from app.answering.token_memo import TokenMemo
from app.config import parse_layout
from app.engine.snapshot import IMAGE_CELL, ImageSpan, Prefix
from app.engine.vision import ImageUnreadable, Vision
from app.wire.contract import (
    MAX_OPTIONS,
    ChoiceQuestion,
    NoulQuestion,
    Question,
    ScoreQuestion,
    SystemOneRequest,
    Text,
    render_text,
)

log = logging.getLogger("onepass.prompting")

# Chosen on tests/eval over plainer wordings, mostly for negations and numbers (the measurements:
# docs/notes/2026-11-30-prompt-experiments.md).
SYSTEM_PROMPT = (
    "You are a careful, literal reader. Read the text, then answer the question about it using only what "
    "the text says; pay attention to negations, numbers and dates. Reply with the label of the correct "
    "answer and nothing else."
)
STATE_MARK = "\x00ONEPASS-STATE\x00"
QUESTION_MARK = "\x00ONEPASS-QUESTION\x00"
STATE_TOKEN_MEMO = 64  # recent states whose tokens are kept, each within the context (app/answering/token_memo.py)
MAX_LEVELS = 10


@dataclass(frozen=True)
class PromptFormat:
    kind: Literal["chat", "plain"]
    head: str  # everything before the state; it ends with `lead`
    between: str  # after the state, before the question block; ends the cached prefix
    tail: str  # after the question block, up to where the answer label goes
    label_space: bool  # whether the answer label follows a space (" A") or starts a message ("A")
    # Base models (plain layout) read a question as a document to complete: "Answer:" in the tail
    # cues the label, so the block needs no headings or answer instruction. Chat models lose
    # accuracy without them (docs/notes/2026-11-30-prompt-experiments.md).
    terse: bool = False
    lead: str = "Text:\n"  # what introduces the state; the question-first layout puts the questions before it

    @property
    def head_before_lead(self) -> str:
        return self.head.removesuffix(self.lead)


def plain_format(system: str) -> PromptFormat:
    return PromptFormat("plain", f"{system}\n\nText:\n", "\n\n", "\nAnswer:", label_space=True, terse=True)


def chat_format(template: str, system: str, bos_text: str, eos_text: str) -> PromptFormat:
    """Render the model's chat template once around markers and cut it into the fixed pieces."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # templates are untrusted
    env.globals["raise_exception"] = _raise_template_error
    env.globals["strftime_now"] = lambda fmt: date(2026, 1, 1).strftime(fmt)  # stable: part of every prefix
    rendered = env.from_string(template).render(
        messages=[
            {"role": "system", "content": system},
            {"role": "user", "content": f"Text:\n{STATE_MARK}\n\n{QUESTION_MARK}"},
        ],
        add_generation_prompt=True,
        bos_token=bos_text,
        eos_token=eos_text,
    )
    if rendered.count(STATE_MARK) != 1 or rendered.count(QUESTION_MARK) != 1:
        raise TemplateError("the chat template does not render the user message verbatim")
    head, rest = rendered.split(STATE_MARK)
    between, tail = rest.split(QUESTION_MARK)
    if bos_text and head.startswith(bos_text):
        head = head[len(bos_text) :]  # the tokenizer adds BOS itself
    return PromptFormat("chat", head, between, tail, label_space=False)


def _raise_template_error(message: str) -> None:
    raise TemplateError(message)


@dataclass(frozen=True)
class Labels:
    """Single-token answer labels: (text shown in the prompt, token id read at the answer)."""

    yes_no: tuple[tuple[str, int], tuple[str, int]]
    options: tuple[tuple[str, int], ...]  # A-Z, then further single-token strings
    levels: tuple[tuple[str, int], ...]  # "1".."9", then "0".."9" for ten levels; letters without digits


def choose_labels(tokenizer: Tokenizer, label_space: bool) -> Labels:
    """Pick distinct single-token labels in the variant the prompt makes the model emit."""

    def pick(candidates: Sequence[str], limit: int) -> tuple[tuple[str, int], ...]:
        found: dict[int, str] = {}
        for text in candidates:
            if len(found) == limit:
                break
            ids = tokenizer.tokenize((" " if label_space else "") + text, add_bos=False, special=False)
            if len(ids) == 1 and ids[0] not in found:
                found[ids[0]] = text
        return tuple((text, token) for token, text in found.items())

    yes_no = next((p for p in map(pick, (("Yes", "No"), ("yes", "no"), ("Y", "N")), (2, 2, 2)) if len(p) == 2), ())
    if len(yes_no) != 2:
        raise ValueError("the vocabulary has no single-token yes/no labels")
    letters = list(string.ascii_uppercase)
    candidates = letters + ["".join(p) for p in product(letters, repeat=2)] + list(string.ascii_lowercase)
    options = pick(candidates, MAX_OPTIONS)
    levels = pick(string.digits, MAX_LEVELS)
    if len(levels) < MAX_LEVELS:
        levels = options[:MAX_LEVELS]  # digits are not single tokens: rate with letters instead
    return Labels((yes_no[0], yes_no[1]), options, levels)


def level_labels(labels: Labels, n: int) -> tuple[tuple[str, int], ...]:
    """Labels for n score levels, lowest first.

    Rated 1..n where the digits allow (9 levels at most): on tests/eval the default model rated
    1-based levels right more often than 0-based ones (docs/notes/2026-11-30-prompt-experiments.md).
    """
    digits = [label for label in labels.levels if label[0].isdigit()]
    if len(digits) == MAX_LEVELS and n < MAX_LEVELS:
        return tuple(digits[1 : n + 1])
    return labels.levels[:n]


class OwnPrompter:
    """Renders prefixes and suffixes for one model; built once at load time.

    state-first:    head | state | between | question block | tail         (one suffix per question)
    question-first: head | questions | lead | state | between | question again | tail
    In the second, the question block is shared by every state asked the same questions, so a
    pipeline of new states prefills it once; each question's suffix is short: it names the question.
    """

    decision_type: str | None = None  # a decision GGUF's prompts are app/answering/decision.py's

    def __init__(
        self,
        tokenizer: Tokenizer,
        fmt: PromptFormat,
        layout: str = "state-first",
        vision: Vision | None = None,
        bound: ContextBound | None = None,
    ) -> None:
        """`vision`: the model's vision projector, where it has one: then it takes images. `bound`: the
        model's context, a state that cannot fit in it refused before it is tokenized (None: no bound)."""
        parse_layout(layout)
        self.tokenizer = tokenizer
        self.vision = vision
        self.format = fmt
        self.layout = layout
        self.labels = choose_labels(tokenizer, fmt.label_space)
        head = fmt.head if layout == "state-first" else fmt.head_before_lead
        self.head_tokens = tuple(tokenizer.tokenize(head, add_bos=tokenizer.add_bos, special=True))
        self._tail_tokens = tuple(tokenizer.tokenize(fmt.tail, add_bos=False, special=True))
        self._state_tokens = TokenMemo(STATE_TOKEN_MEMO, bound)

    @classmethod
    def for_model(
        cls,
        tokenizer: Tokenizer,
        chat_template: str | None,
        bos_text: str,
        eos_text: str,
        context: str = "",
        layout: str = "state-first",
        vision: Vision | None = None,
        bound: ContextBound | None = None,
    ) -> OwnPrompter:
        system = f"{SYSTEM_PROMPT}\n\n{context.strip()}" if context.strip() else SYSTEM_PROMPT
        fmt = plain_format(system)
        if chat_template:
            try:
                fmt = chat_format(chat_template, system, bos_text, eos_text)
            except (TemplateError, ValueError) as error:  # a broken template must not stop the server
                log.warning("chat template unusable (%s); using the plain prompt", error)
        return cls(tokenizer, fmt, layout, vision, bound)

    @property
    def max_options(self) -> int:
        return len(self.labels.options)

    @property
    def identity(self) -> str:
        """What a fitted calibration depends on besides the model: the text around the state, the layout."""
        return "\0".join([self.format.head, self.format.between, self.layout])

    def plan(self, request: SystemOneRequest) -> Plan:
        """The request's prefix, its cache key's parts and each question's reading."""
        text = request.state_text
        files = {image.sha256: image.data for image in request.media.images}
        if files:
            text = request.render(request.state, lambda _: "").strip()  # the images are before the state
        for qid, question in request.questions.items():
            if isinstance(question, ChoiceQuestion) and len(question.criteria) > self.max_options:
                raise TooManyOptions(
                    qid,
                    "criteria",
                    len(question.criteria),
                    self.max_options,
                    f"has single-token labels for at most {self.max_options} options",
                )
        questions = request.questions
        if self.layout == "question-first":
            question_set = self.question_set(questions)
            before = (*self.head_tokens, *question_set.tokens)
            cells, spans, described = self._images(request, len(before))
            prefix = (*before, *cells, *self.state_tokens(text))
            key: tuple[str, ...] = (self.format.head_before_lead, question_set.text, *described)
            readings = [(qid, q, Reading((question_set.suffixes[qid],))) for qid, q in questions.items()]
            return Plan(Prefix(prefix, spans, files), (*key, self.format.between, text), readings, question_set)
        cells, spans, described = self._images(request, len(self.head_tokens))
        prefix = (*self.head_tokens, *cells, *self.state_tokens(text))
        key = (self.format.head, *described, self.format.between, text)
        readings = [(qid, q, Reading((self.question(q),))) for qid, q in questions.items()]
        return Plan(Prefix(prefix, spans, files), key, readings)

    def _images(self, request: SystemOneRequest, offset: int) -> tuple[list[int], tuple[ImageSpan, ...], list[str]]:
        """The request's images as the prefix holds them from cell `offset`: their cells (the projector's
        text and IMAGE_CELL), their spans, and what each adds to the key."""
        cells: list[int] = []
        spans: list[ImageSpan] = []
        media = request.media
        if not media.images:
            return cells, (), []
        if self.vision is None:
            message = "this model has no vision projector: it takes no images"
            raise TemplateRefused((media.fields[0],), message, "images_unsupported")
        for image in media.images:
            try:
                tokens = self.vision.tokens(image.data, image.sha256)
            except ImageUnreadable as error:
                raise TemplateRefused((media.fields[0],), str(error), error.kind) from error
            cells += tokens.before
            spans.append(ImageSpan(offset + len(cells), image.sha256, tokens.n_tokens, tokens.n_pos))
            cells += [IMAGE_CELL] * tokens.n_tokens
            cells += tokens.after
        return cells, tuple(spans), [f"image {s.sha256} {s.n_tokens} {s.n_pos}" for s in spans]

    def state_tokens(self, state: str) -> tuple[int, ...]:
        """Tokens of the state part of the prefix (what a cache miss prefills).

        Memoised for recent states that fit the context: a cache hit should not pay for tokenizing its
        state again (milliseconds for a long state), and a tokenizer is a pure function of the text. A
        state too long for the context is refused (TooLongForContext) before it is tokenized.
        """
        return self._state_tokens.text(state + self.format.between, self._tokenize_user_text)

    def _tokenize_user_text(self, text: str) -> list[int]:
        return self.tokenizer.tokenize(text, add_bos=False, special=False)

    def question(self, question: Question) -> Suffix:
        """The state-first suffix: the question block, its answer line, the tail."""
        body, answer_line, label_ids = self._block(question)
        return self._suffix(body, answer_line, label_ids)

    def question_set(self, questions: dict[str, Question]) -> QuestionSet:
        """The question-first question set and each question's suffix. Blocks are numbered in sorted
        order of their text, so neither the ids nor the order of the questions changes the prompt."""
        blocks = {qid: self._block(question) for qid, question in questions.items()}
        texts = sorted({"\n".join(body) for body, _, _ in blocks.values()})
        number = {qid: texts.index("\n".join(body)) + 1 for qid, (body, _, _) in blocks.items()}
        numbered = [_numbered(text, k) for k, text in enumerate(texts, 1)]
        text = "Questions:\n" + "\n\n".join(numbered) + "\n\n" + self.format.lead
        suffixes = {}
        for qid, (body, answer_line, label_ids) in blocks.items():
            # The question's own line again, and a choice's labelled option names without their
            # descriptions (those, and score levels, stay in the shared block): shorter suffixes
            # measured worse on tests/eval (docs/models.md, "Prompt layouts").
            lines = [_numbered(body[0], number[qid])]
            question = questions[qid]
            if isinstance(question, ChoiceQuestion):
                lines += [] if self.format.terse else ["Options:"]
                lines += [f"{label}. {name}" for name, (label, _) in self._option_labels(question).items()]
            suffixes[qid] = self._suffix(lines, answer_line, label_ids)
        tokens = tuple(self.tokenizer.tokenize(text, add_bos=False, special=False))
        return QuestionSet(text, tokens, number, suffixes, (self.format.head_before_lead, text))

    def _suffix(self, lines: list[str], answer_line: str | None, label_ids: tuple[int, ...]) -> Suffix:
        text = "\n".join([*lines, answer_line] if answer_line else lines)
        tokens = self.tokenizer.tokenize(text, add_bos=False, special=False)
        return Suffix(text, (*tokens, *self._tail_tokens), label_ids)

    def _block(self, question: Question) -> tuple[list[str], str | None, tuple[int, ...]]:
        """(the question's lines, its answer line or None for terse blocks, its label ids)."""
        if isinstance(question, NoulQuestion):
            return self._noul(question)
        if isinstance(question, ChoiceQuestion):
            return self._choice(question)
        return self._score(question)

    def _noul(self, q: NoulQuestion) -> tuple[list[str], str | None, tuple[int, ...]]:
        (yes, yes_id), (no, no_id) = self.labels.yes_no
        question = f"Question: {_text_or(q.instructions, 'Is this true of the text?')}"
        lines = [f"{question} ({yes} or {no})" if self.format.terse else question]
        if q.criteria is not None and q.criteria.true is not None:
            lines.append(f"{yes} means: {render_text(q.criteria.true)}")
        if q.criteria is not None and q.criteria.false is not None:
            lines.append(f"{no} means: {render_text(q.criteria.false)}")
        return lines, None if self.format.terse else f"Answer {yes} or {no}", (yes_id, no_id)

    def _choice(self, q: ChoiceQuestion) -> tuple[list[str], str | None, tuple[int, ...]]:
        if len(q.criteria) > self.max_options:
            raise ValueError(f"this model has labels for {self.max_options} options")
        label_of = self._option_labels(q)
        lines = [f"Question: {_text_or(q.instructions, 'Which option fits the text best?')}"]
        if not self.format.terse:
            lines.append("Options:")
        for name in label_of:
            description = q.criteria[name]
            detail = f": {render_text(description)}" if description is not None else ""
            lines.append(f"{label_of[name][0]}. {name}{detail}")
        answer_line = None if self.format.terse else "Answer with the label of one option"
        return lines, answer_line, tuple(label_of[name][1] for name in q.criteria)

    def _option_labels(self, q: ChoiceQuestion) -> dict[str, tuple[str, int]]:
        """Option name -> its label, in sorted name order, so the order options arrive in never matters."""
        return {name: label for name, label in zip(sorted(q.criteria), self.labels.options, strict=False)}

    def _score(self, q: ScoreQuestion) -> tuple[list[str], str | None, tuple[int, ...]]:
        levels = level_labels(self.labels, len(q.criteria))
        lines = [f"Question: {_text_or(q.instructions, 'Which level fits the text best?')}"]
        if not self.format.terse:
            lines.append("Levels:")
        lines += [f"{label}. {render_text(level)}" for (label, _), level in zip(levels, q.criteria, strict=True)]
        answer_line = None if self.format.terse else "Answer with the label of one level"
        return lines, answer_line, tuple(token for _, token in levels)


def _numbered(line: str, k: int) -> str:
    """A block's first line, "Question: ...", as question k of the question set."""
    return line.replace("Question: ", f"Question {k}: ", 1)


def _text_or(value: Text | None, default: str) -> str:
    return render_text(value) if value is not None else default
