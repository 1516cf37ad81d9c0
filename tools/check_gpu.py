"""make check-gpu: the GPU path step by step, each step under its own timeout, so that a failure or a
hang names its step instead of ending a run with no word.

python -m tools.check_gpu [MODEL.gguf] [--timeout SECONDS]

Steps: loading llama.cpp (its CUDA libraries and its backends), the backends this build has, the
model load with every layer offloaded (and where llama.cpp put them), the context, one decode, a
state save, its restore, the batched decode of several suffixes (its logits finite), and bit-identity (a
restored prefix answers as the freshly prefilled one). Each line is
printed and flushed as the step starts and ends. A step that raises exits 1 and one that outlives its
timeout exits 2, both naming it (with the Python stack of a hung step).
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.engine import bindings
from app.engine.bindings import llama_log
from app.engine.devices import backends, devices, gpu_layers_problem, gpus
from app.engine.engine import Engine, SuffixTokens
from app.engine.snapshot import Prefix
from app.serving.known_models import default_model_path

# Lines of llama.cpp's load log that say which device holds what.
PLACEMENT_MARKERS = ("offload", "model buffer size", "KV buffer size", "compute buffer size", "using device")


class Placement(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if any(marker in message for marker in PLACEMENT_MARKERS):
            self.lines.append(message.strip())


def say(text: str) -> None:
    print(text, flush=True)


class Steps:
    """Runs steps in order; a watchdog ends the process when one outlives its timeout."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.current: str | None = None
        self._changed = threading.Condition()
        self._deadline = 0.0
        threading.Thread(target=self._watch, name="check-gpu-watchdog", daemon=True).start()

    def _watch(self) -> None:
        with self._changed:
            while True:
                if self.current is None:
                    self._changed.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left <= 0:
                    say(f"FAILED: step '{self.current}' did not finish in {self.timeout:g} s (it hangs); its stack:")
                    faulthandler.dump_traceback(sys.stdout, all_threads=True)
                    sys.stdout.flush()
                    os._exit(2)
                self._changed.wait(left)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        say(f"[start] {name}")
        began = time.monotonic()
        with self._changed:
            self.current, self._deadline = name, began + self.timeout
            self._changed.notify_all()
        try:
            yield
        except Exception as error:
            say(f"FAILED: step '{name}': {type(error).__name__}: {error}")
            os._exit(1)
        with self._changed:
            self.current = None
        say(f"[done]  {name} ({time.monotonic() - began:.1f} s)")


def check(model: Path, timeout: float, layers: int = -1) -> dict[str, Any]:
    steps = Steps(timeout)
    found: dict[str, Any] = {}
    placement = Placement()
    llama_log.addHandler(placement)
    llama_log.setLevel(logging.DEBUG)
    with steps.step("load llama.cpp and initialise its backends"):
        bindings.init()
    with steps.step("backends and devices"):
        found["gpu_offload"] = bindings.gpu_offload_supported()
        found["gpus"] = [str(device) for device in gpus()]
        say(f"  GPU offload in this build: {'yes' if found['gpu_offload'] else 'no (a CPU build)'}")
        say(f"  ggml backends loaded: {', '.join(backends())}")
        for device in devices():
            say(f"  device {device}")
        say(f"  {bindings.system_info()}")
    with steps.step(f"load {model.name} with n_gpu_layers={layers}"):
        engine = Engine(model, n_ctx=512, n_gpu_layers=layers, threads=1, contexts=0)
        found["placement"] = list(placement.lines)
        for line in placement.lines:
            say(f"  {line}")
        offloaded = [line for line in placement.lines if "offloaded" in line]
        found["offloaded"] = offloaded[0] if offloaded else None
    with steps.step("context creation"):
        engine.open_contexts(1)
        for line in placement.lines[len(found["placement"]) :]:
            say(f"  {line}")
    vocab = engine.vocab
    tokens = vocab.tokenize("The customer was charged twice and asks for a refund.", add_bos=True)
    labels = [vocab.tokenize(word)[0] for word in ("Yes", "No")]
    suffixes = [
        SuffixTokens(tuple(vocab.tokenize(text)), labels) for text in (" Refund?", " Angry?", " Billing question?")
    ]
    with steps.step(f"one decode (prefill of {len(tokens)} tokens)"):
        prefix, timing = engine.prefill(Prefix(tuple(tokens)))
        say(f"  {timing.prefill_ms:.0f} ms")
    with steps.step("state save"):
        say(f"  snapshot of {prefix.n_tokens} tokens: {len(prefix.data)} bytes")
    with steps.step("restore into a cleared context and decode one suffix"):
        engine.prefill(
            Prefix(tuple(vocab.tokenize("Something else entirely.", add_bos=True)))
        )  # the context now holds another
        single = engine.decode_suffixes(prefix, suffixes[:1])
        say(f"  restore {single.timing.restore_ms:.1f} ms, decode {single.timing.decode_ms:.1f} ms")
    with steps.step(f"batched decode of {len(suffixes)} suffixes"):
        first = engine.decode_suffixes(prefix, suffixes)
        say(f"  {first.n_decodes} decode(s), {first.timing.decode_ms:.1f} ms")
        logits = [x for r in first.readouts for x in r.label_logits]
        say(f"  label logits {', '.join(f'{x:.4g}' for x in logits)}")
        if not all(math.isfinite(x) for x in logits):  # NaN never equals itself: say so, not "other logits"
            raise ArithmeticError("the decode's logits are not finite: the model's numbers overflow on this device")
    with steps.step("bit-identity: a restored prefix answers as before"):
        engine.prefill(Prefix(tuple(vocab.tokenize("Yet another state.", add_bos=True))))
        again = engine.decode_suffixes(prefix, suffixes)
        if [r.label_logits for r in again.readouts] != [r.label_logits for r in first.readouts]:
            raise AssertionError("the same prefix and suffixes gave other logits after a restore")
        say("  identical")
    engine.close()
    found["ok"] = True
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.check_gpu", description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, nargs="?", default=default_model_path())
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds each step may take (default 300)")
    parser.add_argument("--layers", type=int, default=-1, help="layers to offload (default -1: all)")
    args = parser.parse_args(argv)
    found = check(args.model, args.timeout, args.layers)
    offloaded = found["offloaded"]
    if offloaded is None or " 0/" in offloaded or not found["gpus"]:
        say(f"FAILED: no layer went to a GPU: {gpu_layers_problem(args.layers) or 'no GPU device was used'}")
        sys.exit(1)
    say(f"check-gpu: every step passed, {offloaded} on {'; '.join(found['gpus'])}")


if __name__ == "__main__":
    main()
