"""Importing app/ does nothing: every module imported, in a fresh interpreter, loads no llama.cpp
(app.engine.bindings.init() does that, on purpose), reads no file of onepass's but its modules,
writes nothing, starts no thread or process and opens no socket.

The interpreter's audit hooks see what the imports do. What onepass's dependencies do when they are
imported (numpy's environment, prometheus_client reading /proc, pydantic looking for its plugins) is
theirs: only reads inside the checkout and the user's cache folder count as onepass's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from app.paths import REPO_ROOT, cache_home

APP = REPO_ROOT / "app"

IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil, sys, threading

ACTIONS = ("ctypes.dlopen", "os.mkdir", "os.remove", "os.rename", "os.rmdir", "shutil.rmtree", "os.truncate",
           "subprocess.Popen", "os.system", "os.exec", "os.fork", "os.posix_spawn", "socket.bind", "socket.connect")
events = []

def hook(event, args):
    if event == "open":
        events.append([event, str(args[0]), str(args[1] or "r")])
    elif event in ACTIONS:
        events.append([event, str(args[0]) if args else "", ""])

sys.addaudithook(hook)
import app
names = [module.name for module in pkgutil.walk_packages(app.__path__, "app.")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"names": names, "events": events, "threads": threading.active_count(),
                  "llama_cpp": "llama_cpp" in sys.modules}))
"""


def import_everything() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERY_MODULE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def read_by_onepass(path: Path) -> bool:
    """A file of onepass's other than its modules: in the checkout (its virtual environment aside) or
    in the user's cache folder. Installed packages' metadata is importlib.metadata's (pydantic asks it
    for plugins), and a path that is no file (an import hook's entry on sys.path) holds nothing."""
    inside = path.is_relative_to(REPO_ROOT) and not path.is_relative_to(Path(sys.prefix).resolve())
    metadata = any(part.endswith((".dist-info", ".egg-info")) for part in path.parts)
    module = path.suffix in (".py", ".pyc")
    return (inside or path.is_relative_to(cache_home())) and path.is_file() and not metadata and not module


def test_importing_every_app_module_loads_reads_writes_and_starts_nothing() -> None:
    found = import_everything()
    expected = {".".join(("app", *p.relative_to(APP).with_suffix("").parts)) for p in APP.rglob("*.py")}
    assert set(found["names"]) == {name.removesuffix(".__init__") for name in expected} - {"app"}
    assert not found["llama_cpp"], "a module loads llama.cpp when imported: app.engine.bindings.init() is for that"
    assert found["threads"] == 1, "a module starts a thread when imported"
    problems = []
    for event, what, mode in found["events"]:
        if event == "open":
            path = (REPO_ROOT / what).resolve()  # relative: to the interpreter's folder, the checkout
            if set(mode) & set("wax+"):
                problems.append(f"writes {what}")
            elif read_by_onepass(path):
                problems.append(f"reads {what}")
        elif event != "ctypes.dlopen" or what != "None":  # ctypes' own import opens the process itself
            problems.append(f"{event} {what}")
    assert not problems, "importing app/ did this:\n" + "\n".join(problems)
