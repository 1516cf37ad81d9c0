"""The GPU path on a real device backend (make test-gpu: the Vulkan build on Mesa's lavapipe, every layer
offloaded): the layers and the KV cache really are on the device, a snapshot saved from device KV
restores exactly, and the disk tier keeps device and CPU snapshots apart.

In a CPU build (make test) these are skipped, saying so; the rest of make test-gpu's suite (engine,
cache, disk tier, layouts, properties with their batch-noise bound measured in the run) runs with
every layer on the device through ONEPASS_TEST_GPU_LAYERS=-1.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from app.engine.bindings import gpu_offload_supported, llama_log, shipped_backends
from app.engine.engine import Engine, SuffixTokens
from app.engine.snapshot import Prefix
from app.wire.contract import SystemOneRequest
from tests.support.llama_calls import LlamaCalls
from tests.support.loading import load_model
from tests.support.prefill_decodes import request_during_prefill
from tests.support.settings import GPU_LAYERS, tiny_settings
from tests.support.skip_groups import skip_if
from tools.check_gpu import Placement

pytestmark = skip_if(
    not gpu_offload_supported() or GPU_LAYERS == 0,
    "gpu",
    "a CPU build, or ONEPASS_TEST_GPU_LAYERS unset: make test-gpu runs these on a Vulkan device",
)

WAIT_S = 120  # every wait here is bounded; lavapipe decodes a piece in about a second

REQUEST = SystemOneRequest.model_validate(
    {
        "model": "jev-latest",
        "state": "The parcel arrived broken and I want my money back.",
        "questions": {
            "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
            "team": {"type": "choice", "criteria": {"Billing": None, "Shipping": None}},
        },
    }
)


def placed(path: Path, layers: int) -> tuple[Engine, list[str]]:
    placement = Placement()
    llama_log.addHandler(placement)
    level = llama_log.level
    llama_log.setLevel(logging.DEBUG)
    try:
        engine = Engine(path, n_ctx=1024, n_gpu_layers=layers, threads=1, contexts=2)
    finally:
        llama_log.removeHandler(placement)
        llama_log.setLevel(level)
    return engine, placement.lines


def test_every_layer_and_the_kv_cache_are_on_the_device(tiny_chat_path: Path) -> None:
    engine, lines = placed(tiny_chat_path, -1)
    engine.close()
    offloaded = next(line for line in lines if "offloaded" in line)  # llama.cpp's own account, not our flags
    done, total = offloaded.split("offloaded ")[1].split(" layers")[0].split("/")
    assert done == total and int(total) > 0, offloaded
    kv = [line for line in lines if "KV buffer size" in line]
    assert kv and all(not line.split("KV buffer")[0].strip().endswith("CPU") for line in kv), kv
    assert any("model buffer size" in line and "CPU" not in line.split("model buffer")[0] for line in lines), lines


def test_a_snapshot_saved_from_device_kv_restores_exactly_into_a_pooled_context(
    tiny_chat_path: Path, llama_calls: LlamaCalls
) -> None:
    engine, _ = placed(tiny_chat_path, -1)
    try:
        prefix, _ = engine.prefill(
            Prefix(tuple(engine.vocab.tokenize("A state whose KV lives on the device.", add_bos=True)))
        )
        labels = [engine.vocab.tokenize(word)[0] for word in ("Yes", "No")]
        suffixes = [
            SuffixTokens(tuple(engine.vocab.tokenize(text)), labels) for text in (" Refund?", " Angry?", " Billing?")
        ]
        held = engine.decode_suffixes(prefix, suffixes)  # in the context that prefilled it
        restores = llama_calls.restores
        engine.prefill(Prefix(tuple(engine.vocab.tokenize("Another state in between.", add_bos=True))))
        engine.prefill(Prefix(tuple(engine.vocab.tokenize("And a third, so both contexts hold others.", add_bos=True))))
        restored = engine.decode_suffixes(prefix, suffixes)
        assert llama_calls.restores > restores  # copied back from the saved bytes
        assert [r.label_logits for r in restored.readouts] == [r.label_logits for r in held.readouts]
    finally:
        engine.close()


def test_a_request_during_a_piece_on_the_device_waits_for_it_and_the_prefill_ends_alike(
    tiny_chat_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device backend never gives a decode up, and picks its kernels by the batch's size: a prefill there
    hands its context over between whole pieces only, llama.cpp's own micro-batches, so that its snapshot
    is that of a prefill nobody interrupted."""
    engine = Engine(tiny_chat_path, n_ctx=2048, n_gpu_layers=-1, threads=1, probe_layer="middle")
    try:
        assert not engine._pool.can_give_up
        tokens = engine.vocab.tokenize("the parcel came late again. " * 60, add_bos=True)
        assert len(tokens) > 2 * engine.n_ubatch
        alone, _ = engine.prefill(Prefix(tuple(tokens)))
        handed = request_during_prefill(engine, Prefix(tuple(tokens)), monkeypatch, 2, wait_s=WAIT_S)
        assert handed.when_lent == [0, 0]  # the second piece ended before the request had the context
        statuses, sizes = handed.decodes.statuses, handed.decodes.sizes
        assert set(statuses) == {0} and set(sizes[:-1]) == {engine.n_ubatch}  # whole pieces
        assert handed.snapshot.data == alone.data
        assert handed.snapshot.state_mean is not None and alone.state_mean is not None
        assert handed.snapshot.state_mean.tobytes() == alone.state_mean.tobytes()
    finally:
        engine.close()


def test_device_and_cpu_snapshots_on_disk_refuse_each_other(tiny_chat_path: Path, tmp_path: Path) -> None:
    """The build identity in every file names where the layers ran: one written with the layers on
    the CPU is refused by a server with them on the device, and the other way round."""

    def answer(layers: int, folder: Path) -> tuple[str, dict[str, int]]:
        disk = {"session_cache_dir": folder, "session_cache_disk_bytes": 1 << 30}
        service = load_model(tiny_settings(tiny_chat_path, n_gpu_layers=layers, **disk))
        try:
            assert ("n_gpu_layers=0;" in service.engine.build) == (layers == 0)
            shipped = shipped_backends()  # cpu and the device's: vulkan, cuda, ...
            assert set(shipped) - {"cpu"}, shipped
            assert f"ggml backends {'+'.join(shipped)};" in service.engine.build  # the build names its device backend
            return service.answer(REQUEST).x_cache, dict(service.cache_stats()["disk"]["rejected"])
        finally:
            service.close()  # finishes the background writes

    for writer, reader in ((0, -1), (-1, 0)):
        folder = tmp_path / f"written-with-{writer}"
        assert answer(writer, folder) == ("miss", {})
        cache, rejected = answer(reader, folder)  # the writer's file is refused (and deleted): a miss
        assert cache == "miss" and sum(rejected.values()) > 0, (writer, reader, rejected)
        assert answer(reader, folder) == ("disk", {})  # the file the reader wrote in its place is its own


@skip_if(os.environ.get("ONEPASS_TEST_SMALL_MODEL") is None, "gpu", "no small model named (make test-gpu names one)")
def test_the_small_model_answers_on_the_device_hit_equal_to_miss() -> None:
    path = Path(os.environ["ONEPASS_TEST_SMALL_MODEL"])
    service = load_model(tiny_settings(path, n_ctx=1024, n_gpu_layers=-1))
    try:
        one = {"refund": REQUEST.questions["refund"]}
        request = SystemOneRequest.model_validate({"model": "m", "state": REQUEST.state, "questions": one})
        miss, hit = service.answer(request), service.answer(request)
        assert (miss.x_cache, hit.x_cache) == ("miss", "hit")
        assert miss.wire()["answers"] == hit.wire()["answers"]
        assert 0.0 <= miss.wire()["answers"]["refund"]["noul"] <= 1.0
    finally:
        service.close()
