"""Decision GGUFs read whole: laya, lfm2-d1-omni and clef, whose models keep no memory (every token
sees every other), so no prefix of theirs can be cached. Each prompt is built as llama.cpp's server
builds it (tools/server/server-decision.cpp) and read in one piece:

- laya (modern-bert): `[CLS] question [SEP] ([MASK] option)* [SEP] state [SEP]`; each option cut to
  49 tokens, then all evenly to fit the file's max_head_tokens, the question to what is left; an
  option's score is the output vector at its [MASK], in the column of the question's type;
- lfm2-d1-omni (lfm2, not causal): the template's pieces, split at its separator and tokenized one
  by one, each question and option cut to its budget, the state to the room left; read like laya,
  at each option's mask token;
- clef (a joint head on qwen35): every question of the request in one prompt, each token given its
  decision order (a question's text, an option's text, or neither); row j of the output is the
  score of option j.

User text is given as llama.cpp gives it (laya's mask text replaced by a space, lfm2-d1-omni's
special tokens broken, clef's keys sorted), and any control token's text still in it broken with a
word joiner.
"""

from __future__ import annotations

import logging
from typing import Any

from app.answering import decision_text
from app.answering.decision_format import DecisionError, DecisionFormat, options_of
from app.answering.decision_media import PromptImages
from app.answering.prompter import ContextBound, Plan, Reading, Suffix, TemplateRefused, Tokenizer
from app.answering.template_prompter import TemplatePrompter
from app.engine.snapshot import ImageSpan, Prefix
from app.engine.vision import MEDIA_MARKER, ImageTokens, Vision
from app.wire.contract import NoulQuestion, Question, SystemOneRequest, label_keys
from app.wire.images import NO_MEDIA

log = logging.getLogger("onepass.decision")

COLUMN = {"choice": 0, "score": 1, "noul": 2}  # laya's and lfm2-d1-omni's output column per question type
ORDER = {"noul": 1, "choice": 2, "score": 3}  # clef's decision order of a question's text
OPTION_ORDER = 4  # clef's decision order of an option's text
MAX_OPTION_TOKENS = 48  # laya: an option's tokens after its mask, at most
D1OMNI_MAX_TOKENS = 16384  # lfm2-d1-omni's longest prompt
D1OMNI_MAX_TOKENS_IMAGE = 896  # lfm2-d1-omni's text after images, at most


class EncoderPrompter(TemplatePrompter):
    """Prompts and readings for a decision model without memory; built at load."""

    head_tokens: tuple[int, ...] = ()  # nothing is shared: every prompt is read whole

    def __init__(
        self,
        tokenizer: Tokenizer,
        fmt: DecisionFormat,
        control_texts: set[str],
        specials: Specials,
        vision: Vision | None = None,
        ends: tuple[int | None, int | None] = (None, None),
        bound: ContextBound | None = None,
    ) -> None:
        """`specials`: the mask and separator tokens the format reads; `vision`, `ends`, `bound`:
        TemplatePrompter's."""
        self._specials = specials
        if fmt.kind in ("laya", "lfm2-d1-omni") and specials.mask < 0:
            raise DecisionError(f"a {fmt.kind} decision model needs a mask token")
        if fmt.kind == "laya" and specials.sep < 0:
            raise DecisionError("a laya decision model needs a separator token")
        super().__init__(tokenizer, fmt, control_texts, vision, ends, bound)
        log.info("decision model (%s): every prompt is read whole (the model keeps no memory)", fmt.kind)

    def state_tokens(self, state: str) -> tuple[int, ...]:
        return ()

    def plan(self, request: SystemOneRequest) -> Plan:
        """Every question's whole prompt (clef: one for them all), and where its scores are read."""
        questions = request.questions
        self._check_limits(questions)
        images = self.images.read(request)
        if self.format.kind == "clef":
            planned = self._joint(request, images)
        else:
            planned = [(qid, q, self._reading(q, self._one(qid, q, request, images))) for qid, q in questions.items()]
        files = {image.sha256: image.data for image in request.media.images}
        return Plan(Prefix(images=files), ("systemone", self.format.kind), planned)

    def _reading(self, question: Question, suffix: Suffix) -> Reading:
        n = 2 if isinstance(question, NoulQuestion) else len(question.criteria)
        temperature = self.format.temperature(question.type, n)
        if suffix.spans and self.format.kind == "lfm2-d1-omni":  # llama.cpp reads its image answers untempered
            temperature = 1.0
        if self.format.kind == "clef":
            return Reading((suffix,), "one", temperature, head="rows")
        return Reading((suffix,), "one", temperature, head="column", column=COLUMN[question.type])

    # laya and lfm2-d1-omni: a prompt per question ---------------------------------------------------

    def _one(self, qid: str, question: Question, request: SystemOneRequest, images: tuple[ImageTokens, ...]) -> Suffix:
        shown = options_of(question, self.format.kind)
        values: dict[str, Any] = {
            "id": qid,
            "type": question.type,
            "instructions": question.instructions if question.instructions is not None else "",
            "state": request.state,
            "options": [{"key": o.key, "description": o.description} for o in shown],
        }
        values = request.media.substitute(values, lambda _: "")  # the images go where the template puts them
        if self.format.kind == "laya":
            mask = self.tokenizer_piece(self._specials.mask)
            values = decision_text.replace_text(values, mask, " ") if mask else values
            values["images"] = []
            tokens = self._tokens(self._render(values, ("questions", qid)))
            tokens, markers = self._laya(tokens, len(shown), qid)
            spans: tuple[ImageSpan, ...] = ()
        else:
            tokens, markers, spans = self._d1omni(values, len(shown), qid, images)
        position = {o.key: i for i, o in enumerate(shown)}
        marks = tuple(markers[position[key]] for key in label_keys(question))
        return Suffix("", tokens, (), marks, spans=spans)

    def tokenizer_piece(self, token: int) -> str:
        """A token's text (the mask's, which user text must not spell)."""
        return self._specials.texts.get(token, "")

    def _laya(self, tokens: tuple[int, ...], n: int, qid: str) -> tuple[tuple[int, ...], list[int]]:
        mask, sep = self._specials.mask, self._specials.sep
        markers = [i for i, token in enumerate(tokens) if token == mask]
        if len(markers) != n or markers[0] < 2 or tokens[markers[0] - 1] != sep or tokens[-1] != sep:
            raise TemplateRefused(("questions", qid), "the laya template did not lay out its prompt as expected")
        head_end = markers[0] - 1
        opts_end = next((i for i in range(markers[-1], len(tokens)) if tokens[i] == sep), len(tokens))
        if opts_end + 1 >= len(tokens):
            raise TemplateRefused(("questions", qid), "the laya template did not lay out its prompt as expected")
        options = [tokens[markers[i] : markers[i + 1] if i + 1 < n else opts_end] for i in range(n)]
        options = [option[: MAX_OPTION_TOKENS + 1] for option in options]
        budget = self.format.max_head_tokens
        if sum(map(len, options)) + 16 > budget:  # too many or too long options: shrink them evenly
            options = [option[: max(4, (budget - min(budget, 16)) // n)] for option in options]
        n_question = max(8, budget - min(budget, sum(map(len, options))))
        out = [tokens[0], *tokens[1 : min(head_end, 1 + n_question)], sep]
        found = []
        for option in options:
            found.append(len(out))
            out.extend(option)
        out.extend(tokens[opts_end:])
        return tuple(out), found

    def _d1omni(
        self, values: dict[str, Any], n: int, qid: str, images: tuple[ImageTokens, ...]
    ) -> tuple[tuple[int, ...], list[int], tuple[ImageSpan, ...]]:
        """The prompt, its mask positions, its images' spans. The images come first, tokenized alone
        (markers only, libmtmd's BOS rule), and the text after them has a budget of its own."""
        marker, sep = "<<d1omni:", "<<d1omni:sep>>"
        marks = {"state": "<<d1omni:state>>", "question": "<<d1omni:question>>", "option": "<<d1omni:option>>"}
        values = decision_text.replace_text(decision_text.escape_specials_deep(values), marker, "<<d1omni ")
        values = PromptImages.values(NO_MEDIA, values, len(images))  # placeholders dropped in _one
        values.update(audio=False, sep=sep, mark_state=marks["state"])
        values.update(mark_question=marks["question"], mark_option=marks["option"])
        pieces = self._render(values, ("questions", qid)).split(sep)
        markers = "".join(values["images"])
        if not pieces or pieces[0] != markers:
            raise TemplateRefused(("questions", qid), "the lfm2-d1-omni template did not lay out its prompt")
        media, spans = self.images.tokens(markers, images) if images else ([], [])
        n_max = D1OMNI_MAX_TOKENS
        if images:
            n_max = min(D1OMNI_MAX_TOKENS_IMAGE, D1OMNI_MAX_TOKENS - min(D1OMNI_MAX_TOKENS, len(media)))
            if n_max < 64:
                message = f"the images take {len(media)} of the {D1OMNI_MAX_TOKENS} positions: send fewer images"
                raise TemplateRefused((), message, "too_long")
        budget = max(96, min(24 * n + 32, n_max // 2))
        limits = {"question": max(16, budget), "option": max(2, (budget - 3 * n) // n)}
        head: list[int] = []
        tail: list[int] = []
        state: list[int] | None = None
        for piece in pieces[1:]:
            kind = next((k for k, mark in marks.items() if piece.startswith(mark)), None)
            tokens = list(self._tokens(piece.removeprefix(marks[kind]) if kind else piece))
            if kind == "state":
                if state is not None:
                    raise TemplateRefused(("questions", qid), "the lfm2-d1-omni template has two states")
                state = tokens
                continue
            if kind is not None:
                tokens = tokens[: limits[kind]]
            (tail if state is not None else head).extend(tokens)
        if state is None:
            raise TemplateRefused(("questions", qid), "the lfm2-d1-omni template has no state")
        room = n_max - min(n_max, len(head) + len(tail))
        whole = (head + state[:room] + tail)[:n_max]
        found = [len(media) + i for i, token in enumerate(whole) if token == self._specials.mask]
        if len(found) != n:
            raise TemplateRefused(("questions", qid), "the options do not fit in the lfm2-d1-omni prompt")
        return (*media, *whole), found, tuple(spans)

    # clef: one prompt for every question ------------------------------------------------------------

    def _joint(self, request: SystemOneRequest, images: tuple[ImageTokens, ...]) -> list[tuple[str, Question, Reading]]:
        """The one prompt; with images, the pieces up to the one holding their markers are tokenized
        with them (libmtmd's BOS rule) and have no decision order."""
        marker, sep, mark_question, mark_option = "<<clef:", "<<clef:sep>>", "<<clef:question>>", "<<clef:option>>"
        shown = {qid: options_of(q, "clef") for qid, q in request.questions.items()}
        listed = [
            {
                "id": qid,
                "type": q.type,
                "instructions": q.instructions if q.instructions is not None else "",
                "options": [{"key": o.key, "description": o.description} for o in shown[qid]],
            }
            for qid, q in request.questions.items()
        ]
        values = decision_text.replace_text(
            decision_text.sort_keys({"state": request.state, "questions": listed}), marker, "<<clef "
        )
        values = PromptImages.values(request.media, values, len(images))
        values.update(sep=sep, mark_question=mark_question, mark_option=mark_option)
        pieces = self._render(values, ("state",)).split(sep)
        tokens: list[int] = []
        spans: list[ImageSpan] = []
        if images:
            head = ""
            while pieces and MEDIA_MARKER not in head:
                head += pieces.pop(0)
            if MEDIA_MARKER not in head or marker in head:
                raise TemplateRefused((), "the clef template did not put the images before its questions")
            tokens, spans = self.images.tokens(head, images)
        order = [0] * len(tokens)
        types = [q.type for q in request.questions.values()]
        asked = n_options = 0
        for piece in pieces:
            level = 0
            if piece.startswith(mark_question):
                piece, asked = piece.removeprefix(mark_question), asked + 1
                if asked > len(types):
                    raise TemplateRefused(("state",), "the clef template shows more questions than were asked")
                level = ORDER[types[asked - 1]]
            elif piece.startswith(mark_option):
                piece, level, n_options = piece.removeprefix(mark_option), OPTION_ORDER, n_options + 1
            found = self._tokens(piece)
            if level and not found:
                raise TemplateRefused(("state",), "the instructions and the options of a question must not be empty")
            tokens.extend(found)
            order.extend([level] * len(found))
        if asked != len(types) or n_options != sum(len(options) for options in shown.values()):
            raise TemplateRefused(("state",), "the clef template did not show every question and option")
        planned, row = [], 0
        for qid, question in request.questions.items():
            position = {o.key: row + i for i, o in enumerate(shown[qid])}
            row += len(shown[qid])
            marks = tuple(position[key] for key in label_keys(question))
            suffix = Suffix("", tuple(tokens), (), marks, tuple(order), tuple(spans))
            planned.append((qid, question, self._reading(question, suffix)))
        return planned

    # Rendering ---------------------------------------------------------------------------------------

    def _render(self, values: dict[str, Any], loc: tuple[str, ...]) -> str:
        try:
            return str(self._template.render(**self._user(values)))
        except Exception as error:  # an untrusted template may fail any way on any input
            raise TemplateRefused(loc, f"the model's systemone template did not render: {error}") from error


class Specials:
    """The special tokens a whole-prompt format reads: the mask, the separator (-1: none), and their texts."""

    def __init__(self, mask: int, sep: int, texts: dict[int, str]) -> None:
        self.mask, self.sep, self.texts = mask, sep, texts
