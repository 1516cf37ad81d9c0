"""The requests the examples send: a support ticket asked three questions, a batch with a refused item,
labelled examples for a fit, and a parcel's photo asked about."""

from __future__ import annotations

from typing import Any

REFUND = {"type": "noul", "instructions": "Does the customer ask for money back?"}
TICKET: dict[str, Any] = {
    "model": "jev-latest",
    "state": "I was charged twice for March and want my money back.",
    "questions": {
        "refund": REFUND,
        "team": {
            "type": "choice",
            "instructions": "Which team handles it?",
            "criteria": {"Billing": "Payments and refunds", "Technical": None},
        },
        "anger": {
            "type": "score",
            "instructions": "How frustrated is the customer?",
            "criteria": ["Calm", "Annoyed", "Furious"],
        },
    },
}
BATCH: dict[str, Any] = {
    "requests": [
        {"model": "jev-latest", "state": "I was charged twice for March.", "questions": {"refund": REFUND}},
        {"model": "jev-latest", "state": "My parcel never arrived.", "questions": {"refund": {"type": "maybe"}}},
        {"model": "gpt-5", "state": "Hello?", "questions": {"q": {"type": "noul"}}},
        {
            "model": "jev-latest",
            "state": "I was charged twice for March.",
            "questions": {"team": {"type": "choice", "criteria": {"Billing": None, "Shipping": None}}},
        },
    ]
}
PARCEL = {"damaged": {"type": "noul", "instructions": "Is the parcel in <photo> damaged?"}}


def ticket(n: int, model: str = "jev-latest") -> dict[str, Any]:
    return {"model": model, "state": f"Ticket {n}: my parcel is late.", "questions": {"refund": REFUND}}


def example(n: int) -> dict[str, Any]:
    """A labelled example for fitting: the odd ones ask for a refund."""
    state = f"Ticket {n}: I want a refund for order {n}." if n % 2 else f"Ticket {n}: How do I reset my password?"
    return {"state": state, "questions": {"refund": REFUND}, "answers": {"refund": bool(n % 2)}}
