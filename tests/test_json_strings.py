"""app/wire/json_strings.py: the one walk over a JSON value's strings changes the strings alone (the keys
too only when asked), keeps every other value, and meets the strings in the order the prompt renders
them."""

from __future__ import annotations

from app.wire.json_strings import map_strings

VALUE = {"b": ["x<a>", 1, 2.5, True, None, {"<a>": "<a>"}], "a": "<a>"}


def test_strings_change_and_keys_stay_unless_asked() -> None:
    def marked(text: str) -> str:
        return text.replace("<a>", "[0]")

    assert map_strings(VALUE, marked) == {"b": ["x[0]", 1, 2.5, True, None, {"<a>": "[0]"}], "a": "[0]"}
    assert map_strings(VALUE, marked, keys=True) == {"b": ["x[0]", 1, 2.5, True, None, {"[0]": "[0]"}], "a": "[0]"}
    assert map_strings("plain <a>", marked) == "plain [0]" and map_strings(7, marked) == 7


def test_strings_are_met_in_key_order_or_sorted_and_objects_built_so() -> None:
    met: list[str] = []

    def seen(text: str) -> str:
        met.append(text)
        return text

    assert list(map_strings(VALUE, seen)) == ["b", "a"]
    assert met == ["x<a>", "<a>", "<a>"]
    met.clear()
    assert list(map_strings(VALUE, seen, sort_keys=True)) == ["a", "b"]
    assert met == ["<a>", "x<a>", "<a>"]
