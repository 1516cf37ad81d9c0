"""The text around a decision GGUF's template, as llama.cpp's server makes it (its
tools/server/server-decision.cpp): the template environment, the transforms of the values a
template is given, and lfm2-d1's labels. Prompts rendered here tokenize exactly as llama-server's.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable, Sequence
from itertools import product
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.answering.decision_format import DecisionError
from app.answering.prompter import Tokenizer
from app.wire.contract import MAX_OPTIONS
from app.wire.json_strings import map_strings

SPECIAL = re.compile(r"<\|([A-Za-z0-9_]+)\|>")
BROKEN_BAR = "\u00a6"  # what kev and lfm2-d1-omni write instead of the bars of a special token in user text
WORD_JOINER = "\u2060"  # what onepass puts inside any other control token's text in user values


def environment() -> ImmutableSandboxedEnvironment:
    """A sandbox for an untrusted template, with llama.cpp's tojson and raise_exception."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise_template_error
    return env


def tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Sequence[str] | None = None
) -> str:
    """A value's JSON as llama.cpp's template engine prints it: key order kept, non-ASCII as itself,
    ", " and ": " between items and keys unless `separators` says otherwise."""
    found = list(separators or ())
    item = found[0] if found else (", " if indent is None else ",")
    key = found[1] if len(found) > 1 else ": "
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=(item, key))


def _raise_template_error(message: str) -> None:
    raise TemplateError(message)


def sort_keys(value: Any) -> Any:
    """Every object's keys in sorted order (lev and clef were trained so)."""
    return map_strings(value, lambda text: text, sort_keys=True)


def replace_text(value: Any, search: str, replace: str) -> Any:
    """`search` replaced in every string of a JSON value (not in the keys)."""
    return map_strings(value, lambda text: text.replace(search, replace))


def escape_specials(text: str) -> str:
    """`<|name|>` in user text written `<¦name¦>`, so that it is never read as a special token."""
    return SPECIAL.sub(lambda found: f"<{BROKEN_BAR}{found[1]}{BROKEN_BAR}>", text)


def escape_specials_deep(value: Any) -> Any:
    """escape_specials over every string of a JSON value, the keys of objects too (lfm2-d1-omni)."""
    return map_strings(value, escape_specials, keys=True)


def kev_render(value: Any, indent: int = 0) -> str:
    """A JSON value as kev reads it: text, the keys of objects kept as labels, lists as "- " items."""
    pad = "  " * indent
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, list):
        lines = []
        for item in value:
            text = kev_render(item, indent + 1).lstrip(" \t\n\r")
            lines.append(f"{pad}- {text}")
        return "\n".join(lines)
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            nested = isinstance(item, dict | list)
            between = ":\n" if nested else ": "
            lines.append(f"{pad}{key}{between}{kev_render(item, indent + 1 if nested else 0)}")
        return "\n".join(lines)
    return json.dumps(value)


def kev_text(value: Any) -> str:
    """kev's text of a JSON value, with its special-token spellings broken."""
    return escape_specials(kev_render(value))


def d1_labels(
    tokenize: Callable[[str], list[int]], kind: str, keys: Sequence[str]
) -> tuple[list[str], list[tuple[int, ...]]]:
    """lfm2-d1's label of each option (`keys`, in the prompt's order; `kind` the question's type)
    and the group of tokens whose largest logit is its score. `tokenize`: text to tokens, special
    tokens not parsed. Raises ValueError where the vocabulary has no label left."""

    def single(forms: Sequence[str]) -> tuple[int, ...]:
        found: list[int] = []
        for form in forms:
            tokens = tokenize(form)
            if len(tokens) == 1 and tokens[0] not in found:
                found.append(tokens[0])
        return tuple(found)

    if kind != "choice":
        groups = [
            single([key] if kind == "score" else ["yes", "Yes", "YES"] if key == "true" else ["no", "No", "NO"])
            for key in keys
        ]
        if not all(groups):
            raise ValueError("a decision label is not a single token")
        return list(keys), groups
    letters = all(len(key) == 1 and key.isascii() and key.isalpha() for key in keys)
    codes = [key if letters else chr(ord("A") + i) if len(keys) <= 26 else f"{i:02d}" for i, key in enumerate(keys)]
    pool = [
        *(chr(c) for c in range(ord("A"), ord("Z") + 1)),
        *(f"{i:02d}" for i in range(100)),
        *(chr(c) for c in range(ord("a"), ord("z") + 1)),
        *(f"#{i}" for i in range(200)),
        *("".join(pair) for pair in product([chr(c) for c in range(ord("A"), ord("Z") + 1)], repeat=2)),
    ]
    used: set[int] = set()
    texts, found_groups = [], []
    for code in codes:
        for candidate in (code, *pool):
            tokens = tokenize(candidate)
            if len(tokens) == 1 and tokens[0] not in used:
                used.add(tokens[0])
                texts.append(candidate)
                found_groups.append((tokens[0], *(t for t in single([" " + candidate]) if t != tokens[0])))
                break
        else:
            raise ValueError(f"no single-token label left for {len(keys)} options")
    return texts, found_groups


def break_controls(value: Any, controls: Sequence[str]) -> Any:
    """User values with any control token's text (`controls`, longest first) broken by a word joiner,
    so that it stays text when the prompt is tokenized with special tokens parsed."""

    def broken(text: str) -> str:
        for control in controls:
            if control in text:
                text = text.replace(control, control[0] + WORD_JOINER + control[1:])
        return text

    return map_strings(value, broken, keys=True)


def pick_labels(tokenizer: Tokenizer, kind: str) -> tuple[tuple[str, int], ...]:
    """The type's label codes as (text, token): each must be one token, written with no space before.
    lfm2-d1 picks its labels per question, kev reads no labels: none here."""
    if kind in ("lfm2-d1", "kev"):
        return ()
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
            if len(picked) == MAX_OPTIONS:
                break
    if not picked:
        raise DecisionError(f"the vocabulary has no single-token labels for a {kind} model")
    return tuple((code, token) for token, code in picked.items())


def common(sequences: Sequence[Sequence[int]]) -> tuple[int, ...]:
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


def common_text(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
