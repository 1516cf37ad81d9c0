"""Image states on the session cache, against real llama.cpp: tiny text models with tiny vision
projectors (app/platform/tiny_projector.py), the "mlp" one (LLaVA-1.5) and the M-RoPE one (Qwen2-VL), asked
through HTTP with Jev's JSON assets. A repeated image state is a hit that runs no encoder, bit for
bit as the miss and as cache off; after a restart it is a disk hit; another image or another
projector is a miss; a disk header whose spans were changed is never served."""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from concurrent.futures import ThreadPoolExecutor
from ctypes import byref
from pathlib import Path
from typing import Any, NamedTuple

import blake3
import httpx
import pytest
from llama_cpp import llama_pos, mtmd_cpp
from starlette.testclient import TestClient
from typesafe_sdk import Image as SdkImage
from typesafe_sdk import Noul, RetryPolicy, TypeSafeClient

from app.engine.bindings import EngineError
from app.engine.disk_tier import SUFFIX
from app.engine.engine import SuffixTokens
from app.engine.kv_settings import N_UBATCH
from app.engine.snapshot import IMAGE_CELL, ImageSpan, Prefix, Snapshot
from app.engine.snapshot_file import MAGIC
from app.engine.vision import ImageUnreadable, Vision
from app.platform.tiny_gguf import write_tiny_gguf
from app.platform.tiny_images import PNG_SIGNATURE, chunk, ihdr, scanlines
from app.platform.tiny_projector import Projector, write_tiny_mmproj
from app.serving.registry import ModelRegistry
from app.serving.specs import ModelsConfig, ModelSpec
from app.wire.images import read_image
from tests.support.decision_cases import TEMPLATES, decision_gguf
from tests.support.image_files import Stb, jpeg
from tests.support.live import RunningServer
from tests.support.settings import tiny_settings
from tests.support.vision_serving import NAME, encodes, numbers, served

QUESTIONS: dict[str, Any] = {
    "receipt": {"type": "noul", "instructions": "Is this a receipt?"},
    "colour": {"type": "choice", "instructions": "Which colour?", "criteria": {"red": None, "blue": None}},
}


def stored_png(pixels: bytes) -> bytes:
    """A 64 x 48 RGB PNG whose pixel data is stored, not compressed: each byte of it is one in the file."""
    return PNG_SIGNATURE + ihdr(64, 48) + chunk(b"IDAT", zlib.compress(pixels, 0)) + chunk(b"IEND", b"")


PIXELS = scanlines(64, 48, seed=3)
PHOTO = stored_png(PIXELS)  # the M-RoPE projector makes a 16 x 12 patch grid of it: 8 x 6 tokens
TEXT_ARCHITECTURE: dict[Projector, str] = {"mlp": "llama", "qwen2vl_merger": "qwen2vl", "gemma3": "llama"}
# PHOTO's cells and positions: the mlp's fixed 16 tokens; M-RoPE's 8 x 6 grid advancing max(8, 6);
# Gemma 3's 4 pooled tokens.
IMAGE_SHAPE: dict[Projector, tuple[int, int]] = {"mlp": (16, 16), "qwen2vl_merger": (48, 8), "gemma3": (4, 4)}


class Files(NamedTuple):
    projector: Projector
    text: Path
    mmproj: Path
    other: Path  # another projector of the same kind


def one_pixel_changed() -> bytes:
    """PHOTO with the first pixel's red value off by one (and the two checksums over it)."""
    changed = bytearray(PIXELS)
    changed[1] ^= 1
    return stored_png(bytes(changed))


@pytest.fixture(scope="module", params=["mlp", "qwen2vl_merger", "gemma3"])
def files(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Files:
    """A text model and two projectors of one kind for it (other random weights)."""
    projector: Projector = request.param
    folder = tmp_path_factory.mktemp(projector)
    return Files(
        projector,
        write_tiny_gguf(folder / "text.gguf", architecture=TEXT_ARCHITECTURE[projector]),
        write_tiny_mmproj(folder / "mmproj.gguf", projector, seed=0),
        write_tiny_mmproj(folder / "other.gguf", projector, seed=1),
    )


def asked(image: bytes, state: str = "<photo> The paper on the table.") -> dict[str, Any]:
    """A request with one image, as Jev's JSON assets carry it."""
    asset = {"type": "image", "format": "png", "data_base64": base64.b64encode(image).decode()}
    return {"model": NAME, "state": state, "questions": QUESTIONS, "assets": {"<photo>": asset}}


def ask(client: TestClient, image: bytes = PHOTO) -> dict[str, Any]:
    response = client.post("/v1/systemone", json=asked(image))
    assert response.status_code == 200, response.text
    answered: dict[str, Any] = response.json()
    return answered


@pytest.mark.parametrize("layout", ["state-first", "question-first"])
def test_a_repeated_image_state_is_a_hit_that_runs_no_encoder_bit_for_bit_as_a_miss_and_cache_off(
    files: Files, layout: str
) -> None:
    with served(files.text, files.mmproj, session_cache_entries=0, layout=layout) as (client, off):
        reference = ask(client)
        assert reference["x_cache"] == "off" and encodes(off) == 1
    with served(files.text, files.mmproj, layout=layout) as (client, service):
        missed = ask(client)
        assert service.engine.vision is not None
        encoded_ms = service.engine.vision.encode_ms  # what the one encode took
        hit = ask(client)
        assert (missed["x_cache"], hit["x_cache"]) == ("miss", "hit")
        assert encodes(service) == 1  # the hit restored the image's cells: no encoder
        assert encoded_ms > 0 and service.engine.vision.encode_ms == encoded_ms
        assert numbers(hit) == numbers(missed) == numbers(reference)
        # usage counts each image's cells: its embedding's and the projector's text around it
        vision = service.engine.vision
        assert vision is not None
        image = vision.tokens(PHOTO, _sha256(PHOTO))
        text_only = client.post(
            "/v1/systemone", json={"model": NAME, "state": "The paper on the table.", "questions": QUESTIONS}
        ).json()
        cells = len(image.before) + image.n_tokens + len(image.after)
        assert hit["usage"]["input_tokens"] - text_only["usage"]["input_tokens"] == cells
        assert (image.n_tokens, image.n_pos) == IMAGE_SHAPE[files.projector]


def test_pooled_contexts_answer_images_at_once_as_one_at_a_time(files: Files) -> None:
    """The projector's one encoder is shared: two contexts encoding and decoding images in parallel
    answer what one context answers alone."""
    images = [stored_png(scanlines(64, 48, seed=seed)) for seed in (3, 4, 5, 6)]
    with served(files.text, files.mmproj, session_cache_entries=0) as (client, _):
        alone = [numbers(ask(client, image)) for image in images]
    with served(files.text, files.mmproj, session_cache_entries=0, contexts=2) as (client, service):
        with ThreadPoolExecutor(len(images)) as pool:
            together = list(pool.map(lambda image: numbers(ask(client, image)), images))
        assert together == alone and encodes(service) == len(images)


@pytest.mark.parametrize("compression", [False, "zstd"])
def test_the_sdks_image_over_multipart_gets_the_answers_of_the_json_asset(files: Files, compression: Any) -> None:
    """typesafe_sdk.Image, sent as the SDK sends it (multipart, zstd over 1 KiB): answered, and the same
    state as the same image sent as base64 JSON under another placeholder (a hit on it)."""
    spec = ModelSpec(NAME, files.text, settings=tiny_settings(files.text, mmproj=files.mmproj))
    registry = ModelRegistry(ModelsConfig((spec,), NAME, 1))
    running = RunningServer(spec.settings, registry)
    try:
        photo = SdkImage(PHOTO)
        client = TypeSafeClient(
            api_key="unused", base_url=running.base_url, retry=RetryPolicy(max_retries=0), compression=compression
        )
        with client:
            result = client.system_one(
                model=NAME, state=photo, questions={"receipt": Noul(instructions=QUESTIONS["receipt"]["instructions"])}
            )
        sent = result.raw_http_response.request
        assert sent.headers["content-type"].startswith("multipart/form-data; boundary=")
        assert sent.headers.get("content-encoding") == (compression or None)
        by_sdk = result.raw_http_response.json()
        payload = asked(PHOTO, state="<photo>") | {"questions": {"receipt": QUESTIONS["receipt"]}}
        by_json = httpx.post(running.base_url + "/v1/systemone", json=payload, timeout=60).json()
        assert (by_sdk["x_cache"], by_json["x_cache"]) == ("miss", "hit")
        assert numbers(by_sdk) == numbers(by_json)
    finally:
        running.stop()
        registry.close()


def test_after_a_restart_an_image_state_is_a_disk_hit_bit_for_bit(files: Files, tmp_path: Path) -> None:
    with served(files.text, files.mmproj, tmp_path) as (client, _):
        missed = ask(client)
    with served(files.text, files.mmproj, tmp_path) as (client, service):
        restored = ask(client)
        assert (missed["x_cache"], restored["x_cache"]) == ("miss", "disk")
        assert encodes(service) == 0
        assert numbers(restored) == numbers(missed)


def test_another_image_or_the_same_image_under_another_projector_is_a_miss(files: Files, tmp_path: Path) -> None:
    changed = one_pixel_changed()
    assert len(changed) == len(PHOTO) and 1 < sum(a != b for a, b in zip(changed, PHOTO, strict=True)) <= 9
    with served(files.text, files.mmproj, tmp_path) as (client, service):
        first = ask(client)
        other_image = ask(client, changed)
        assert (first["x_cache"], other_image["x_cache"]) == ("miss", "miss")
        assert encodes(service) == 2
    with served(files.text, files.mmproj) as (client, _):  # a fresh context, nothing held to cut back
        # (the projector may resize that one pixel's change away: the answers may equal the first's)
        assert numbers(ask(client, changed)) == numbers(other_image)
    with served(files.text, files.other, tmp_path) as (client, service):
        other_projector = ask(client)  # the same folder, the same image: never the first projector's snapshot
        assert other_projector["x_cache"] == "miss" and encodes(service) == 1
        assert numbers(other_projector) != numbers(first)


def test_an_image_prefix_holds_the_cells_libmtmds_own_helper_leaves(files: Files) -> None:
    """The engine decodes the projector's text itself and the image through the helper: its snapshot
    is, byte for byte, what libmtmd's mtmd_helper_eval_chunks leaves over the same chunks (their
    positions, M-RoPE's grid and Gemma 3's non-causal image attention with them)."""
    with served(files.text, files.mmproj, session_cache_entries=0) as (_, service):
        engine, vision = service.engine, service.engine.vision
        assert vision is not None
        image = vision.tokens(PHOTO, _sha256(PHOTO))
        span = ImageSpan(len(image.before), image.sha256, image.n_tokens, image.n_pos)
        tokens = (*image.before, *[IMAGE_CELL] * image.n_tokens, *image.after)
        snapshot, _ = engine.prefill(Prefix(tokens, (span,), {image.sha256: PHOTO}))
        assert (vision.mrope, vision.non_causal) == (files.projector == "qwen2vl_merger", files.projector == "gemma3")
        with engine._pool.borrow(None) as ctx, vision._tokenized(PHOTO, image.sha256) as chunks:
            ctx.clear()
            after = llama_pos(0)
            status = mtmd_cpp.mtmd_helper_eval_chunks(vision.ctx, ctx.ctx, chunks, 0, 0, N_UBATCH, False, byref(after))
            assert status == 0 and after.value == snapshot.next_pos
            own = ctx.save()
            ctx.clear()
        assert own == snapshot.data


def test_suffix_positions_start_at_the_prefixs_next_position(files: Files, monkeypatch: pytest.MonkeyPatch) -> None:
    """A question decoded after an image prefix reads what the same tokens decoded in one prefill read:
    its positions follow the image's, which with M-RoPE are fewer than its cells."""
    with served(files.text, files.mmproj, session_cache_entries=0) as (_, service):
        engine, vision = service.engine, service.engine.vision
        assert vision is not None
        image = vision.tokens(PHOTO, _sha256(PHOTO))
        head = service.base.tokens
        span = ImageSpan(len(head) + len(image.before), image.sha256, image.n_tokens, image.n_pos)
        prefix = (*head, *image.before, *[IMAGE_CELL] * image.n_tokens, *image.after, *engine.vocab.tokenize("The"))
        question = tuple(engine.vocab.tokenize(" paper on the table"))
        labels = tuple(engine.vocab.tokenize("Yes")[:1] + engine.vocab.tokenize("No")[:1])
        files_by_sha = {image.sha256: PHOTO}
        snapshot, _ = engine.prefill(Prefix(prefix, (span,), files_by_sha), service.base)
        # the reference: the question but its last token prefilled as part of the prefix
        whole, _ = engine.prefill(Prefix((*prefix, *question[:-1]), (span,), files_by_sha), service.base)
        expected = engine.decode_suffixes(whole, [SuffixTokens(question[-1:], labels)]).readouts[0].label_logits

        def read(snapshot: Snapshot) -> list[float]:
            return engine.decode_suffixes(snapshot, [SuffixTokens(question, labels)]).readouts[0].label_logits

        assert snapshot.next_pos == len(prefix) - image.n_tokens + image.n_pos
        found = read(snapshot)
        assert found == pytest.approx(expected, abs=1e-4)  # another batch split rounds its own way, no more
        shifted = property(
            lambda snapshot: len(snapshot.tokens) - sum(s.n_tokens - s.n_pos for s in snapshot.spans) + 1
        )
        monkeypatch.setattr(Snapshot, "next_pos", shifted)
        if image.n_tokens == image.n_pos:  # llama.cpp itself refuses a gap in a sequence's positions
            with pytest.raises(EngineError):
                read(snapshot)
        else:  # M-RoPE positions may jump forward: one position off reads otherwise
            assert read(snapshot) != pytest.approx(expected, abs=1e-2)


def test_a_disk_header_whose_image_spans_were_changed_is_never_served(files: Files, tmp_path: Path) -> None:
    with served(files.text, files.mmproj, tmp_path) as (client, _):
        reference = ask(client)
    (written,) = [path for path in tmp_path.rglob(f"*{SUFFIX}") if _header(path)["spans"]]
    for change in ("n_pos", "next_pos and n_pos"):
        header = _header(written)
        header["spans"][0][3] -= 1  # the image's positions
        if change == "next_pos and n_pos":  # a header that agrees with itself, but not with the request's image
            header["next_pos"] -= 1
        _rewrite_header(written, header)
        with served(files.text, files.mmproj, tmp_path) as (client, service):
            answered = ask(client)
            assert answered["x_cache"] == "miss" and encodes(service) == 1
            assert numbers(answered) == numbers(reference)
            disk = service.cache_stats()["disk"]
            if change == "n_pos":  # the spans do not give its next position: deleted
                assert (disk["rejected"], disk["collisions"]) == ({"spans": 1}, 0)
            else:  # sound, but for another image: kept, and not served
                assert (disk["rejected"], disk["collisions"]) == ({}, 1)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _header(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")
    header: dict[str, Any] = json.loads(data[len(MAGIC) + 4 : len(MAGIC) + 4 + size])
    return header


def _rewrite_header(path: Path, header: dict[str, Any]) -> None:
    """The file with another header, its checksum made right: only the header's content is wrong."""
    data = path.read_bytes()
    size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")
    rest = data[len(MAGIC) + 4 + size + 32 :]
    encoded = json.dumps(header).encode()
    path.write_bytes(MAGIC + len(encoded).to_bytes(4, "little") + encoded + blake3.blake3(encoded).digest() + rest)


def test_an_image_stb_cannot_decode_is_a_422_and_the_server_answers_on(files: Files) -> None:
    """A JPEG whose structure app/wire/images.py takes but whose frame names a quantization table stb_image
    has no room for: refused at its asset, from the decoder's own reason, never a 5xx."""
    refused = bytearray(jpeg(64, 48))
    frame = next(i for i in range(2, len(refused) - 1) if refused[i] == 0xFF and refused[i + 1] == 0xC0)
    refused[frame + 12] = 5  # the first component's quantization table: 0 to 3 exist
    assert read_image(bytes(refused)).width == 64 and Stb().size(bytes(refused)) is None
    payload = asked(b"")
    payload["assets"]["<photo>"] = {
        "type": "image",
        "format": "jpeg",
        "data_base64": base64.b64encode(refused).decode(),
    }
    with served(files.text, files.mmproj) as (client, service):
        response = client.post("/v1/systemone", json=payload)
        assert response.status_code == 422, response.text
        (detail,) = response.json()["detail"]
        assert (detail["loc"], detail["type"]) == (["body", "assets"], "image_invalid")
        assert "could not be decoded: bad TQ" in detail["msg"]
        assert ask(client)["x_cache"] == "miss" and encodes(service) == 1


def test_an_image_a_non_causal_projector_cannot_read_in_one_micro_batch_is_refused(files: Files) -> None:
    """Gemma 3's image tokens attend to each other both ways, so an image is decoded in one micro-batch:
    one that makes more tokens is refused before anything runs (a causal projector's is decoded in pieces)."""
    with served(files.text, files.mmproj, session_cache_entries=0) as (_, service):
        small = Vision(service.engine.model, files.mmproj, use_gpu=False, threads=1, max_batch=2)
        try:
            if not small.non_causal:
                assert small.tokens(PHOTO, _sha256(PHOTO)).n_tokens > 2
                return
            with pytest.raises(ImageUnreadable) as refused:
                small.tokens(PHOTO, _sha256(PHOTO))
            assert refused.value.kind == "image_too_large" and "makes 4 tokens" in str(refused.value)
        finally:
            small.close()


def test_a_decision_model_whose_template_shows_no_images_refuses_them_clearly(tmp_path: Path) -> None:
    """A decision GGUF's template places the images (tests/test_decision_images.py): one that prints
    none of them gets a 422 at the assets, as llama.cpp's libmtmd refuses it, never a text answer."""
    decision = decision_gguf(tmp_path, "openjev", TEMPLATES["openjev"])
    with served(decision, write_tiny_mmproj(tmp_path / "mmproj.gguf")) as (client, _):
        detail = client.post("/v1/systemone", json=asked(PHOTO)).json()["detail"]
        assert [(d["loc"], d["type"]) for d in detail] == [(["body", "assets"], "value_error")]
        assert "template put 0 of the request's 1 images in its prompt" in detail[0]["msg"]
