"""Fits on image states (tiny text model with the tiny LLaVA projector, real llama.cpp): examples carry
their images as a JSON request does, the state's mean hidden vector reads the image's rows, a state
probe learns what only the image says, and serves new image states by it, bit for bit hit, miss and
cache off. The resumable run's journal tells two examples apart by their images."""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.answering.service import ModelService
from app.fitting.examples import ExampleError, parse_examples
from app.fitting.journal import EvidenceJournal
from app.fitting.runner import answer_all, fit_all
from app.platform.tiny_gguf import write_tiny_gguf
from app.platform.tiny_images import PNG_SIGNATURE, chunk, ihdr
from app.platform.tiny_projector import write_tiny_mmproj
from app.progress import Progress
from app.wire.contract import SystemOneRequest
from tests.support.loading import load_model
from tests.support.settings import tiny_settings

LIGHT = {"type": "choice", "instructions": "Is the photo light or dark?", "criteria": {"light": None, "dark": None}}
STATE = "<photo> A photo from the archive."


def photo(light: bool, seed: int) -> bytes:
    """A 32 x 32 RGB PNG of random pixels, all in the upper half of the range or all in the lower."""
    rng = np.random.default_rng(seed)
    low = 128 if light else 0
    rows = [b"\0" + rng.integers(low, low + 128, 32 * 3, dtype=np.uint8).tobytes() for _ in range(32)]
    return PNG_SIGNATURE + ihdr(32, 32) + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b"")


def example(light: bool, seed: int) -> dict[str, Any]:
    """The same text every time: the answer is in the image alone."""
    asset = {"type": "image", "format": "png", "data_base64": base64.b64encode(photo(light, seed)).decode()}
    return {
        "state": STATE,
        "assets": {"<photo>": asset},
        "questions": {"light": LIGHT},
        "answers": {"light": "light" if light else "dark"},
    }


def examples(n: int, first_seed: int) -> list[dict[str, Any]]:
    return [example(i % 2 == 0, first_seed + i) for i in range(n)]


@pytest.fixture(scope="module")
def vision_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("image-fits")
    return write_tiny_gguf(folder / "text.gguf"), write_tiny_mmproj(folder / "mmproj.gguf", "mlp")


def served(files: tuple[Path, Path], folder: Path, **overrides: Any) -> ModelService:
    text, mmproj = files
    settings = tiny_settings(text, mmproj=mmproj, calibration="contextual", calibration_dir=folder, **overrides)
    return load_model(settings)


def test_an_example_s_images_are_read_and_a_bad_one_is_named() -> None:
    (parsed,) = parse_examples([example(True, 0)])
    assert [image.format for image in parsed.request.media.images] == ["png"]
    broken = example(True, 0)
    broken["assets"]["<photo>"]["data_base64"] = base64.b64encode(b"not an image").decode()
    with pytest.raises(ExampleError, match=r"example 1: assets.<photo>"):
        parse_examples([broken])


def test_the_journal_tells_examples_apart_by_their_images(tmp_path: Path) -> None:
    journal = EvidenceJournal(tmp_path, "model")
    light, dark, again = (
        parse_examples([e])[0].request for e in (example(True, 0), example(False, 1), example(True, 0))
    )
    assert journal.key(light, True) != journal.key(dark, True)
    assert journal.key(light, True) == journal.key(again, True)


def test_a_state_probe_learns_what_only_the_image_says_and_serves_it_bit_for_bit(
    vision_files: tuple[Path, Path], tmp_path: Path
) -> None:
    service = served(vision_files, tmp_path)
    uncached = served(vision_files, tmp_path, session_cache_entries=0)
    try:
        parsed = parse_examples(examples(40, first_seed=0))
        evidence = answer_all(service, parsed, Progress(len(parsed), "examples", show=False)).evidence
        means = [e["light"].state_mean for e in evidence]
        assert means[0] is not None and means[2] is not None and all(mean is not None for mean in means)
        assert not np.array_equal(means[0], means[2])  # the same text: the image's rows are in the mean
        reports, records = fit_all(parsed, evidence, service.calibration, question_set=False)
        (report,) = (r.to_json() for r in reports)
        assert report["adopted"] and report["method"].startswith(("state_probe/", "probe/")), report
        assert report["after"]["accuracy"] > 0.9 > report["before"]["accuracy"], report  # cross-validated
        assert service.calibration.store is not None
        service.calibration.store.put(records[0])
        right = 0
        for new in examples(12, first_seed=1000):  # images no fit saw
            body = {"model": "m", **{k: new[k] for k in ("state", "assets")}, "questions": {"tone": LIGHT}}
            request = parse_examples([body | {"answers": {}}])[0].request
            assert isinstance(request, SystemOneRequest)
            miss, hit, off = service.answer(request), service.answer(request), uncached.answer(request)
            assert (miss.x_cache, hit.x_cache, off.x_cache) == ("miss", "hit", "off")
            answers = [json.dumps(r.wire()["answers"], sort_keys=True) for r in (miss, hit, off)]
            assert len(set(answers)) == 1
            answer = miss.wire()["answers"]["tone"]
            assert answer["x_calibration"]["method"] == report["method"]
            right += answer["choice"] == new["answers"]["light"]
        assert right >= 11
    finally:
        service.close()
        uncached.close()
