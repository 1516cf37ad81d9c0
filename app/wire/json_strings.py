"""The one walk over the strings of a JSON value (a request's text: a string, or objects and arrays of
them): placeholders found and replaced, a decision template's values escaped, keys sorted.

Recursive: the values walked here come from a body app/http/body.py has checked to a bounded depth.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def map_strings(value: Any, change: Callable[[str], str], *, keys: bool = False, sort_keys: bool = False) -> Any:
    """`value` with `change` applied to each string in it, in the order the prompt renders them: an
    array's items in order, an object's values in its key order, or sorted when `sort_keys` (the
    object is then built in that order too). An object's keys are changed too when `keys`. Numbers,
    booleans and null are kept as they are."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        names = sorted(value) if sort_keys else list(value)
        return {
            (change(name) if keys else name): map_strings(value[name], change, keys=keys, sort_keys=sort_keys)
            for name in names
        }
    if isinstance(value, list):
        return [map_strings(item, change, keys=keys, sort_keys=sort_keys) for item in value]
    return value
