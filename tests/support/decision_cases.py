"""Decision-model GGUFs for the tests: tiny models carrying each kind's template (labels printed as the
format's rules say), the questions and the state the tests ask them, and the temperatures they carry."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from app.answering.decision import DecisionPrompter
from app.answering.service import ModelService
from app.platform.tiny_gguf import write_tiny_gguf
from tests.support.loading import load_model
from tests.support.settings import tiny_settings

TEXT = "{% if v is string %}{{ v }}{% else %}{{ v | tojson }}{% endif %}"

CODES = string.ascii_uppercase + string.ascii_lowercase


def labelled(code: str) -> str:
    """A state-first template (Qwen-style turns) that prints each option with `code`."""
    return (
        "<|im_start|>system\nAnswer with one code.<|im_end|>\n<|im_start|>user\nState:\n"
        + TEXT.replace("v", "state")
        + "\n\nQuestion {{ id }} ({{ type }}): "
        + TEXT.replace("v", "instructions")
        + "\n{% for o in options %}"
        + code
        + ". {{ o.key }}{% if o.description is not none %}: "
        + TEXT.replace("v", "o.description")
        + "{% endif %}\n{% endfor %}<|im_end|>\n<|im_start|>assistant\n"
    )


LABELLED = labelled("{{ o.label }}")

RATING = "{% if type == 'noul' %}Rate it from A (certainly no) to I (certainly yes).\n{% endif %}"

LEV = LABELLED.replace(  # lev reads a noul as a rating at its first nine labels
    "<|im_end|>\n<|im_start|>assistant", RATING + "<|im_end|>\n<|im_start|>assistant"
)

OPENJEV = labelled("{{ '" + CODES + "'[loop.index0] }}")

NIMBLE = LABELLED.replace(
    "\n\nQuestion {{ id }}",
    "\n\nAll questions: {% for q in questions %}{{ q.id }}={{ q.type }} {% endfor %}\n\nQuestion {{ id }}",
)

QUESTION_FIRST = (
    "<|im_start|>user\nQuestion ({{ type }}): "
    + TEXT.replace("v", "instructions")
    + "\n{% for o in options %}{{ o.label }}. {{ o.key }}\n{% endfor %}State:\n"
    + TEXT.replace("v", "state")
    + "<|im_end|>\n<|im_start|>assistant\n"
)

TEMPLATES = {"openjev": OPENJEV, "lev": LEV, "nimble": NIMBLE, "pplx-decider": LABELLED}


def decision_gguf(folder: Path, kind: str, template: str, temperatures: dict[str, float] | None = None) -> Path:
    metadata: dict[str, str | float] = {"llama.decision.type": kind}
    metadata |= {f"llama.decision.temperature.{k}": v for k, v in (temperatures or {}).items()}
    return write_tiny_gguf(folder / f"{kind}.gguf", seed=7, systemone=template, metadata=metadata)


def serve(path: Path, **settings: Any) -> ModelService:
    return load_model(tiny_settings(path, **({"n_ctx": 1024, "calibration": "none"} | settings)))


def decision_prompter(service: ModelService) -> DecisionPrompter:
    assert isinstance(service.prompter, DecisionPrompter)
    return service.prompter


QUESTIONS: dict[str, Any] = {
    "angry": {"type": "noul", "instructions": "Is the customer angry?", "criteria": {"true": "upset", "false": None}},
    "queue": {
        "type": "choice",
        "instructions": "Which queue?",
        "criteria": {"Billing": "money", "Tech": None, "Ship": {"k": 1}},
    },
    "level": {"type": "score", "instructions": {"ask": "How urgent?"}, "criteria": ["low", "mid", "high", "now"]},
}

STATE = {"ticket": "My refund never came.", "plan": "Pro"}

TEMPERATURES = {"noul": 0.5, "choice": 2.0, "choice.3_5": 0.7, "choice.small": 1.5, "score": 0.8}
