"""A request against the server's limits (max_questions, max_text_chars), checked before any inference:
what is beyond them, as 422 details in the contract's shape."""

from __future__ import annotations

from typing import Any

from app.wire.contract import SystemOneRequest, question_texts, render_text, validation_error


def limit_errors(request: SystemOneRequest, max_questions: int, max_text_chars: int) -> list[dict[str, Any]]:
    """422 details for a request beyond the server's limits, found before any inference."""
    errors: list[dict[str, Any]] = []
    if len(request.questions) > max_questions:
        errors += validation_error(
            ("questions",),
            f"{len(request.questions)} questions; the limit is {max_questions}",
            "too_long",
            len(request.questions),
        )
    for qid, question in request.questions.items():
        for loc, text in question_texts(question):
            length = len(render_text(text)) if text is not None else 0
            if length > max_text_chars:
                errors += validation_error(
                    ("questions", qid, question.type, *loc),
                    f"text of {length} characters; the limit is {max_text_chars}",
                    "string_too_long",
                    length,
                )
    return errors
