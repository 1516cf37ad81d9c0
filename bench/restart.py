"""The restart scenario: what the snapshot disk tier gives back after a server restart.

For each state length: a cold request (prefill), RAM hits, then the server is stopped (a
SIGTERM finishes the background writes) and started again on the same snapshot folder, and
the same states are asked again: one with its file dropped from the page cache first (read
from the device, as after a reboot), one straight from the page cache (a process restart).
Every latency is from the client; the disk read throughput is the tier's own (bytes read and
verified per second). Then whether compressing the payload would pay: zstd and lz4 on a real
snapshot, compressed size and the time to decompress it, against reading it raw.

python -m bench.restart [--sizes 256 1024 2048] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from app.config import DEFAULT_SNAPSHOT_DIR
from app.engine.disk_tier import SUFFIX
from app.engine.engine import Engine
from app.serving.known_models import default_model_path
from bench.client import ask, sized_text
from bench.output import Progress, median, table
from bench.servers import onepass_server

QUESTIONS: dict[str, Any] = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
    "team": {
        "type": "choice",
        "instructions": "Which team handles it?",
        "criteria": {"Billing": "Payments and refunds", "Technical": "Bugs and outages", "Sales": None},
    },
    "anger": {
        "type": "score",
        "instructions": "How frustrated is the customer?",
        "criteria": ["Calm", "Annoyed", "Furious"],
    },
    "english": {"type": "noul", "instructions": "Is the message written in English?"},
    "date": {"type": "noul", "instructions": "Does the message mention a date?"},
}
SENTENCES = [
    "On day {n} the invoice showed a second charge for the same yearly plan.",
    "The warehouse in zone {n} reported the pallet as damaged before loading.",
    "Customer {n} asked whether the discount still applies after the upgrade.",
    "Our engineer closed ticket {n} without any note about the root cause.",
]
HIT_RUNS = 3


def drop_from_page_cache(folder: Path) -> None:
    """Make the next reads of every snapshot file come from the device (clean pages only)."""
    for path in folder.rglob(f"*{SUFFIX}"):
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def timed(run: Callable[[], Any], repeat: int = 5) -> float:
    """The fastest of `repeat` runs, in ms."""
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - began)
    return best * 1000


def compression(snapshot_file: Path) -> dict[str, Any]:
    """Would compressing snapshot files pay on restore? Sizes and decompression times."""
    from backports.zstd import ZstdCompressor, ZstdDecompressor  # the contract's body codec, already installed

    data = snapshot_file.read_bytes()
    found: dict[str, Any] = {"bytes": len(data), "read_ms": timed(snapshot_file.read_bytes)}

    def zstd(level: int) -> Callable[[bytes], bytes]:
        return lambda d: bytes(ZstdCompressor(level=level).compress(d, ZstdCompressor.FLUSH_FRAME))

    def unzstd(packed: bytes) -> bytes:
        return bytes(ZstdDecompressor().decompress(packed))

    codecs: dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]] = {
        "zstd-1": (zstd(1), unzstd),
        "zstd-3": (zstd(3), unzstd),
    }
    try:
        import lz4.frame  # type: ignore[import-untyped]

        codecs["lz4"] = (lz4.frame.compress, lz4.frame.decompress)
    except ImportError:
        found["lz4"] = "not installed"
    for name, (compress, decompress) in codecs.items():
        packed = compress(data)
        assert decompress(packed) == data
        found[name] = {
            "ratio": round(len(packed) / len(data), 3),
            "decompress_ms": round(timed(lambda: decompress(packed)), 1),  # noqa: B023 (called at once)
        }
    found["read_ms"] = round(found["read_ms"], 1)
    return found


def restart(model: Path, sizes: list[int], states_per_size: int, start_server: Any) -> dict[str, Any]:
    """`start_server(model, *flags)` is bench.servers' onepass_server."""
    engine = Engine(model, n_ctx=512, contexts=1)  # the tokenizer, to size the states
    states = {
        size: [sized_text(engine, SENTENCES, size, f"r{size}-{i}") for i in range(states_per_size)] for size in sizes
    }
    engine.close()
    rows: dict[int, dict[str, Any]] = {size: {"state_tokens": size} for size in sizes}
    progress = Progress(len(sizes) * (2 * states_per_size + HIT_RUNS), "restart")
    # Beside the default snapshot folder: on the disk users' snapshots live on (/tmp may be RAM).
    DEFAULT_SNAPSHOT_DIR.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-snapshots-", dir=DEFAULT_SNAPSHOT_DIR.parent) as folder:
        flags = ("--session-cache-dir", folder, "--session-cache-disk-bytes", str(16 * 1024**3))
        with httpx.Client(timeout=900) as client:
            with start_server(model, *flags) as (url, _):
                ask(client, url, "warm-up: learns the questions' calibration priors", QUESTIONS)
                for size in sizes:
                    cold = []
                    for state in states[size]:
                        ms, data = ask(client, url, state, QUESTIONS)
                        assert data["x_cache"] == "miss"
                        cold.append(ms)
                        progress.step(f"{size} tokens cold")
                    hits = []
                    for _ in range(HIT_RUNS):
                        ms, data = ask(client, url, states[size][-1], QUESTIONS)
                        assert data["x_cache"] == "hit"
                        hits.append(ms)
                        progress.step(f"{size} tokens RAM hit")
                    rows[size] |= {"cold_ms": median(cold), "ram_hit_ms": median(hits)}
            # stopped: SIGTERM finished the queued writes
            with start_server(model, *flags) as (url, _):
                ask(client, url, "warm-up after the restart", QUESTIONS)
                for size in sizes:
                    device: list[float] = []
                    page_cache: list[float] = []
                    for i, state in enumerate(states[size]):
                        from_device = i % 2 == 0
                        if from_device:
                            drop_from_page_cache(Path(folder))
                        ms, data = ask(client, url, state, QUESTIONS)
                        assert data["x_cache"] == "disk", data["x_cache"]
                        (device if from_device else page_cache).append(ms)
                        progress.step(f"{size} tokens disk hit")
                    row = rows[size]
                    row["disk_hit_device_ms"] = median(device)
                    row["disk_hit_page_cache_ms"] = median(page_cache) if page_cache else None
                    row["disk_over_ram_hit"] = round(row["disk_hit_device_ms"] / row["ram_hit_ms"], 3)
                    row["cold_over_disk_hit"] = round(row["cold_ms"] / row["disk_hit_device_ms"], 1)
                disk = next(iter(client.get(url + "/v1/cache").json().values()))["disk"]
        largest = max(Path(folder).rglob(f"*{SUFFIX}"), key=lambda p: p.stat().st_size)
        packed = compression(largest)
    return {
        "rows": list(rows.values()),
        "disk_read_mb_per_s": round(disk["read_bytes"] / disk["read_seconds"] / 1e6, 1),
        "disk": {k: disk[k] for k in ("entries", "bytes", "hits", "writes", "writes_skipped", "rejected")},
        "compression": packed,
    }


def markdown(found: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "Restart: 5 questions; cold = prefill, RAM hit, then the server restarted and the same states asked "
        "again, their snapshots read from disk (device: the file dropped from the page cache first):",
        "",
    ]
    lines += table(
        [
            "state tokens",
            "cold",
            "RAM hit",
            "disk hit (device)",
            "disk hit (page cache)",
            "disk / RAM hit",
            "cold / disk",
        ],
        [
            [
                r["state_tokens"],
                r["cold_ms"],
                r["ram_hit_ms"],
                r["disk_hit_device_ms"],
                r["disk_hit_page_cache_ms"] or "-",
                r["disk_over_ram_hit"],
                f"{r['cold_over_disk_hit']}x",
            ]
            for r in found["rows"]
        ],
    )
    c = found["compression"]
    codecs = ", ".join(
        f"{name} {v['ratio']:.3f} of the size, {v['decompress_ms']} ms to decompress"
        for name, v in c.items()
        if isinstance(v, dict)
    )
    lines += [
        "",
        f"Disk reads (read + verify): {found['disk_read_mb_per_s']} MB/s. Compression of the largest snapshot "
        f"({c['bytes'] / 1e6:.1f} MB, read in {c['read_ms']} ms from the page cache): {codecs}.",
    ]
    return lines


def main() -> None:

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--states", type=int, default=2, help="states per size (alternately from device and cache)")
    args = parser.parse_args()
    found = restart(args.model, args.sizes, args.states, onepass_server)
    print(json.dumps(found, indent=2))
    print("\n".join(markdown(found)))


if __name__ == "__main__":
    main()
