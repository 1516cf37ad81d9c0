"""The user's examples, as `onepass calibrate`, POST /v1/calibrations and `onepass label` read them.

An example is one state (with its images, as a JSON request carries them) with questions and,
optionally, the right answer per question id: `true`/`false` for a noul, an option name for a choice,
a level index for a score. Examples without answers are unlabelled: they feed the label-free batch
calibration only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from app.errors import InvalidRequest
from app.wire.assets import request_of
from app.wire.contract import ChoiceQuestion, NoulQuestion, Question, SystemOneRequest

# An example's images come as a request's do, in JSON: Jev's `assets` (base64) or llama.cpp's data URLs.
IMAGE_FIELDS = ("assets", "images", "files")
DRAWN_KEY = "x_drawn"  # false: the example was chosen for being unsure (onepass label's ranked states)


class ExampleError(ValueError):
    """An example that cannot be used; the message names it and says why."""


@dataclass(frozen=True)
class UserExample:
    """One of the user's examples: a request, and the right answers it gives."""

    request: SystemOneRequest
    answers: dict[str, int]  # question id -> index of the right label (labelled questions only)
    # Drawn like the traffic (not chosen for being unsure, `x_drawn: false`): its held-out answer may
    # calibrate the answer sets (app/calibration/conformal.py).
    drawn: bool = True
    where: str = "an example"  # how a message names it: "line 4" of a file, "example 2" of a list


def right_index(question: Question, value: Any) -> int:
    if isinstance(question, NoulQuestion):
        if not isinstance(value, bool):
            raise ValueError(f"a noul's answer is true or false, not {value!r}")
        return 0 if value else 1
    if isinstance(question, ChoiceQuestion):
        if value not in question.criteria:
            raise ValueError(f"{value!r} is not one of the options {sorted(question.criteria)}")
        return list(question.criteria).index(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(question.criteria):
        raise ValueError(f"a score's answer is a level index from 0 to {len(question.criteria) - 1}, not {value!r}")
    return value


def parse_examples(
    items: Iterable[Any], model: str = "jev-latest", where: Sequence[str] | None = None
) -> list[UserExample]:
    """The examples, checked; ExampleError names the first bad one as `where` does (default "example N")."""
    found = []
    for n, item in enumerate(items, 1):
        named = where[n - 1] if where is not None else f"example {n}"
        try:
            if not isinstance(item, dict):
                raise ValueError("an example is an object with state, questions and (optionally) answers")
            missing = [k for k in ("state", "questions") if k not in item]
            if missing:
                raise ValueError(f"an example needs {' and '.join(missing)}")
            body = {k: item[k] for k in ("state", "questions")} | {k: item[k] for k in IMAGE_FIELDS if k in item}
            request = request_of({"model": model, **body})
            answers = item.get("answers") or {}
            if not isinstance(answers, dict) or set(answers) - set(request.questions):
                raise ValueError("answers must be an object keyed by the example's question ids")
            drawn = item.get(DRAWN_KEY, True)
            if not isinstance(drawn, bool):
                raise ValueError(f"{DRAWN_KEY} is true or false, not {drawn!r}")
            indices = {}
            for qid, value in answers.items():
                try:
                    indices[qid] = right_index(request.questions[qid], value)
                except ValueError as error:
                    raise ValueError(f"answers.{qid}: {error}") from None
            found.append(UserExample(request, indices, drawn, named))
        except InvalidRequest as error:
            field = ".".join(str(part) for part in error.details[0]["loc"][1:]) if error.details else ""
            raise ExampleError(f"{named}: {field}: {error}") from None
        except (KeyError, ValueError) as error:
            raise ExampleError(f"{named}: {error}") from None
    if not found:
        raise ExampleError("no examples")
    return found


def json_lines(text: str, source: str = "") -> dict[int, Any]:
    """Each line that is not blank, by its number (from 1, blank lines counted), as JSON; ExampleError
    names a line that is not, after `source` (say the file's name)."""
    found = {}
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                found[n] = json.loads(line)
            except ValueError as error:
                raise ExampleError(f"{source}line {n}: not JSON ({error})") from None
    return found


def read_examples(text: str) -> list[UserExample]:
    """An examples file (JSON lines; blank lines skipped), each example named by its line."""
    lines = json_lines(text)
    return parse_examples(lines.values(), where=[f"line {n}" for n in lines])
