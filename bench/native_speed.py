"""onepass against llama.cpp's own /v1/systemone on speed: the same requests to both, on one decision GGUF.

    python -m bench.native_speed --server PATH/llama-server [--model GGUF] [--quick] [--threads N] [--slots N]
        [--onepass-checkout DIR] [--repack auto|on|off] [--mmproj GGUF|tiny]

Both servers run at once, each in its own process on a loopback port; this process is only the
client (it loads the model's tokenizer to build states of a given token length). Every request
asks the same three questions (a noul, a choice of 4, a score of 4 levels), and each latency is
the wall clock from the client. The workloads:

1. new states: distinct short states, each asked once;
2. one state repeated: one short state asked K times (the first cold);
3. states revisited: two more short states than llama-server has slots, asked round-robin;
4. a long state (~2,000 tokens) asked a few times (the first cold);
5. clients at once: 4 clients, each asking its own short states round-robin, all at the same time.

In 1-4 the two servers take turns request by request (which goes first alternates), so a drift in
the machine's speed falls on both alike; in 5 one server answers the whole workload, then the
other, and its total is the wall clock from the first request to the last answer.

Equal work: onepass runs with --calibration none (the file's temperatures, as llama.cpp applies
them; its default contextual calibration would answer differently), and every pair of answers is
compared (`agreement` in bench/native_decision.py): the same answer to every question. Their
probabilities agree to 0.01 with the plain kernels (tests/test_native_server.py); with flash
attention on, which both run where onepass measured it faster, the two servers' different batch
layouts round apart by more (docs/exactness.md), so the largest gap is reported, not bounded.

The setup: onepass with its defaults for the model (one context, the snapshot disk tier on, in a
temporary folder), and the threads, repacked weights and flash attention it chose, given to
llama-server as well. llama-server runs its own default layout: 4 slots (-np 4, --slots) sharing
one unified KV cache of 4x onepass's context, the prompt cache on (--cache-prompt, and its host
memory cache, --cache-ram, at its default). With several slots /v1/systemone decodes one request's
questions side by side, sharing the state's prefill; with one slot it would decode them one after
another.

With --onepass-checkout, onepass is served from another checkout (its own .venv: an older engine,
say) at the threads, repacked weights and flash attention this checkout chose, so one llama-server
can be compared with two engines. With --repack on or off, both servers run with repacked weights
so, whatever the first start chose (flash attention is still onepass's choice for that setting).

With --mmproj (the model's vision projector, or `tiny`: a tiny random one of the model's width,
bench/image_states.py's), both servers load it and every state comes with an image of its own, sent as
llama.cpp's `images` data URLs: the same workloads on image states (a repeated state is a repeated
image; the revisited states are more image states than llama-server has slots). It runs where both
answer images for the model's decision type.

Writes bench/results/<date>-<sha>-native-speed.{json,md} (--mmproj: -native-speed-images; --quick: -quick; with
--onepass-checkout, <sha>-onepass-<its sha>; with --repack on or off, -native-speed-repack-on or -off).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.config import Settings
from app.engine import bindings
from app.engine.engine import Engine
from app.paths import REPO_ROOT
from app.serving.loading import SpeedSettings, speed_settings_for
from app.serving.specs import ModelSpec
from bench.image_states import image_url, tiny_projector
from bench.native_decision import DEFAULT_MODEL, Agreement, agreement
from bench.output import Progress, git_sha, machine, table, write_atomically
from bench.peer import stop, wait_ready
from bench.servers import engine_of, onepass_server
from bench.workloads import StateMaker

TARGET = 0.8  # onepass / llama-server, at most, on every workload
N_CTX = 8192  # onepass's context (bench/servers.py); llama-server gets this per slot

QUESTIONS: dict[str, Any] = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
    "team": {
        "type": "choice",
        "instructions": "Which team handles it?",
        "criteria": {
            "Billing": "Payments and refunds",
            "Technical": "Bugs and outages",
            "Shipping": "Parcels and delivery",
            "Sales": None,
        },
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent is it?",
        "criteria": ["Can wait", "This week", "Today", "Now"],
    },
}


@dataclass(frozen=True)
class Config:
    short_tokens: int  # a short state (workloads 1, 2, 3 and 5)
    new_states: int
    repeats: int
    rounds: int  # of the revisited states
    long_tokens: int
    long_asks: int
    clients: int
    client_states: int  # each client's own
    client_asks: int  # each client asks each of its states this often, round-robin


FULL = Config(80, 8, 8, 3, 2000, 4, 4, 3, 2)
QUICK = Config(80, 3, 3, 2, 400, 2, 4, 1, 2)


@dataclass(frozen=True)
class Workload:
    name: str
    what: str
    plans: list[list[str]]  # the states each client asks, in order; one plan: the servers take turns

    @property
    def requests(self) -> int:
        return sum(len(plan) for plan in self.plans)


def workloads(states: StateMaker, cfg: Config, slots: int) -> list[Workload]:
    short = cfg.short_tokens
    new = [states.make(short) for _ in range(cfg.new_states)]
    one = states.make(short)
    ring = [states.make(short) for _ in range(slots + 2)]
    long = states.make(cfg.long_tokens)
    own = [[states.make(short) for _ in range(cfg.client_states)] for _ in range(cfg.clients)]
    return [
        Workload("new states", f"{len(new)} states of ~{short} tokens, each asked once", [new]),
        Workload(
            "one state repeated", f"one state of ~{short} tokens asked {cfg.repeats} times", [[one] * cfg.repeats]
        ),
        Workload(
            "states revisited",
            f"{len(ring)} states of ~{short} tokens (llama-server has {slots} slots), {cfg.rounds} rounds round-robin",
            [ring * cfg.rounds],
        ),
        Workload(
            "long state",
            f"one state of ~{cfg.long_tokens} tokens asked {cfg.long_asks} times",
            [[long] * cfg.long_asks],
        ),
        Workload(
            f"{cfg.clients} clients at once",
            f"{cfg.clients} clients at once, each with {cfg.client_states} state(s) of ~{short} tokens, "
            f"{cfg.client_asks} rounds round-robin",
            [plan * cfg.client_asks for plan in own],
        ),
    ]


@dataclass(frozen=True)
class Side:
    """A server as the client sees it: onepass wants a model name in the body, llama-server serves one model."""

    name: str
    url: str
    body: dict[str, Any]
    images: dict[str, str] = field(default_factory=dict)  # a state's image, as a data URL, where it has one

    def ask(self, client: httpx.Client, state: str) -> tuple[float, dict[str, Any]]:
        """(milliseconds from the client, the answers)."""
        body = {**self.body, "state": state, "questions": QUESTIONS}
        if state in self.images:
            body["images"] = [self.images[state]]
        began = time.perf_counter()
        response = client.post(self.url + "/v1/systemone", json=body)
        elapsed = (time.perf_counter() - began) * 1000
        if response.is_error:  # say why: a server that takes no images for this type, say
            raise RuntimeError(f"{self.name} answered {response.status_code}: {response.text[:1000]}")
        answers: dict[str, Any] = response.json()["answers"]
        return elapsed, answers


@dataclass
class Measured:
    total_ms: float = 0.0  # the latencies' sum; with clients at once, the wall clock of the whole workload
    latencies_ms: list[float] = field(default_factory=list)
    answers: list[dict[str, Any]] = field(default_factory=list)  # in plan order, client after client

    def summary(self) -> dict[str, Any]:
        return {
            "total_ms": round(self.total_ms, 1),
            "median_ms": round(statistics.median(self.latencies_ms), 1),
            "first_ms": round(self.latencies_ms[0], 1),
            "latencies_ms": [round(ms, 1) for ms in self.latencies_ms],
        }


def in_turn(sides: Sequence[Side], plan: list[str], step: Callable[[str], None]) -> dict[str, Measured]:
    """Each request to every server before the next request; who goes first alternates."""
    found = {side.name: Measured() for side in sides}
    with httpx.Client(timeout=900) as client:
        for i, state in enumerate(plan):
            for side in sides if i % 2 == 0 else sides[::-1]:
                ms, answers = side.ask(client, state)
                measured = found[side.name]
                measured.total_ms += ms
                measured.latencies_ms.append(ms)
                measured.answers.append(answers)
                step(side.name)
    return found


def at_once(side: Side, plans: list[list[str]], step: Callable[[str], None]) -> Measured:
    """One client per plan, all at the same time, each with its own connection."""

    def client_run(plan: list[str]) -> list[tuple[float, dict[str, Any]]]:
        done = []
        with httpx.Client(timeout=900) as client:
            for state in plan:
                done.append(side.ask(client, state))
                step(side.name)
        return done

    began = time.perf_counter()
    with ThreadPoolExecutor(len(plans)) as pool:
        per_client = list(pool.map(client_run, plans))
    wall = (time.perf_counter() - began) * 1000
    flat = [sample for samples in per_client for sample in samples]
    return Measured(wall, [ms for ms, _ in flat], [answers for _, answers in flat])


def agreements(ours: Measured, theirs: Measured) -> list[Agreement]:
    return [
        agreement(question["type"], mine[qid], native[qid])
        for mine, native in zip(ours.answers, theirs.answers, strict=True)
        for qid, question in QUESTIONS.items()
    ]


def on_off(flag: bool) -> str:
    return "on" if flag else "off"


@contextmanager
def native_server(
    binary: Path,
    model: Path,
    slots: int,
    kv_unified: bool,
    speed: SpeedSettings,
    mmproj: Path | None = None,
    gpu_layers: int = 0,
) -> Iterator[dict[str, Any]]:
    """llama-server with `slots` slots of N_CTX tokens each, onepass's speed settings and the prompt
    cache on (and the vision projector `mmproj`, `gpu_layers` on a GPU); yields its /props (url added).
    Its default log level: a verbose log would slow it."""
    with socket.socket() as probe:  # llama-server cannot report a port it picked itself
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
    command += ["-c", str(slots * N_CTX), "-np", str(slots), "--kv-unified" if kv_unified else "--no-kv-unified"]
    command += ["-b", "512", "-ub", "512", "-ngl", str(gpu_layers), "-t", str(speed.threads)]
    command += ["-fa", on_off(speed.flash_attn), "--repack" if speed.repack else "--no-repack"]
    command += ["--swa-full", "--no-warmup", "--cache-prompt"]
    command += ["--mmproj", str(mmproj)] if mmproj is not None else []
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            try:
                wait_ready(url + "/health", process)
            except (RuntimeError, TimeoutError) as error:
                log.seek(0)
                raise RuntimeError(f"{error}; its log ends: {log.read()[-2000:]}") from error
            props: dict[str, Any] = httpx.get(url + "/props", timeout=30).json()
            yield {**props, "url": url}
        finally:
            stop(process)


def row(workload: Workload, ours: Measured, theirs: Measured) -> dict[str, Any]:
    found = agreements(ours, theirs)
    mine, native = ours.summary(), theirs.summary()
    return {
        "workload": workload.name,
        "what": workload.what,
        "clients": len(workload.plans),
        "requests": workload.requests,
        "onepass": mine,
        "llama_server": native,
        "ratio_total": round(mine["total_ms"] / native["total_ms"], 3),
        "ratio_median": round(mine["median_ms"] / native["median_ms"], 3),
        "agreement": {
            "compared": len(found),
            "same_answer": sum(a.same_answer for a in found),
            "largest_gap": max(a.largest_gap for a in found),
        },
    }


def measure(workload: Workload, sides: Sequence[Side], step: Callable[[str], None]) -> dict[str, Any]:
    """One workload on both servers (onepass first in `sides`): its row of the report, also printed."""

    def noted(note: str) -> None:
        step(f"{workload.name}: {note}")

    if len(workload.plans) == 1:
        measured = in_turn(sides, workload.plans[0], noted)
        ours, theirs = measured[sides[0].name], measured[sides[1].name]
    else:
        ours, theirs = at_once(sides[0], workload.plans, noted), at_once(sides[1], workload.plans, noted)
    found = row(workload, ours, theirs)
    sys.stderr.write("\n")  # below the progress line
    print(json.dumps({k: v for k, v in found.items() if k not in ("onepass", "llama_server")}), flush=True)
    return found


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"# onepass and llama-server's /v1/systemone: {report['model']} ({report['date']}, {report['git']}, "
        f"{report['machine']})",
        "",
        "Each request asks 3 questions (a noul, a choice of 4, a score of 4 levels); latency in ms from the client.",
        *(
            [f"Every state comes with an image of its own (64 x 48 PNG, `images` data URLs); projector: {m}."]
            if (m := report.get("mmproj"))
            else []
        ),
        "Total: the latencies' sum, or with clients at once the wall clock of the whole workload.",
        "",
        f"Both with {s['threads']} threads, repacked weights {on_off(s['repack'])}, flash attention "
        f"{on_off(s['flash_attn'])} (onepass's choice on this machine). onepass: {s['onepass']}. "
        f"llama-server: {s['llama_server']}.",
        "",
        f"Builds: onepass `{report['builds']['onepass']}`; llama-server `{report['builds']['llama_server']}`",
        *(
            ["", f"onepass served from the checkout at {c['path']} (commit {c['git']}), with its own venv."]
            if (c := report.get("onepass_checkout"))
            else []
        ),
        "",
        *table(
            [
                "workload",
                "requests",
                "onepass total",
                "onepass median",
                "llama-server total",
                "llama-server median",
                "onepass / llama-server, total",
                "median",
                f"<= {TARGET}",
                "same answers",
                "largest gap",
            ],
            [
                [
                    f"{r['workload']}: {r['what']}",
                    r["requests"],
                    r["onepass"]["total_ms"],
                    r["onepass"]["median_ms"],
                    r["llama_server"]["total_ms"],
                    r["llama_server"]["median_ms"],
                    r["ratio_total"],
                    r["ratio_median"],
                    "yes" if max(r["ratio_total"], r["ratio_median"]) <= TARGET else "no",
                    f"{r['agreement']['same_answer']}/{r['agreement']['compared']}",
                    f"{r['agreement']['largest_gap']:.1e}",
                ]
                for r in report["workloads"]
            ],
        ),
        "",
        "First request (cold) in ms, onepass / llama-server: "
        + ", ".join(
            f"{r['workload']} {r['onepass']['first_ms']} / {r['llama_server']['first_ms']}" for r in report["workloads"]
        ),
        "",
        f"Equal work: the same answer to every question: {'yes' if report['equal_work'] else 'NO'}; the largest "
        f"probability gap {max(r['agreement']['largest_gap'] for r in report['workloads']):.1e}"
        + (" (flash attention on: docs/exactness.md)." if report["settings"]["flash_attn"] else "."),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", type=Path, required=True, help="a llama-server with /v1/systemone")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="a decision GGUF (make model-decision)")
    parser.add_argument("--quick", action="store_true", help="fewer requests and a 400-token long state")
    parser.add_argument("--threads", type=int, default=0, help="threads for both (0: onepass's own choice)")
    parser.add_argument("--slots", type=int, default=4, help="llama-server's slots (-np), each with onepass's context")
    parser.add_argument(
        "--kv-unified",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="llama-server's slots share one KV cache (its default layout for its default 4 slots)",
    )
    parser.add_argument("--onepass-args", default="", help="more onepass server flags, e.g. '--contexts 4'")
    parser.add_argument(
        "--onepass-checkout",
        type=Path,
        help="serve onepass from another checkout with its own .venv (an older engine, say), at this checkout's "
        "speed settings",
    )
    parser.add_argument(
        "--repack",
        choices=["auto", "on", "off"],
        default="auto",
        help="repacked weights for both servers (auto: onepass's first-start choice)",
    )
    parser.add_argument(
        "--mmproj",
        help="the model's vision projector, or 'tiny' (a tiny random one): every state comes with its own image",
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results", help="folder of the results")
    args = parser.parse_args()
    cfg = QUICK if args.quick else FULL
    began = time.perf_counter()
    engine = Engine(args.model, n_ctx=512, contexts=1)  # tokenizer only
    states = StateMaker(engine)
    chosen = workloads(states, cfg, args.slots)
    warm_up = states.make(cfg.short_tokens)
    stated = dict.fromkeys([warm_up, *(state for workload in chosen for plan in workload.plans for state in plan)])
    images = {state: image_url(seed) for seed, state in enumerate(stated)} if args.mmproj else {}
    report: dict[str, Any] = {
        "model": args.model.name.removesuffix(".gguf"),
        "date": datetime.date.today().isoformat(),
        "git": git_sha(),
        "machine": machine(),
        "quick": args.quick,
        "server": str(args.server),
        "questions": QUESTIONS,
    }
    checkout = args.onepass_checkout
    if checkout is not None:
        report["onepass_checkout"] = {"path": str(checkout), "git": git_sha(checkout)}
    with tempfile.TemporaryDirectory(prefix="onepass-native-speed-") as snapshots:
        mmproj = None
        if args.mmproj:
            mmproj = tiny_projector(args.model, Path(snapshots)) if args.mmproj == "tiny" else Path(args.mmproj)
            report["mmproj"] = args.mmproj
        own_flags = ["--threads", str(args.threads), "--calibration", "none"]
        own_flags += ["--mmproj", str(mmproj)] if mmproj is not None else []
        own_flags += ["--session-cache-disk-bytes", "4G", "--session-cache-dir", snapshots]
        spec = ModelSpec.from_settings(Settings(model=args.model, threads=args.threads, repack=args.repack))
        # another checkout's engine might tune otherwise: both servers get this checkout's settings
        given = None if checkout is None else speed_settings_for(spec)
        if given is not None:
            own_flags += ["--repack", on_off(given.repack), "--flash-attn", on_off(given.flash_attn)]
        elif args.repack != "auto":
            own_flags += ["--repack", args.repack]
        own_flags += shlex.split(args.onepass_args)
        shown = shlex.join(["--n-ctx", str(N_CTX), *own_flags]).replace(snapshots, "TMP")
        with onepass_server(args.model, *own_flags, checkout=checkout) as (url, _):
            # what the server chose: the same tuning cache, filled at its start (or what it was given)
            speed = speed_settings_for(spec) if given is None else given
            with native_server(args.server, args.model, args.slots, args.kv_unified, speed, mmproj) as props:
                report["settings"] = {
                    "threads": speed.threads,
                    "repack": speed.repack,
                    "flash_attn": speed.flash_attn,
                    "onepass": f"`{shown}` (the disk tier in a temporary folder, other settings its defaults)",
                    "llama_server": f"{props['total_slots']} slots, {args.slots * N_CTX} tokens of context, "
                    f"{'unified' if args.kv_unified else 'per-slot'} KV, prompt cache on",
                }
                own_build = bindings.system_info() if checkout is None else engine_of(checkout)
                report["builds"] = {"onepass": own_build, "llama_server": props.get("build_info", "?")}
                sides = [
                    Side("onepass", url, {"model": "jev-latest"}, images),
                    Side("llama-server", props["url"], {}, images),
                ]
                progress = Progress(2 * (1 + sum(w.requests for w in chosen)), f"both servers on {args.model.name}")
                lock = threading.Lock()  # the clients at once step from their threads

                def step(note: str) -> None:
                    with lock:
                        progress.step(note)

                # each server's first request pays for one-off work (buffers, onepass's system snapshot)
                in_turn(sides, [warm_up], lambda note: step(f"warm-up {note}"))
                report["workloads"] = [measure(workload, sides, step) for workload in chosen]
    engine.close()
    report["equal_work"] = all(r["agreement"]["same_answer"] == r["agreement"]["compared"] for r in report["workloads"])
    report["seconds"] = round(time.perf_counter() - began, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    served = report["git"] if checkout is None else f"{report['git']}-onepass-{report['onepass_checkout']['git']}"
    forced = "" if args.repack == "auto" else f"-repack-{args.repack}"
    stem = f"{report['date']}-{served}-native-speed{forced}" + ("-images" if args.mmproj else "")
    stem += "-quick" if args.quick else ""
    write_atomically(args.out / f"{stem}.json", json.dumps(report, indent=2) + "\n")
    write_atomically(args.out / f"{stem}.md", markdown(report))
    print(markdown(report))
    print(f"native speed bench took {report['seconds']} s; wrote {args.out / stem}.*")


if __name__ == "__main__":
    main()
