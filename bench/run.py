"""make bench: what the session cache and batching gain, against llama.cpp's own server.

Every server runs in its own process on a loopback port; this process is only the client
(and loads the model's tokenizer to build states of a given token length and to render
the very same prompts for llama-server). Each latency is measured from the client.

    python -m bench.run [--model PATH] [--quick]

Writes bench/results/<date>-<sha>-<model>.json and .md, and a .png of latency vs state length.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.answering.prompting import OwnPrompter
from app.config import Settings
from app.engine import bindings
from app.engine.engine import Engine
from app.paths import REPO_ROOT
from app.serving.known_models import default_model_path
from app.serving.loading import prompter_for, speed_settings_for
from app.serving.specs import ModelSpec
from app.wire.contract import SystemOneRequest
from bench import peer, pipeline, restart, shared_suffixes
from bench.client import ask as client_ask
from bench.figure import figure
from bench.output import git_sha, machine, table, write_atomically
from bench.servers import onepass_server, rss_mb
from bench.workloads import QUESTIONS, SENTENCES, StateMaker


@dataclass
class Config:
    sizes: list[int]
    question_counts: list[int]
    cold_runs: int
    hit_runs: int
    off_runs: int
    peer_sizes: list[int]
    interleave_rounds: int
    eviction_states: int
    peer_workloads: tuple[str, ...] = ("cold", "warm", "interleaved")
    # A cold pair at 1,024 tokens differs by 2-3% while single samples on this VM vary about as much.
    peer_cold_runs: int = 3
    pipeline_states: int = 40
    restart_sizes: tuple[int, ...] = (256, 1024, 2048)
    restart_states: int = 2  # per size: one read from the device, one from the page cache


FULL = Config([64, 256, 1024, 2048], [1, 5, 10], 2, 3, 1, [256, 1024], 2, 18)
QUICK = Config(
    [64, 256], [1, 5], 1, 2, 1, [256], 1, 0, ("cold", "warm"), pipeline_states=8, restart_sizes=(256,), restart_states=1
)


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {"median": round(statistics.median(ordered), 1), "p90": round(p90, 1), "n": len(ordered)}


def ask(client: httpx.Client, url: str, state: str, questions: list[dict[str, Any]]) -> tuple[float, dict[str, Any]]:
    return client_ask(client, url, state, {f"q{i}": q for i, q in enumerate(questions)})


def cache_gain(client: httpx.Client, url: str, states: StateMaker, cfg: Config) -> list[dict[str, Any]]:
    rows = []
    for size in cfg.sizes:
        for n in cfg.question_counts:
            cold, hit, engine_ms, decode_ms, prefill_ms = [], [], [], [], []
            for _ in range(cfg.cold_runs):
                state = states.make(size)
                ms, data = ask(client, url, state, QUESTIONS[:n])
                cold.append(ms)
                prefill_ms.append(data["x_timing_ms"]["prefill"])
            for _ in range(cfg.hit_runs):
                ms, data = ask(client, url, state, QUESTIONS[:n])
                assert data["x_cache"] == "hit"
                hit.append(ms)
                timing = data["x_timing_ms"]
                engine_ms.append(timing["restore"] + timing["decode"])
                decode_ms.append(timing["decode"])
            rows.append(
                {
                    "state_tokens": size,
                    "questions": n,
                    "input_tokens": data["usage"]["input_tokens"],
                    "cold_ms": summary(cold),
                    "hit_ms": summary(hit),
                    "engine_hit_ms": summary(engine_ms),
                    "engine_decode_ms": summary(decode_ms),
                    "engine_prefill_ms": summary(prefill_ms),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def cache_off(client: httpx.Client, url: str, states: StateMaker, cfg: Config) -> dict[tuple[int, int], Any]:
    found = {}
    for size in cfg.sizes:
        for n in cfg.question_counts:
            samples = [ask(client, url, states.make(size), QUESTIONS[:n])[0] for _ in range(cfg.off_runs)]
            found[size, n] = summary(samples)
    return found


def batching(client: httpx.Client, url: str, states: StateMaker, cfg: Config) -> list[dict[str, Any]]:
    state = states.make(256)
    ask(client, url, state, QUESTIONS[:1])  # cached from here on
    rows = []
    for n in [n for n in cfg.question_counts if n > 1]:
        together = [ask(client, url, state, QUESTIONS[:n])[0] for _ in range(cfg.hit_runs)]
        apart = [sum(ask(client, url, state, [q])[0] for q in QUESTIONS[:n]) for _ in range(cfg.hit_runs)]
        rows.append({"questions": n, "one_request_ms": summary(together), "one_per_question_ms": summary(apart)})
    return rows


def interleaving(client: httpx.Client, url: str, states: StateMaker, cfg: Config, pid: int) -> dict[str, Any]:
    a, b = states.make(256), states.make(256)
    before = client.get(url + "/v1/cache").json()
    latencies = [ask(client, url, s, QUESTIONS[:5])[0] for _ in range(cfg.interleave_rounds * 2) for s in (a, b)]
    after = client.get(url + "/v1/cache").json()
    name = next(iter(after))
    result: dict[str, Any] = {
        "within_budget": {
            "requests": len(latencies),
            "latency_ms": summary(latencies),
            "hit_rate": (after[name]["hits"] - before[name]["hits"]) / len(latencies),
        }
    }
    if cfg.eviction_states:
        ring = [states.make(128) for _ in range(cfg.eviction_states)]
        before = client.get(url + "/v1/cache").json()[name]
        ring_ms = [ask(client, url, s, QUESTIONS[:1])[0] for _ in range(2) for s in ring]
        after = client.get(url + "/v1/cache").json()[name]
        result["over_budget"] = {
            "states": len(ring),
            "cache_entries": after["max_entries"],
            "requests": len(ring_ms),
            "latency_ms": summary(ring_ms),
            "hit_rate": (after["hits"] - before["hits"]) / len(ring_ms),
            "evictions": after["evictions"] - before["evictions"],
        }
    result["rss_mb_full_cache"] = round(rss_mb(pid), 1)
    return result


def against_peer(
    binary: Path,
    model: Path,
    engine: Engine,
    prompter: OwnPrompter,
    client: httpx.Client,
    url: str,
    states: StateMaker,
    cfg: Config,
    report: dict[str, Any],
) -> list[dict[str, Any]]:
    """The same workloads answered by llama-server, one /completion per question: once with the
    settings onepass chose, once more with flash attention the other way. Chosen on a prefill, flash
    attention can be the slower setting for llama-server's short per-question calls after a long
    state (its one-row kernel), and the peer should not lose for a setting's sake."""
    rows = []
    questions = QUESTIONS[:5]
    spec = ModelSpec.from_settings(Settings(model=model))
    speed = speed_settings_for(spec)  # what the onepass server chose: the same tuning cache
    report["speed_settings"] = {"threads": speed.threads, "repack": speed.repack, "flash_attn": speed.flash_attn}

    def prompts(state: str) -> list[tuple[str, list[str]]]:
        request = SystemOneRequest.model_validate(
            {"model": "m", "state": state, "questions": {f"q{i}": q for i, q in enumerate(questions)}}
        )
        fmt = prompter.format
        found = []
        for question in request.questions.values():
            rendered = prompter.question(question)
            labels = [engine.vocab.piece(t) for t in rendered.label_ids]
            found.append((fmt.head + state + fmt.between + rendered.text + fmt.tail, labels))
        return found

    timings: list[dict[str, float]] = []  # onepass's x_timing_ms, to show where its time went

    def on_onepass(state: str) -> float:
        ms, body = ask(client, url, state, questions)
        timings.append(body["x_timing_ms"])
        return ms

    for peer_flash_attn in (speed.flash_attn, not speed.flash_attn):
        with peer.llama_server(binary, model, 8192, speed.threads, speed.repack, peer_flash_attn) as server:

            def on_peer(state: str) -> float:
                began = time.perf_counter()
                for prompt, labels in prompts(state):
                    peer.label_probabilities(client, server.url, prompt, labels)
                return (time.perf_counter() - began) * 1000

            for size in cfg.peer_sizes:
                for workload in cfg.peer_workloads:
                    ours, theirs = measure_pair(workload, size, states, on_onepass, on_peer, cfg)
                    measured = timings[-len(ours) :]  # the runs timed, not the ones that warmed a state
                    rows.append(
                        {
                            "workload": workload,
                            "state_tokens": size,
                            "questions": len(questions),
                            "llama_server_flash_attn": peer_flash_attn,
                            "onepass_ms": summary(ours),
                            "onepass_prefill_ms": summary([t["prefill"] for t in measured]),
                            "onepass_decode_ms": summary([t["decode"] for t in measured]),
                            "llama_server_ms": summary(theirs),
                            "ratio": round(statistics.median(ours) / statistics.median(theirs), 3),
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
    report["system_info"] = {"onepass": bindings.system_info(), "llama_server": server.system_info}
    return rows


def faster_peer(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload and state length, the row whose llama-server was faster (its better setting)."""
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        key = (r["workload"], r["state_tokens"])
        if key not in best or r["llama_server_ms"]["median"] < best[key]["llama_server_ms"]["median"]:
            best[key] = r
    return list(best.values())


def measure_pair(
    workload: str,
    size: int,
    states: StateMaker,
    ours: Callable[[str], float],
    theirs: Callable[[str], float],
    cfg: Config,
) -> tuple[list[float], list[float]]:
    if workload == "cold":  # alternating, so a drift in the machine's speed falls on both sides alike
        pairs = [(ours(states.make(size)), theirs(states.make(size))) for _ in range(cfg.peer_cold_runs)]
        return [a for a, _ in pairs], [b for _, b in pairs]
    if workload == "warm":
        a = states.make(size)
        ours(a), theirs(a)
        return [ours(a) for _ in range(cfg.hit_runs)], [theirs(a) for _ in range(cfg.hit_runs)]
    a, b = states.make(size), states.make(size)
    ours(a), ours(b), theirs(a), theirs(b)
    rounds = range(cfg.interleave_rounds)
    return [ours(s) for _ in rounds for s in (a, b)], [theirs(s) for _ in rounds for s in (a, b)]


def markdown(report: dict[str, Any]) -> str:
    off = {(r["state_tokens"], r["questions"]): r for r in report["cache_off"]}
    lines = [
        f"# onepass bench: {report['model']} ({report['date']}, {report['git']}, {report['machine']})",
        "",
        "Latency in ms, median (p90) from the client. engine = restore + batched decode, in-process.",
        "",
        "| state tokens | questions | cold | hit | cache off | engine on hit | hit / engine decode |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["cache_gain"]:
        o = off[r["state_tokens"], r["questions"]]["ms"]
        lines.append(
            f"| {r['state_tokens']} | {r['questions']} | {r['cold_ms']['median']} ({r['cold_ms']['p90']}) "
            f"| {r['hit_ms']['median']} ({r['hit_ms']['p90']}) | {o['median']} ({o['p90']}) "
            f"| {r['engine_hit_ms']['median']} | {r['hit_ms']['median'] / r['engine_decode_ms']['median']:.3f} |"
        )
    lines += ["", "| batching (hit, 256 tokens) | one request | one request per question |", "|---|---|---|"]
    for r in report["batching"]:
        lines.append(
            f"| {r['questions']} questions | {r['one_request_ms']['median']} | {r['one_per_question_ms']['median']} |"
        )
    if report["against_llama_server"]:
        info = report.get("system_info", {})
        lines += [
            "",
            f"Builds: onepass `{info.get('onepass')}`; llama-server `{info.get('llama_server')}`",
            "",
            "Settings (as onepass measured them on this machine): "
            + ", ".join(
                f"{name} {value if name == 'threads' else 'on' if value else 'off'}"
                for name, value in report.get("speed_settings", {}).items()
            )
            + "; llama-server ran with the same, then with flash attention the other way.",
        ]
        lines += [
            "",
            *table(
                [
                    "vs llama-server (5 questions)",
                    "state tokens",
                    "onepass",
                    "of which prefill + batched decode",
                    "llama-server flash attention",
                    "llama-server",
                    "onepass / llama-server",
                ],
                [
                    [
                        r["workload"],
                        r["state_tokens"],
                        r["onepass_ms"]["median"],
                        f"{r['onepass_prefill_ms']['median']} + {r['onepass_decode_ms']['median']}",
                        "on" if r["llama_server_flash_attn"] else "off",
                        r["llama_server_ms"]["median"],
                        r["ratio"],
                    ]
                    for r in report["against_llama_server"]
                ],
            ),
            "",
            "Against llama-server's faster setting: "
            + ", ".join(
                f"{r['workload']} {r['state_tokens']} {r['ratio']}" for r in faster_peer(report["against_llama_server"])
            ),
        ]
    m = report["memory"]
    lines += [
        "",
        f"Memory: snapshot {m['snapshot_bytes_per_token']:.0f} B/token vs KV {m['kv_bytes_per_token']} "
        f"B/token ({m['snapshot_over_kv']:.3f}x); server RSS {m['rss_mb_start']} MB at start, "
        f"{report['interleaving']['rss_mb_full_cache']} MB after the interleaving runs.",
        "",
        f"Interleaving: {json.dumps(report['interleaving'])}",
    ]
    if "pipeline" in report:
        lines += pipeline.markdown(report["pipeline"])
    if "restart" in report:
        lines += restart.markdown(report["restart"])
    if "shared_suffixes" in report:
        lines += shared_suffixes.markdown(report["shared_suffixes"])
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    n = 5 if 5 in {r["questions"] for r in report["cache_gain"]} else report["cache_gain"][0]["questions"]
    rows = [r for r in report["cache_gain"] if r["questions"] == n]
    sizes = [r["state_tokens"] for r in rows]
    with figure(path, (6, 4)) as ax:
        ax.plot(sizes, [r["cold_ms"]["median"] for r in rows], marker="o", label="onepass cold")
        ax.plot(sizes, [r["hit_ms"]["median"] for r in rows], marker="o", label="onepass hit")
        for workload in ("cold", "warm"):
            peer_rows = [r for r in faster_peer(report["against_llama_server"]) if r["workload"] == workload]
            if peer_rows:
                ax.plot(
                    [r["state_tokens"] for r in peer_rows],
                    [r["llama_server_ms"]["median"] for r in peer_rows],
                    marker="s",
                    linestyle="--",
                    label=f"llama-server {workload}",
                )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="state tokens",
            ylabel=f"latency, {n} questions (ms)",
            title=report["model"],
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--quick", action="store_true", help="a smaller run (states of 64 and 256 tokens)")
    parser.add_argument(
        "--peer", type=Path, help="llama-server built like onepass's llama.cpp (make peer); without it, no comparison"
    )
    parser.add_argument("--peer-sizes", type=int, nargs="+", help="state lengths of the llama-server comparison")
    args = parser.parse_args()
    cfg = QUICK if args.quick else FULL
    if args.peer_sizes:
        cfg = dataclasses.replace(cfg, peer_sizes=args.peer_sizes)
    began = time.perf_counter()
    engine = Engine(args.model, n_ctx=512, contexts=1)  # tokenizer and prompts only
    prompter = prompter_for(engine)
    assert isinstance(prompter, OwnPrompter)  # llama-server is given onepass's own prompt
    states = StateMaker(engine)
    report: dict[str, Any] = {
        "model": args.model.name.removesuffix(".gguf"),
        "date": datetime.date.today().isoformat(),
        "git": git_sha(),
        "machine": machine(),
        "quick": args.quick,
    }
    with httpx.Client() as client:
        with onepass_server(args.model) as (url, pid):
            rss_start = rss_mb(pid)
            # learns, once, the calibration prior of each question the runs below use
            ask(client, url, "warm-up", QUESTIONS[: max(cfg.question_counts)])
            report["cache_gain"] = cache_gain(client, url, states, cfg)
            report["batching"] = batching(client, url, states, cfg)
            report["interleaving"] = interleaving(client, url, states, cfg, pid)
            stats = next(iter(client.get(url + "/v1/cache").json().values()))
            report["memory"] = {
                "snapshot_bytes_per_token": stats["bytes"] / stats["tokens"],
                "kv_bytes_per_token": engine.kv_bytes_per_token,
                "snapshot_over_kv": stats["bytes"] / stats["tokens"] / engine.kv_bytes_per_token,
                "rss_mb_start": round(rss_start, 1),
            }
            report["against_llama_server"] = (
                []
                if args.peer is None
                else against_peer(args.peer, args.model, engine, prompter, client, url, states, cfg, report)
            )
        with onepass_server(args.model, "--session-cache-entries", "0") as (url, _):
            ask(client, url, "warm-up", QUESTIONS[: max(cfg.question_counts)])
            off = cache_off(client, url, states, cfg)
            report["cache_off"] = [{"state_tokens": s, "questions": n, "ms": v} for (s, n), v in off.items()]
    report["pipeline"] = pipeline.pipeline(args.model, cfg.pipeline_states, onepass_server)
    report["restart"] = restart.restart(args.model, list(cfg.restart_sizes), cfg.restart_states, onepass_server)
    sets = shared_suffixes.question_sets(QUESTIONS[:5])
    report["shared_suffixes"] = shared_suffixes.shared_suffixes(args.model, sets, SENTENCES, 3 if args.quick else 5)
    report["seconds"] = round(time.perf_counter() - began, 1)
    out = REPO_ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{report['date']}-{report['git']}-{report['model']}" + ("-quick" if args.quick else "")
    if os.environ.get("ONEPASS_CPUINFO"):  # built for another CPU's flags (Makefile): not this CPU's own run
        stem += f"-{Path(os.environ['ONEPASS_CPUINFO']).stem}-flags"
    write_atomically(out / f"{stem}.json", json.dumps(report, indent=2) + "\n")
    write_atomically(out / f"{stem}.md", markdown(report))
    plot(report, out / f"{stem}.png")
    print(markdown(report))
    print(f"bench took {report['seconds']} s; wrote bench/results/{stem}.*")


if __name__ == "__main__":
    main()
