"""One word per thing, kept: docs/architecture.md's glossary names only what app/ defines, no two
classes or type aliases of app/ share a name, no class is named by a bare participle (when it was
made, not what it is), the names retired for meaning two things stay retired, the user pages call
the cache by its user word, and the page's count of rooms and layers is app/'s."""

from __future__ import annotations

import ast
import builtins
import re
from collections import defaultdict
from functools import cache
from pathlib import Path

from app.paths import REPO_ROOT
from tests.support.floor_plan import LAYERS

APP = REPO_ROOT / "app"
ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
# The pages a user reads (docs/notes/ is the developers' diary, CHANGELOG.md history).
USER_PAGES = [
    REPO_ROOT / "README.md",
    REPO_ROOT / "bench" / "README.md",
    *sorted(p for p in (REPO_ROOT / "docs").glob("*.md")),
]
# Words the user pages no longer use, each with the word they use instead.
RETIRED_WORDS = {"prefix cache": "session cache", "snapshot cache": "session cache"}
# A class named by one word ending in -ed says when it was made, not what it holds ("Answered",
# "Decoded", "Resolved" were such names). An exception is named for what happened, so it may be one.
PARTICIPLE = re.compile(r"[A-Z][a-z]+ed")
# Class names retired because each meant two things or said when its thing was made, with what
# took their place: none comes back.
RETIRED_CLASS_NAMES = {
    "Answered": "SuffixReadouts (engine), ExampleEvidence (fitting/runner.py)",
    "Asked": "QuestionReadouts",
    "Batch": "BatchCandidate",
    "Calibrated": "AnswerProbabilities",
    "Choice": "FitChoice (contract.ChoiceQuestion is the question type)",
    "Decoded": "RequestReadouts",
    "Encoded": "PromptVectors",
    "Job": "SuffixTokens (app/jobs.py's BackgroundJob is a job)",
    "Parsed": "UserExample",
    "Probe": "ProbeCandidate",
    "Reloaded": "SettingsReload",
    "Resolved": "ResolvedPrefix",
    "Temperature": "TemperatureCandidate",
    "Variant": "SuffixProtocol",
    "Vector": "VectorCandidate (policy.py's Vector is an array type)",
}
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")


@cache
def modules() -> dict[str, ast.Module]:
    """Every module of app/ by its dotted name under app: "engine.tiers"; a package by its own name."""
    found = {}
    for path in sorted(APP.rglob("*.py")):
        parts = path.relative_to(APP).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = ast.parse(path.read_text(encoding="utf-8"))
    return found


@cache
def classes() -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Every class of app/, nested ones too, by name: the modules that define one of that name."""
    found: dict[str, list[tuple[str, ast.ClassDef]]] = defaultdict(list)
    for module, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found[node.name].append((module, node))
    return dict(found)


def top_level_names(tree: ast.Module) -> set[str]:
    """The functions, classes and variables a module defines at its top level."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def attributes(node: ast.ClassDef) -> set[str]:
    """A class's fields, methods and properties, and what its methods assign to `self`."""
    found = top_level_names(ast.Module(body=node.body, type_ignores=[]))
    for inner in ast.walk(node):
        if isinstance(inner, ast.Assign | ast.AnnAssign):
            targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
            for target in (t for each in targets for t in ast.walk(each)):  # `self.a, b = ...` too
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    found.add(target.attr)
    return found


def is_exception(name: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether app/'s class `name` derives from BaseException, through builtins and app/'s classes."""
    for _, node in classes().get(name, []):
        for base in node.bases:
            base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
            builtin = getattr(builtins, base_name, None)
            if isinstance(builtin, type) and issubclass(builtin, BaseException):
                return True
            if base_name in classes() and base_name not in seen and is_exception(base_name, seen | {name}):
                return True
    return False


def section(page: Path, heading: str) -> list[tuple[int, str]]:
    """The numbered lines of `page` under the heading `heading`, up to the next heading of its level."""
    lines = page.read_text(encoding="utf-8").splitlines()
    level = heading.split(" ", 1)[0]
    start = lines.index(heading)
    found = []
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("#") and line.split(" ", 1)[0] == level:
            break
        found.append((number, line))
    return found


def glossary() -> list[tuple[int, list[str]]]:
    """The glossary table's rows, each with its line: its cells."""
    rows = [
        (n, [c.strip() for c in line.strip().strip("|").split("|")])
        for n, line in section(ARCHITECTURE, "## Glossary")
        if line.startswith("|")
    ]
    assert rows and rows[0][1] == ["word", "in the code", "what it is"], "the glossary's header row changed"
    return rows[2:]  # below the header and its rule


def resolve(name: str) -> str | None:
    """Why `name` (`[module.]Name[.attribute]` or `[module.]function`) is not something app/ defines; None if it is."""
    parts = name.split(".")
    start = 0
    while start < len(parts) - 1 and ".".join(parts[: start + 1]) in modules():
        start += 1
    module, rest = ".".join(parts[:start]), parts[start:]
    where = [m for m in modules() if not module or m == module or m.startswith(module + ".")]
    if len(rest) > 2:
        return "not [module.]Name[.attribute]"
    if rest[0][:1].isupper():
        found = [node for m, node in classes().get(rest[0], []) if m in where]
        if not found and len(rest) == 1 and any(rest[0] in top_level_names(modules()[m]) for m in where):
            return None  # a type alias: wire.contract.Question
        if not found:
            return f"no class {rest[0]} in app/{module.replace('.', '/')}"
        if len(rest) == 2 and not any(rest[1] in attributes(node) for node in found):
            return f"{rest[0]} has no attribute {rest[1]}"
        return None
    if len(rest) == 2 or not any(rest[0] in top_level_names(modules()[m]) for m in where):
        return f"nothing named {rest[0]} in app/{module.replace('.', '/')}"
    return None


def test_the_glossary_names_only_what_the_code_defines() -> None:
    problems, named = [], 0
    for line, cells in glossary():
        for name in re.findall(r"`([^`]+)`", cells[1]):
            named += 1
            why = resolve(name)
            if why is not None:
                problems.append(f"docs/architecture.md:{line}: `{name}`: {why}")
    assert named > 20, "the glossary names too few things to be read"
    assert not problems, f"{len(problems)} glossary names the code does not define:\n" + "\n".join(problems)


def test_the_resolver_refuses_what_is_not_there() -> None:
    assert resolve("engine.tiers.PrefixCache") is None
    assert resolve("Readout.hidden") is None
    assert resolve("ModelService.base") is None  # assigned in __init__
    assert resolve("wire.contract.Question") is None  # a type alias
    assert resolve("contract.Question.type") is not None  # an alias has no attributes to check
    assert resolve("engine.tiers.Snapshot") is not None  # imported there, defined in engine/snapshot.py
    assert resolve("Readout.nothing") is not None
    assert resolve("NoSuchClass") is not None
    assert resolve("no_such_function") is not None


def type_aliases() -> dict[str, list[str]]:
    """Every top-level name of app/ in CapWords that is not a class (`Vector = NDArray[...]`): the modules."""
    found: dict[str, list[str]] = defaultdict(list)
    for module, tree in modules().items():
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name) and target.id[:1].isupper() and not target.id.isupper():
                        found[target.id].append(module)
    return dict(found)


def test_no_two_classes_or_type_aliases_share_a_name() -> None:
    defined: dict[str, list[str]] = defaultdict(list)
    for name, found in classes().items():
        defined[name] += [m for m, _ in found]
    for name, modules_of in type_aliases().items():
        defined[name] += modules_of
    shared = {name: where for name, where in defined.items() if len(where) > 1}
    assert not shared, "names defined more than once in app/ (one name, one thing): " + ", ".join(
        f"{name} in {' and '.join(where)}" for name, where in sorted(shared.items())
    )


def test_no_class_is_named_by_a_bare_participle() -> None:
    named = sorted(name for name in classes() if PARTICIPLE.fullmatch(name) and not is_exception(name))
    assert not named, f"classes named for when they were made, not for what they hold: {', '.join(named)}"


def test_no_retired_class_name_comes_back() -> None:
    back = sorted(name for name in classes() if name in RETIRED_CLASS_NAMES)
    assert not back, "retired class names: " + ", ".join(f"{name} (now {RETIRED_CLASS_NAMES[name]})" for name in back)


def test_the_participle_check_tells_exceptions_apart() -> None:
    assert PARTICIPLE.fullmatch("Answered") and not PARTICIPLE.fullmatch("ResolvedPrefix")
    assert is_exception("Cancelled")  # through ApiError
    assert not is_exception("PrefixCache")


def test_the_user_pages_call_the_cache_by_its_user_word() -> None:
    problems = []
    for page in USER_PAGES:
        # The glossary says which word the code uses for the session cache.
        glossary_lines = {n for n, _ in section(ARCHITECTURE, "## Glossary")} if page == ARCHITECTURE else set()
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for word, instead in RETIRED_WORDS.items():
                if number not in glossary_lines and re.search(rf"\b{word}s?\b", line, re.IGNORECASE):
                    problems.append(f"{page.relative_to(REPO_ROOT)}:{number}: {word!r}: say {instead!r}")
    assert not problems, f"{len(problems)} retired words on the user pages:\n" + "\n".join(problems)


def test_the_page_counts_apps_rooms_and_layers() -> None:
    rooms = sorted(p.name for p in APP.iterdir() if (p / "__init__.py").is_file())
    text = "\n".join(line for _, line in section(ARCHITECTURE, "## The code"))
    said = re.search(r"a ground floor and (\w+) rooms \(its subpackages\) on (\w+) layers", " ".join(text.split()))
    assert said is not None, "docs/architecture.md no longer says how many rooms app/ has, on how many layers"
    assert said[1] == NUMBERS[len(rooms)], f"app/ has {len(rooms)} rooms ({', '.join(rooms)}), the page says {said[1]}"
    listed = re.findall(r"^\| (\d+) \| `(\w+)/` \|", text, re.MULTILINE)
    assert sorted(room for _, room in listed) == rooms, "the layer table lists app/'s rooms, each once"
    for layer, room in listed:  # as tests/test_layering.py holds them
        assert room in LAYERS[int(layer) - 1], f"the page puts {room}/ on layer {layer}"
    rooms_layers = {layer for layer, room in listed}
    assert said[2] == NUMBERS[len(rooms_layers)], (
        f"the rooms stand on {len(rooms_layers)} layers, the page says {said[2]}"
    )
