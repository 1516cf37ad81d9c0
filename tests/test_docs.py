"""The pages hold together and say what the repository has: every path, section, make target, flag,
route and module that the README, docs/, bench/README.md and the config files' comments name is one that is there.

Each check reports every offence at once (file:line: what is wrong), so that the pages can be fixed
in one pass. CHANGELOG.md is left out: history may name what is gone.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path

from starlette.routing import Route

from app.config import OPTIONS, flag
from app.http.routes import API_ROUTES
from app.paths import REPO_ROOT
from app.serving import settings_reference
from app.serving.known_models import default_model_path
from tests.support.pages import PAGES, Page, Text, makefile_rules, read_page, report

CONFIG_FILES = [REPO_ROOT / "models" / "onepass.toml", REPO_ROOT / "deploy" / "haproxy.cfg"]  # their comments
# The code's comments and docstrings cite files and pages too (this file is left out: it names some as examples).
CODE_FOLDERS = ("app", "bench", "models", "tools", "tests")
CODE_FILES = [
    *sorted(p for f in CODE_FOLDERS for p in (REPO_ROOT / f).rglob("*.py") if p != Path(__file__).resolve()),
    *(REPO_ROOT / name for name in ("pyproject.toml", "Makefile", ".ci/run")),
]

# A cited repository path starts with a top-level folder, or is a top-level file.
TOP_FOLDERS = ("app", "bench", "docs", "tests", "models", "deploy", "tools", "examples", ".ci")
TOP_FILES = ("README.md", "CHANGELOG.md", "LICENSE", "Makefile", "pyproject.toml")

# Cited paths that are not in a checkout, each for the reason its page gives. Globs and placeholders
# (`*`, `{json,md}`, `<model>`) are not checked; every other cited path must exist.
NOT_IN_A_CHECKOUT = {
    f"models/{default_model_path().name}": "`make model` assembles it (models/*.gguf is git-ignored)",
    # llama.cpp's repository, where docs/decision-models.md learnt the decision format
    "tools/server/server-decision.cpp": "llama.cpp's",
    "models/twin.gguf": "docs/gpu.md: what `python -m bench.twin write` makes on a machine without the model",
    # finished studies, deleted; docs/notes/2026-12-02-pipeline-readouts.md says how git history gives them back
    "bench/readout_variants.py": "docs/notes/2026-12-02-pipeline-readouts.md: at cfb45f8",
    "bench/probe_layers.py": "docs/notes/2026-12-02-pipeline-readouts.md: at cfb45f8",
}
# The code's example command lines name files a user chooses or the command writes.
EXAMPLES_IN_THE_CODE = {
    "models/x.gguf": "the Makefile: make bench / make check-gpu with another model",
    "models/other.gguf": "the Makefile: make eval with another model",
    "models/twin.gguf": "bench/twin.py: what `python -m bench.twin write` makes",
}

# Flags the pages give, in code of their own, for programs that are not onepass's.
OTHER_PROGRAMS_FLAGS = {
    "--no-repack": "llama-server's (docs/performance.md: how the bench passes it the setting)",
    "-march": "the compiler's (docs/troubleshooting.md: never used)",
    "-DGGML_METAL": "CMake's (docs/gpu.md: what GPU=metal passes to the build)",
}


# ---------------------------------------------------------------------------------------------------
# Reading the pages


@cache
def read_config(source: Path) -> Page:
    """A config file: its comments only."""
    page = Page(source)
    for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
        if "#" in line:
            comment = Text(source, number, line[line.index("#") + 1 :])
            page.plain.append(comment)
            page.comments.append(comment)
    return page


def documents() -> list[Page]:
    return [*map(read_page, PAGES), *map(read_config, CONFIG_FILES)]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for heading in read_page(page).headings:
        slug, n = anchor(heading), 1
        while slug in found:  # GitHub numbers a repeated heading's anchor: -1, -2, ...
            slug, n = f"{anchor(heading)}-{n}", n + 1
        found.add(slug)
    return found


def test_anchors_follow_githubs_rules() -> None:
    assert anchor("Every `error_type`") == "every-error_type"
    assert anchor("Prompt layouts: repeated states or pipelines") == "prompt-layouts-repeated-states-or-pipelines"
    assert anchor("Why the question-first layout loses `choice` (2026-11-30)") == (
        "why-the-question-first-layout-loses-choice-2026-11-30"
    )


# ---------------------------------------------------------------------------------------------------
# 1, 2: paths, and the sections they point into

REPO_PATH = re.compile(
    r"(?<![\w./~$-])"
    rf"(?P<path>(?:{'|'.join(map(re.escape, TOP_FOLDERS))})/[\w./*{{}}<>-]*"
    rf"|(?:{'|'.join(map(re.escape, TOP_FILES))})(?![\w.-]))"
    r"(?::(?P<first>\d+)(?:-(?P<last>\d+))?)?"
    r"(?:#(?P<anchor>[\w-]+))?"
)
TEMPLATE = re.compile(r"[*{}<>]")  # a glob or a placeholder, not one file
# A page cited by a section's name: (README, "Deploying") or (docs/models.md, "Prompt layouts")
SECTION = re.compile(r"(?P<page>README(?:\.md)?|[\w./-]+\.md),? \"(?P<section>[^\"]+)\"")


def citation_problems(where: str, target: Path, shown: str, line: str | None, section: str | None) -> list[str]:
    """What is wrong with a citation of `target`, with a line number or a section of a page."""
    if not target.exists():
        return [f"{where}: {shown} does not exist"]
    problems = []
    if line is not None:
        lines = len(target.read_text(encoding="utf-8").splitlines()) if target.is_file() else 0
        if int(line) > lines:
            problems.append(f"{where}: {shown}:{line}: it has {lines} lines")
    if section is not None and target.suffix == ".md" and section not in anchors(target):
        problems.append(f"{where}: {shown}#{section}: it has no such heading")
    return problems


def path_problems(texts: Sequence[Text], allowed: Mapping[str, str], cited: set[str]) -> list[str]:
    """Every repository path in `texts` exists (less globs, placeholders and the `allowed` ones)."""
    problems = []
    for text in texts:
        for found in REPO_PATH.finditer(text.text):
            path = found["path"].rstrip(".")
            if TEMPLATE.search(path):
                continue
            cited.add(path)
            if path not in allowed:
                where = text.at(found.start())
                last = found["last"] or found["first"]  # path:12 or path:12-30
                problems += citation_problems(where, REPO_ROOT / path, path, last, found["anchor"])
    return problems


def section_problems(texts: Sequence[Text]) -> list[str]:
    """A page cited by a section's name has a heading that starts so."""
    problems = []
    for text in texts:
        for found in SECTION.finditer(text.text):
            name = found["page"] if found["page"].endswith(".md") else "README.md"
            page = REPO_ROOT / name if "/" in name or name == "README.md" else text.source.parent / name
            if not page.is_file():
                problems.append(f"{text.at(found.start())}: {name} does not exist")
            elif not any(h.lower().startswith(found["section"].lower()) for h in read_page(page).headings):
                problems.append(f'{text.at(found.start())}: {name} has no section "{found["section"]}"')
    return problems


def unused(allowed: Mapping[str, str], cited: set[str], name: str) -> list[str]:
    return [f"{name}: {path} is cited nowhere now: drop it" for path in sorted(allowed.keys() - cited)]


def test_every_cited_path_exists() -> None:
    problems: list[str] = []
    cited: set[str] = set()
    for document in documents():
        problems += path_problems(document.plain, NOT_IN_A_CHECKOUT, cited)
        for link in document.links:
            target, _, section = link.text.partition("#")
            if target and not re.match(r"[a-z]+:|[/~]", target):  # not a URL, an absolute path, this page
                problems += citation_problems(link.at(), link.source.parent / target, target, None, section or None)
    problems += unused(NOT_IN_A_CHECKOUT, cited, "NOT_IN_A_CHECKOUT")
    assert not problems, report(problems, "cited paths that are not there")


def test_every_section_cited_is_a_heading() -> None:
    problems = []
    for document in documents():
        for link in document.links:
            if link.text.startswith("#") and link.text[1:] not in anchors(link.source):
                problems.append(f"{link.at()}: {link.text}: this page has no such heading")
        problems += section_problems(document.plain)
    assert not problems, report(problems, "sections cited that are not there")


def test_the_code_cites_only_files_and_sections_that_are_there() -> None:
    problems: list[str] = []
    cited: set[str] = set()
    for source in CODE_FILES:
        text = [Text(source, 1, source.read_text(encoding="utf-8"))]
        problems += path_problems(text, {**NOT_IN_A_CHECKOUT, **EXAMPLES_IN_THE_CODE}, cited)
        problems += section_problems(text)
    problems += unused(EXAMPLES_IN_THE_CODE, cited, "EXAMPLES_IN_THE_CODE")
    assert not problems, report(problems, "files or sections the code cites that are not there")


# ---------------------------------------------------------------------------------------------------
# Commands the pages give: make, onepass, python -m


@dataclasses.dataclass(frozen=True)
class Command:
    where: str
    program: str  # "make", or the module run (`onepass` runs "app")
    args: tuple[str, ...]
    text: str  # as the page writes it


SEPARATORS = re.compile(r"&&|\|\||[|;]")
PYTHON = re.compile(r"python(?:3(?:\.\d+)?)?")
# In a comment, a command is `python -m MODULE ...` up to a comma or a parenthesis, or `make TARGET`.
IN_A_COMMENT = re.compile(r"(?<![\w.-])(?:(?:\S*/)?python3?\s+-m\s+[\w.]+[^;,()#|]*|make\s+[\w.-]+)")


def words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote: an apostrophe
        return text.split()


def parse_command(where: str, text: str) -> Command | None:
    """`text` as a command of onepass's (make, onepass, python -m), or None for any other program."""
    given = words(text)
    while given and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", given[0]):  # VAR=value before the program
        given.pop(0)
    program = given[0].rsplit("/", 1)[-1] if given else ""
    if program == "make":
        return Command(where, "make", tuple(given[1:]), text.strip())
    if program == "onepass":
        return Command(where, "app", tuple(given[1:]), text.strip())
    if PYTHON.fullmatch(program) and len(given) > 2 and given[1] == "-m":
        return Command(where, given[2], tuple(given[3:]), text.strip())
    return None


def commands() -> Iterator[Command]:
    """Every command in inline code and code blocks, and in comments `python -m ...` and `make TARGET`."""
    for document in documents():
        for text in document.code:
            for piece in SEPARATORS.split(text.text):
                if (found := parse_command(text.at(), piece)) is not None:
                    yield found
        for text in document.comments:
            for match in IN_A_COMMENT.finditer(text.text):
                if (found := parse_command(text.at(), match[0].rstrip(" .:"))) is not None:
                    yield found


# ---------------------------------------------------------------------------------------------------
# 3: make targets


def make_targets(run: Command) -> list[str]:
    return [w for w in run.args if not w.startswith("-") and "=" not in w]


def make_assignments(run: Command) -> dict[str, str]:
    return dict(w.split("=", 1) for w in run.args if re.fullmatch(r"[A-Za-z_]\w*=.*", w))


def test_every_make_target_is_in_the_makefile() -> None:
    problems = [
        f"{run.where}: `{run.text}`: the Makefile has no target {target!r}"
        for run in commands()
        if run.program == "make"
        for target in make_targets(run)
        if target not in makefile_rules()
    ]
    assert not problems, report(problems, "make targets that are not in the Makefile")


# ---------------------------------------------------------------------------------------------------
# 4, 6: flags, modules and subcommands


@dataclasses.dataclass(frozen=True)
class Cli:
    """What the command line of one of onepass's programs takes."""

    flags: frozenset[str]
    subcommands: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)  # and their own flags
    needs_subcommand: bool = False


HELP = frozenset({"-h", "--help"})
# The server's: a flag per setting and its aliases (app/config_sources.py's build_parser makes them so).
SERVER_FLAGS = HELP | {"--version"} | {name for f in OPTIONS for name in (flag(f.name), *f.metadata["aliases"])}


def module_file(module: str) -> Path | None:
    """The file `python -m module` runs, if the repository has it."""
    path = REPO_ROOT.joinpath(*module.split("."))
    return next((p for p in (path.with_name(path.name + ".py"), path / "__main__.py") if p.is_file()), None)


def is_ours(module: str) -> bool:
    """A module of this repository's (python -m pip, pytest and venv are not)."""
    return (REPO_ROOT / module.split(".")[0]).is_dir()


def _strings(call: ast.Call) -> list[str]:
    return [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def _method(call: ast.Call) -> str:
    """The name a call calls: `add_argument` of `parser.add_argument(...)`."""
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return call.func.id if isinstance(call.func, ast.Name) else ""


@cache
def argparse_cli(source: Path) -> Cli | None:
    """The flags and subcommands a module's argparse parser declares, read from its source (nothing is
    run); None for a module that reads its arguments without argparse."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    if not any(_method(call) == "ArgumentParser" for call in calls):
        return None
    parser_of: dict[str, str] = {}  # a variable holding a subcommand's parser -> the subcommand
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _method(node.value) == "add_parser":
            parser_of.update((t.id, _strings(node.value)[0]) for t in node.targets if isinstance(t, ast.Name))
    flags: dict[str | None, set[str]] = {None: set(HELP)}  # None: the program's own
    needs_subcommand = False
    for call in calls:
        if _method(call) == "add_parser":
            flags.setdefault(_strings(call)[0], set(HELP))
        elif _method(call) == "add_subparsers":
            needs_subcommand |= any(
                k.arg == "required" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in call.keywords
            )
        elif _method(call) == "add_argument" and isinstance(call.func, ast.Attribute):
            owner = parser_of.get(call.func.value.id) if isinstance(call.func.value, ast.Name) else None
            flags.setdefault(owner, set(HELP)).update(s for s in _strings(call) if s.startswith("-"))
    own = frozenset(flags.pop(None))
    return Cli(own, {name: frozenset(f) for name, f in flags.items() if name is not None}, needs_subcommand)


@cache
def cli_of(module: str) -> Cli | None:
    """What `python -m module` takes; None where that is not known (not ours, not there, no argparse)."""
    if module == "app":  # the server; `onepass calibrate` and `onepass label` take flags of their own and the server's
        calibrate = argparse_cli(REPO_ROOT / "app" / "fitting" / "cli.py")
        label = argparse_cli(REPO_ROOT / "app" / "__main__.py")
        assert calibrate is not None and label is not None
        return Cli(SERVER_FLAGS, {"calibrate": calibrate.flags | SERVER_FLAGS, "label": label.flags | SERVER_FLAGS})
    source = module_file(module) if is_ours(module) else None
    return None if source is None else argparse_cli(source)


def onepass_flags() -> frozenset[str]:
    """What `onepass`, `onepass calibrate` and `onepass label` take."""
    server = cli_of("app")
    assert server is not None
    return server.flags | server.subcommands["calibrate"] | server.subcommands["label"]


def flag_name(word: str) -> str | None:
    """`--name` of a flag (`--name`, `--name=value`, `-m`); None for a value such as `-1`."""
    found = re.fullmatch(r"(--?[A-Za-z][\w-]*)(?:=.*)?", word)
    return None if found is None else found[1]


def flag_problems(where: str, shown: str, module: str, args: Sequence[str]) -> list[str]:
    """The flags in `args` that `python -m module` does not take. Flags after a bare `--` go to the
    server: app.fleet.supervisor and bench.screenshot hand them to `python -m app`."""
    cli = cli_of(module)
    if cli is None:
        return []
    ours, server = (list(args), []) if "--" not in args else (args[: args.index("--")], args[args.index("--") + 1 :])
    subcommand = ours[0] if ours and not ours[0].startswith("-") and ours[0] in cli.subcommands else ""
    takes = cli.flags | cli.subcommands.get(subcommand, frozenset())
    name = ("onepass" if module == "app" else f"python -m {module}") + (f" {subcommand}" if subcommand else "")
    problems = [f"{where}: `{shown}`: {name} has no flag {f}" for w in ours if (f := flag_name(w)) and f not in takes]
    return problems + [
        f"{where}: `{shown}`: onepass has no flag {f}" for w in server if (f := flag_name(w)) and f not in SERVER_FLAGS
    ]


def make_program(target: str, variable: str) -> str | None:
    """The module that `make target` hands $(variable) to: its recipe's `-m MODULE`; after `--`, the server."""
    for line in makefile_rules().get(target, []):
        run = re.search(r"-m\s+([\w.]+)", line)
        if run is not None and f"$({variable})" in line[run.end() :]:
            return "app" if " -- " in line[run.end() : line.index(f"$({variable})")] else run[1]
    return None


def test_every_flag_is_one_its_program_takes() -> None:
    problems = []
    for run in commands():
        if run.program != "make":
            problems += flag_problems(run.where, run.text, run.program, run.args)
            continue
        for variable, value in make_assignments(run).items():  # make run ARGS="--n-gpu-layers -1"
            for module in {m for t in make_targets(run) if (m := make_program(t, variable)) is not None}:
                problems += flag_problems(run.where, run.text, module, words(value))
    for document in documents():
        for text in document.code:  # a flag alone (`--n-ctx`, `-m`, `--calibration none`) is onepass's
            given = words(text.text)
            if given and flag_name(given[0]):
                for name in filter(None, map(flag_name, given)):
                    if name not in onepass_flags() and name not in OTHER_PROGRAMS_FLAGS:
                        problems.append(f"{text.at()}: `{text.text}`: onepass has no flag {name}")
    assert not problems, report(problems, "flags that their program does not take")


def test_every_flag_of_onepass_calibrate_is_documented() -> None:
    """The server's flags are the generated table of docs/configuration.md; calibrate's are not."""
    calibrate = argparse_cli(REPO_ROOT / "app" / "fitting" / "cli.py")
    assert calibrate is not None
    named = {n for d in documents() for t in d.code for w in words(t.text) if (n := flag_name(w)) is not None}
    missing = [
        f"app/fitting/cli.py: onepass calibrate {f} is in no page" for f in sorted(calibrate.flags - HELP - named)
    ]
    assert not missing, report(missing, "flags of onepass calibrate that no page gives")


MODULE = re.compile(r"(?<![\w.-])(?:\S*/)?python3?\s+-m\s+(?P<module>[\w.]*\w)")


def test_every_module_run_is_there_with_its_subcommand() -> None:
    problems = []
    for document in documents():
        for text in document.plain:
            for found in MODULE.finditer(text.text):
                module, source = found["module"], module_file(found["module"])
                if not is_ours(module):
                    continue
                if source is None:
                    problems.append(f"{text.at(found.start())}: python -m {module}: there is no such module")
                elif source.name != "__main__.py" and '__name__ == "__main__"' not in source.read_text():
                    problems.append(f"{text.at(found.start())}: python -m {module}: it runs nothing")
    for run in commands():
        cli = None if run.program == "make" else cli_of(run.program)
        if cli is not None and cli.needs_subcommand and (not run.args or run.args[0] not in cli.subcommands):
            choices = ", ".join(sorted(cli.subcommands))
            problems.append(f"{run.where}: `{run.text}`: python -m {run.program} needs a subcommand ({choices})")
    assert not problems, report(problems, "modules that are not there, or run without their subcommand")


# ---------------------------------------------------------------------------------------------------
# 5: HTTP routes

METHODS = "GET|HEAD|POST|PUT|PATCH|DELETE"
# A path of the server's, with the methods before it: `GET /v1/models`, `GET` and `DELETE /v1/calibrations/{id}`
ROUTE = re.compile(
    rf"(?:(?P<methods>(?:{METHODS})(?:\s*(?:,|/|\band\b|\bor\b)\s*(?:{METHODS}))*)\s+)?"
    r"(?<![A-Za-z_./~-])(?P<path>/(?:v1|health|metrics|openapi\.json)(?:/[\w{}:.-]*)*)"
)


def route_pattern(path: str) -> re.Pattern[str]:
    """A route's path as a pattern a page's path matches: each parameter by its name (`{id}`) or a value."""
    parts = re.split(r"\{(\w+)(?::(\w+))?\}", path)
    pattern = re.escape(parts[0])
    for name, convertor, rest in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        value = "[^{}]+" if convertor == "path" else "[^/{}]+"
        pattern += rf"(?:\{{{name}\}}|{value}){re.escape(rest)}"
    return re.compile(pattern)


def test_every_route_is_one_the_server_defines() -> None:
    routes = [(route_pattern(r.path), r.methods or set()) for r in API_ROUTES if isinstance(r, Route)]
    problems = []
    for document in documents():
        for text in document.plain:
            for found in ROUTE.finditer(text.text):
                path = found["path"].rstrip(".:")
                served: set[str] = set().union(*(methods for pattern, methods in routes if pattern.fullmatch(path)))
                asked = set(re.findall(METHODS, found["methods"] or ""))
                if not served:
                    problems.append(f"{text.at(found.start('path'))}: {path}: the server has no such route")
                elif asked - served:
                    problems.append(
                        f"{text.at(found.start())}: {' and '.join(sorted(asked - served))} {path}: "
                        f"the server answers only {', '.join(sorted(served - {'HEAD'}))} there"
                    )
    assert not problems, report(problems, "routes the server does not define")


# ---------------------------------------------------------------------------------------------------
# The README's length, and the configuration reference


def test_the_readme_is_one_page() -> None:
    assert len((REPO_ROOT / "README.md").read_text().splitlines()) <= 160


def test_the_configuration_reference_is_the_settings_as_declared() -> None:
    page = settings_reference.PAGE.read_text()
    assert settings_reference.rendered(page) == page, (
        "docs/configuration.md is stale: python -m app.serving.settings_reference"
    )
    for option in ("n_ctx", "session_cache_disk_bytes", "calibration_dir", "layout"):
        assert f"| `{option}` |" in page


# ---------------------------------------------------------------------------------------------------
# Names in capitals: an environment or make variable the code knows, never a placeholder left behind

CAPITAL_NAME = re.compile(r"(?<![\w-])[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+(?![\w-])")
QUANTIZATION = re.compile(r"(?:I?Q\d|F\d\d|BF16)(?:_[A-Z0-9]+)*")  # a GGUF tensor type: Q4_K_M, IQ2_XS
# Names of other programs' that the pages give on purpose, each with where and why.
OTHER_PROGRAMS_NAMES = {
    "GGML_FA_TILE_Q": "ggml's (docs/notes/2026-11-30-prompt-experiments.md: where its kernel switches)",
}


def test_every_capitalised_name_is_one_the_code_knows() -> None:
    known = "\n".join(source.read_text(encoding="utf-8") for source in CODE_FILES)
    problems = []
    for document in documents():
        for text in [*document.plain, *document.code]:
            for found in CAPITAL_NAME.finditer(text.text):
                name = found[0]
                if QUANTIZATION.fullmatch(name) or name in OTHER_PROGRAMS_NAMES or re.search(rf"\b{name}\b", known):
                    continue
                problems.append(f"{text.at(found.start())}: {name}: no variable of that name (a placeholder?)")
    assert not problems, report(sorted(set(problems)), "names in capitals that nothing defines")


# ---------------------------------------------------------------------------------------------------
# Commands written as they work after `make run` alone

# `make run` installs onepass into .venv only: `onepass ...` and `python -m app ...` find neither on PATH.
VENV_PROGRAM = re.compile(r"\.venv(?:-[\w-]+)?/bin/(?:onepass|python3?)")


def test_every_command_of_ours_is_the_venvs() -> None:
    problems = []
    for run in commands():
        page, line = run.where.rsplit(":", 1)
        if run.program == "make" or not is_ours(run.program) or page.startswith("docs/notes/"):
            continue
        if "pip install" in (REPO_ROOT / page).read_text(encoding="utf-8").splitlines()[int(line) - 1]:
            continue  # installed into an environment of the reader's: its programs are on PATH there
        given = words(run.text)
        program = next((w for w in given if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w)), "").lstrip("(")
        if run.text in ("onepass calibrate", "onepass label") or ("/" in program and "/bin/" not in program):
            continue  # the subcommand's name in a sentence; a folder such as ~/.cache/onepass
        if not VENV_PROGRAM.fullmatch(program):
            problems.append(f"{run.where}: `{run.text}`: write it as .venv/bin/onepass or .venv/bin/python")
    assert not problems, report(problems, "commands that are not found after `make run` alone")


def test_the_architecture_page_names_every_module_of_the_app() -> None:
    # the map a newcomer reads first: a module added without a line there is a room missing from it
    table = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    unnamed = [
        str(path.relative_to(REPO_ROOT))
        for path in sorted((REPO_ROOT / "app").rglob("*.py"))
        if path.name != "__init__.py" and f"`{path.name}`" not in table
    ]
    assert not unnamed, f"docs/architecture.md does not name: {', '.join(unnamed)}"
