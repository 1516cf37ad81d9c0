"""The part every decision model's prompter shares: app/answering/decision.py's causal types and
app/answering/encoders.py's types read whole are both prompted through the GGUF's systemone template."""

from __future__ import annotations

from typing import Any

from app.answering import decision_text
from app.answering.decision_format import DecisionFormat
from app.answering.decision_media import PromptImages
from app.answering.prompter import ContextBound, Tokenizer, TooManyOptions
from app.answering.token_memo import TokenMemo
from app.engine.vision import Vision
from app.wire.contract import MAX_OPTIONS, ChoiceQuestion, Question, ScoreQuestion

RATING_POINTS = 9  # lev's noul: a rating from 0 (certainly no) to 8 (certainly yes)
# Recent prompts whose tokens are kept, each within the context (app/answering/token_memo.py): a
# repeated request (a cache hit) would otherwise tokenize its whole state again for every question.
PROMPT_MEMO = 128


class TemplatePrompter:
    """What every decision model's prompter shares (decision.py's causal types, encoders.py's whole ones):
    the systemone template, user text given with control tokens' texts broken, the tokens
    of recent prompts, the limit on options and the identity fits depend on."""

    layout = "state-first"

    def __init__(
        self,
        tokenizer: Tokenizer,
        fmt: DecisionFormat,
        control_texts: set[str],
        vision: Vision | None = None,
        ends: tuple[int | None, int | None] = (None, None),
        bound: ContextBound | None = None,
    ) -> None:
        """`control_texts`: the vocabulary's control tokens' texts (Vocabulary.control_texts); `vision`:
        the model's projector, where it has one; `ends`: the BOS and EOS its vocabulary adds (None: not);
        `bound`: the model's context, a prompt that cannot fit in it refused before it is tokenized."""
        self.tokenizer = tokenizer
        self.format = fmt
        self.decision_type = fmt.kind
        self._template = decision_text.environment().from_string(fmt.template)
        self._controls = sorted((t for t in control_texts if len(t) > 1), key=len, reverse=True)
        self._prompts = TokenMemo(PROMPT_MEMO, bound)
        self.images = PromptImages(fmt.kind, vision, self._tokens, *ends)

    @property
    def max_options(self) -> int:
        return MAX_OPTIONS

    @property
    def identity(self) -> str:
        return "\0".join(["systemone", self.format.kind, self.format.template])

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

    def _user(self, value: Any) -> Any:
        return decision_text.break_controls(value, self._controls)

    def _tokens(self, text: str) -> tuple[int, ...]:
        """A rendered prompt's tokens (TooLongForContext where it cannot fit), kept while recent."""
        return self._prompts.text(text, lambda text: self.tokenizer.tokenize(text, add_bos=False, special=True))
