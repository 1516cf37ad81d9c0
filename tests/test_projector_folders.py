"""A projector is part of a model's folder name (fits and snapshots): adding --mmproj starts new folders,
and the log says so at load, naming the folder, so that a user's fits made without it are not silently
left behind."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.platform.tiny_gguf import write_tiny_gguf
from app.platform.tiny_projector import write_tiny_mmproj
from app.serving.loading import fits_folder
from app.serving.specs import ModelSpec
from tests.support.loading import load_model
from tests.support.settings import tiny_settings


def test_a_projector_starts_new_folders_and_the_load_log_names_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = write_tiny_gguf(tmp_path / "text.gguf")
    mmproj = write_tiny_mmproj(tmp_path / "mmproj.gguf", "mlp")
    without = tiny_settings(text, calibration_dir=tmp_path / "fits", session_cache_disk_bytes=0)
    with_projector = tiny_settings(text, mmproj=mmproj, calibration_dir=tmp_path / "fits", session_cache_disk_bytes=0)
    plain_folder = fits_folder(ModelSpec.from_settings(without))
    projector_folder = fits_folder(ModelSpec.from_settings(with_projector))
    assert plain_folder != projector_folder  # the projector's bytes are in the folder's name

    with caplog.at_level(logging.INFO, logger="onepass.loading"):
        service = load_model(with_projector)
    service.close()
    said = [r.getMessage() for r in caplog.records if r.name == "onepass.loading"]
    assert any(projector_folder.name in line and "made without it" in line for line in said), said
    assert service.calibration.store is not None and service.calibration.store.folder == projector_folder

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="onepass.loading"):
        load_model(without).close()
    assert not [r for r in caplog.records if "projector" in r.getMessage()]
