"""Image states on the session cache, in-process: a repeated image state cold and hit, with 1 and 5
questions, the vision encoder's share of a cold request, and more image states than llama-server has
slots.

No vision GGUF with its projector can be fetched here (docs/models.md, "Vision models"). Without
--mmproj the text model (the small default, gemma-3-270m) is paired with a tiny random "mlp" projector
(app/platform/tiny_projector.py) that makes IMAGE_TOKENS tokens of any image, as many as Gemma 3's projector
does: the figures show what the cache saves of an image state, not what a real vision encoder costs
(a ViT of hundreds of millions of weights; this one has a few thousand). --mmproj runs the same with
a real projector for --model.

1. cold and hit: a new image state (one image in a short text) asked with 1 and with 5 questions,
   then asked again: x_timing_ms of each, and the encoder's time in the cold one (Vision.encode_ms).
   Every hit must give the cold answers bit for bit and run no encoder.
2. image states revisited: more image states than llama-server has slots (its default 4), asked
   round-robin: every round after the first must be all hits here.

No llama-server figures here: llama-server answers images on /v1/systemone only for decision GGUFs.
bench/native_speed.py --mmproj asks both servers the same image states on one (it stops with the
server's refusal where either takes no images for that decision type).

    python -m bench.image_states [--model GGUF] [--mmproj GGUF] [--repeats N] [--states N] [--rounds N]

Writes bench/results/<date>-<sha>-image-states.{json,md}.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import tempfile
from pathlib import Path
from typing import Any

import gguf

from app.answering.service import ModelService
from app.config import Settings
from app.config_sources import load_settings
from app.engine.vision import Vision
from app.http.batch import parse_request
from app.paths import REPO_ROOT
from app.platform.tiny_images import png
from app.platform.tiny_projector import write_tiny_mmproj
from app.serving.loading import load_spec
from app.serving.specs import ModelSpec
from app.wire.contract import SystemOneResponse
from bench.output import RESULTS, Progress, git_sha, machine, median, table, write_atomically
from bench.workloads import QUESTIONS

MODEL = REPO_ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
IMAGE_TOKENS = 256  # the tiny projector's tokens per image: (128 / 8)^2
LLAMA_SERVER_SLOTS = 4  # llama-server's default -np
STATE = "The photo the customer sent: <photo> They say the parcel arrived like this."


def tiny_projector(model: Path, folder: Path) -> Path:
    """A random mlp projector whose output width is `model`'s embedding width."""
    fields = gguf.GGUFReader(str(model)).fields
    width = int(fields[f"{fields['general.architecture'].contents()}.embedding_length"].contents())
    return write_tiny_mmproj(folder / "tiny-mmproj.gguf", "mlp", width=width, image_size=128)


def image_url(seed: int) -> str:
    """A 64 x 48 PNG of its own (seeded) pixels, as a data URL (llama.cpp's `images` form)."""
    return "data:image/png;base64," + base64.b64encode(png(64, 48, seed=seed)).decode()


class Asker:
    """A loaded vision model, asked one image state at a time."""

    def __init__(self, model: Path, mmproj: Path) -> None:
        flags = ["--model", str(model), "--mmproj", str(mmproj), "--n-ctx", "4096", "--calibration", "none"]
        self.settings: Settings = load_settings([*flags, "--session-cache-disk-bytes", "0"], {})
        self.service: ModelService = load_spec(ModelSpec.from_settings(self.settings))
        vision = self.service.engine.vision
        assert vision is not None, "the model was loaded without its projector"
        self.vision: Vision = vision
        self.images = 0

    def new_image(self) -> bytes:
        self.images += 1
        return png(64, 48, seed=self.images)  # another image every time: a new state

    def ask(self, image: bytes, questions: int) -> tuple[SystemOneResponse, int, float]:
        """The response, the images it encoded and the encoder's ms."""
        asset = {"type": "image", "format": "png", "data_base64": base64.b64encode(image).decode()}
        chosen = {f"q{i}": QUESTIONS[i] for i in range(questions)}
        payload = {"model": "m", "state": STATE, "questions": chosen, "assets": {"<photo>": asset}}
        encodes, encode_ms = self.vision.encodes, self.vision.encode_ms
        response = self.service.answer(parse_request(payload, self.settings))
        return response, self.vision.encodes - encodes, self.vision.encode_ms - encode_ms


def cold_and_hit(asker: Asker, questions: int, repeats: int, progress: Progress) -> dict[str, Any]:
    rows: list[dict[str, float]] = []
    for _ in range(repeats):
        image = asker.new_image()
        cold, cold_encodes, encode_ms = asker.ask(image, questions)
        hit, hit_encodes, _ = asker.ask(image, questions)
        assert (cold.x_cache, cold_encodes, hit.x_cache, hit_encodes) == ("miss", 1, "hit", 0), (cold, hit)
        assert hit.model_dump()["answers"] == cold.model_dump()["answers"], "a hit answered otherwise"
        timing = cold.x_timing_ms
        rows.append(
            {
                "cold_ms": timing.total,
                "cold_prefill_ms": timing.prefill,
                "cold_decode_ms": timing.decode,
                "encode_ms": encode_ms,
                "hit_ms": hit.x_timing_ms.total,
                "input_tokens": cold.usage.input_tokens,
            }
        )
        progress.step()
    found = {key: median([row[key] for row in rows]) for key in rows[0]}
    found["encoder_share"] = round(found["encode_ms"] / found["cold_ms"], 3)
    found["speedup"] = round(found["cold_ms"] / found["hit_ms"], 1)
    return {"questions": questions, "repeats": repeats, **found}


def revisited(asker: Asker, states: int, rounds: int, progress: Progress) -> list[dict[str, Any]]:
    images = [asker.new_image() for _ in range(states)]
    found = []
    for round_ in range(1, rounds + 1):
        answered = [asker.ask(image, 1) for image in images]
        progress.step()
        found.append(
            {
                "round": round_,
                "hits": sum(response.x_cache == "hit" for response, _, _ in answered),
                "encodes": sum(encodes for _, encodes, _ in answered),
                "median_ms": median([response.x_timing_ms.total for response, _, _ in answered]),
            }
        )
    assert all(row["hits"] == states for row in found[1:]), found
    return found


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Image states on the session cache: {report['model']} ({report['date']}, {report['git']})",
        "",
        f"Machine: {report['machine']}. Projector: {report['projector']}. In-process, medians of "
        f"{report['cold_and_hit'][0]['repeats']} new image states each, every hit bit for bit the cold answers "
        "with no encoder run. The encoder's ms are libmtmd's encode alone; the cold prefill holds them, the "
        "image's decode and the text.",
        "",
        "## A repeated image state: cold and hit",
        "",
        *table(
            [
                "questions",
                "input tokens",
                "cold ms",
                "of which prefill",
                "of which encoder",
                "encoder share",
                "hit ms",
                "hit speed-up",
            ],
            [
                [
                    row["questions"],
                    int(row["input_tokens"]),
                    row["cold_ms"],
                    row["cold_prefill_ms"],
                    row["encode_ms"],
                    f"{100 * row['encoder_share']:.1f}%",
                    row["hit_ms"],
                    f"{row['speedup']}x",
                ]
                for row in report["cold_and_hit"]
            ],
        ),
        "",
        f"## {report['states']} image states round-robin (llama-server's default: {LLAMA_SERVER_SLOTS} slots)",
        "",
        *table(
            ["round", "hits", "images encoded", "median ms"],
            [
                [row["round"], f"{row['hits']}/{report['states']}", row["encodes"], row["median_ms"]]
                for row in report["revisited"]
            ],
        ),
        "",
        f"llama-server: {report['llama_server']}",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--mmproj", type=Path, help="the model's projector (default: a tiny random one)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--states", type=int, default=2 * LLAMA_SERVER_SLOTS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onepass-image-states-") as folder:
        mmproj = args.mmproj or tiny_projector(args.model, Path(folder))
        asker = Asker(args.model, mmproj)
        try:
            asker.ask(asker.new_image(), 1)  # the first request warms the model up: not counted
            progress = Progress(2 * args.repeats + args.rounds, "image states")
            cold = [cold_and_hit(asker, questions, args.repeats, progress) for questions in (1, 5)]
            again = revisited(asker, args.states, args.rounds, progress)
        finally:
            asker.service.close()
    projector = (
        str(args.mmproj)
        if args.mmproj
        else f"a tiny random mlp one ({IMAGE_TOKENS} tokens an image; its cost is not a real encoder's)"
    )
    report = {
        "model": args.model.name,
        "projector": projector,
        "date": datetime.date.today().isoformat(),
        "git": git_sha(),
        "machine": machine(),
        "cold_and_hit": cold,
        "states": args.states,
        "revisited": again,
        "llama_server": "not compared here: it answers images on /v1/systemone only for decision GGUFs; "
        'make bench-native BENCH_ARGS="--mmproj tiny" compares the two on image states of one',
    }
    stem = f"{report['date']}-{report['git']}-image-states"
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomically(args.out / f"{stem}.json", json.dumps(report, indent=2) + "\n")
    write_atomically(args.out / f"{stem}.md", markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
