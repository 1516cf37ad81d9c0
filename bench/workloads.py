"""The bench's workloads: the questions it asks, the sentences its states are made of, and states of
a given token length."""

from __future__ import annotations

from typing import Any

from app.engine.engine import Engine
from bench.client import sized_text

QUESTIONS: list[dict[str, Any]] = [
    {"type": "noul", "instructions": "Does the customer ask for money back?"},
    {
        "type": "choice",
        "instructions": "Which team handles it?",
        "criteria": {"Billing": "Payments and refunds", "Technical": "Bugs and outages", "Sales": None},
    },
    {"type": "score", "instructions": "How frustrated is the customer?", "criteria": ["Calm", "Annoyed", "Furious"]},
    {"type": "noul", "instructions": "Is the message written in English?"},
    {"type": "choice", "instructions": "What is the sentiment?", "criteria": {"positive": None, "negative": None}},
    {"type": "noul", "instructions": "Does the message mention a date?"},
    {"type": "score", "instructions": "How urgent is it?", "criteria": ["Can wait", "This week", "Today", "Now"]},
    {"type": "noul", "instructions": "Is an order number given?"},
    {"type": "choice", "instructions": "Which channel fits the reply?", "criteria": {"email": None, "phone": None}},
    {"type": "noul", "instructions": "Is the customer threatening to leave?"},
]
SENTENCES = [
    "Order {n} was charged twice on my card and I still have not received the parcel.",
    "Support promised a call back on Monday {n} but nobody ever called me.",
    "I want a refund for the duplicate charge, and I am close to cancelling my plan.",
    "The tracking page for shipment {n} has said 'in transit' for nine days now.",
]


class StateMaker:
    """States of (about) a given token count, each new one different from all before."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.count = 0

    def make(self, tokens: int) -> str:
        self.count += 1
        return sized_text(self.engine, SENTENCES, tokens, self.count)
