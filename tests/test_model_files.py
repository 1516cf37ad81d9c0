"""A model file is known by every byte: its fingerprint, the snapshots the disk tier trusts for it,
and the settings that belong to it (app/known_models.toml), whatever path or config serves it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.config_sources import load_settings
from app.engine.fingerprint import file_digest, hash_file, model_digest, records_dir
from app.platform.tiny_gguf import write_tiny_gguf
from app.serving.known_models import KnownModel, identify, read_known_models
from app.serving.loading import load_spec
from app.serving.specs import MODEL_FILE, read_models_config
from app.wire.contract import SystemOneRequest
from tests.support.loading import load_model
from tests.support.settings import tiny_settings

HEAD = 1 << 20  # what the fingerprint used to cover: the GGUF's header, metadata and vocabulary
QUESTIONS: dict[str, Any] = {
    "angry": {"type": "noul", "instructions": "Is the customer angry?"},
    "team": {"type": "choice", "criteria": {"Billing": "money", "Tech": None}},
}
REQUEST = SystemOneRequest.model_validate(
    {"model": "jev-latest", "state": "I was charged twice and nobody answers my mails.", "questions": QUESTIONS}
)


def retrained(original: Path, out: Path) -> Path:
    """The same file with other weights in its last tensor: same size, same header (a fine-tune of
    the same base, a re-quantization), as a file replaced in place would be."""
    shutil.copyfile(original, out)
    with out.open("r+b") as f:
        f.seek(-65536, os.SEEK_END)
        weights = np.frombuffer(f.read(65536), dtype=np.float32)
        f.seek(-65536, os.SEEK_END)
        f.write((weights * -1.5).astype(np.float32).tobytes())
    return out


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("wide") / "wide.gguf", seed=5, n_ff=2048)


def numbers(path: Path, folder: Path | None = None) -> tuple[str, str]:
    disk = {"session_cache_dir": folder, "session_cache_disk_bytes": 1 << 30} if folder is not None else {}
    service = load_model(tiny_settings(path, **disk))
    try:
        answered = service.answer(REQUEST)
        return answered.x_cache, json.dumps(json.loads(answered.to_json())["answers"], sort_keys=True)
    finally:
        service.close()


def test_two_files_with_one_header_and_other_weights_get_different_fingerprints(wide: Path, tmp_path: Path) -> None:
    other = retrained(wide, tmp_path / "wide.gguf")
    assert other.stat().st_size == wide.stat().st_size > 3 * HEAD
    with wide.open("rb") as a, other.open("rb") as b:
        assert a.read(HEAD) == b.read(HEAD)  # what the first-MiB fingerprint saw: identical
    assert file_digest(wide) != file_digest(other)
    assert file_digest(wide) == hash_file(wide)  # from the record, the digest of every byte


def test_a_vision_projectors_every_byte_is_part_of_the_models_fingerprint(wide: Path, tmp_path: Path) -> None:
    projector = shutil.copyfile(wide, tmp_path / "mmproj.gguf")  # any file: only its bytes count here
    other = retrained(wide, tmp_path / "other-mmproj.gguf")
    with_one, with_other = model_digest(wide, projector), model_digest(wide, other)
    assert len({model_digest(wide), with_one, with_other}) == 3
    assert model_digest(wide) == file_digest(wide)  # a model without a projector keeps its fingerprint
    assert model_digest(wide, shutil.copyfile(projector, tmp_path / "elsewhere.gguf")) == with_one  # bytes, not path


def test_a_file_replaced_in_place_by_other_weights_refuses_the_old_snapshots(wide: Path, tmp_path: Path) -> None:
    served = shutil.copyfile(wide, tmp_path / "model.gguf")
    folder = tmp_path / "snapshots"
    assert numbers(served, folder)[0] == "miss"
    assert numbers(served, folder)[0] == "disk"  # the first server's snapshot, after a restart
    replacement = retrained(wide, tmp_path / "replacement.gguf")
    with served.open("r+b") as f:  # rewritten in place: same path, same inode, same size
        f.write(replacement.read_bytes())
    cache, answers = numbers(served, folder)
    assert cache == "miss"
    assert answers == numbers(replacement)[1] != numbers(wide)[1]  # its own weights' answers, not the old KV's


def test_a_digest_record_is_verified_and_a_damaged_one_is_hashed_again(wide: Path, tmp_path: Path) -> None:
    copy = shutil.copyfile(wide, tmp_path / "copy.gguf")
    digest = file_digest(copy)
    (record,) = [p for p in records_dir().glob("*.json") if json.loads(p.read_text())["path"] == str(copy.resolve())]
    fields = json.loads(record.read_text())
    record.write_text(json.dumps({**fields, "blake3": "00" * 32}))  # its check no longer matches
    assert file_digest(copy) == digest
    assert json.loads(record.read_text())["blake3"] == digest.hex()  # written again, whole


@pytest.fixture
def known(tiny_chat_path: Path) -> tuple[KnownModel, ...]:
    model = KnownModel(
        "tiny",
        tiny_chat_path.name,
        tiny_chat_path.stat().st_size,
        hash_file(tiny_chat_path).hex(),
        {"calibration_temperature": 0.5, "n_ctx": 2048},
    )
    return (model,)


def test_a_known_file_is_known_by_its_bytes_under_any_name(
    tiny_chat_path: Path, tmp_path: Path, known: tuple[KnownModel, ...]
) -> None:
    renamed = shutil.copyfile(tiny_chat_path, tmp_path / "renamed.gguf")
    assert identify(renamed, known) == known[0]
    other = retrained(tiny_chat_path, tmp_path / "tiny-chat.gguf")  # the known name, other weights
    assert identify(other, known) is None
    assert identify(tmp_path / "absent.gguf", known) is None


def test_a_known_file_brings_its_settings_through_a_config_and_through_model_alone(
    tiny_chat_path: Path, tmp_path: Path, known: tuple[KnownModel, ...]
) -> None:
    config = tmp_path / "onepass.toml"
    config.write_text(f'[server]\nthreads = 1\n\n[[models]]\nname = "tiny"\npath = "{tiny_chat_path}"\n')
    common = ["--repack", "off", "--flash-attn", "off", "--session-cache-disk-bytes", "0", "--threads", "1"]
    (through_config,) = read_models_config(load_settings([*common, "--config", str(config)], {}), known).models
    (alone,) = read_models_config(load_settings([*common, "--model", str(tiny_chat_path)], {}), known).models
    for spec in (through_config, alone):
        assert spec.known == "tiny"
        assert (spec.settings.calibration_temperature, spec.settings.n_ctx) == (0.5, 2048)
        assert spec.origins["calibration_temperature"] == MODEL_FILE
    assert through_config.settings == alone.settings
    answers = []
    for spec in (through_config, alone):
        service = load_spec(spec)
        try:
            answers.append(json.loads(service.answer(REQUEST).to_json())["answers"])
        finally:
            service.close()
    assert json.dumps(answers[0]) == json.dumps(answers[1])  # the same numbers, bit for bit
    # anything the user sets wins over the file's settings
    flagged = read_models_config(
        load_settings([*common, "--model", str(tiny_chat_path), "--calibration-temperature", "2"], {}), known
    ).models[0]
    assert flagged.settings.calibration_temperature == 2.0 and flagged.settings.n_ctx == 2048


def test_the_shipped_table_pins_every_known_model_by_size_and_digest() -> None:
    models = read_known_models()
    assert {model.key for model in models} == {"default", "small"}
    for model in models:
        assert model.size > 0 and len(bytes.fromhex(model.blake3)) == 32
    default = next(model for model in models if model.key == "default")
    assert default.settings == {"calibration_temperature": 0.45}
