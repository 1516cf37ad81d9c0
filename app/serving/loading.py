"""Loading one model: its GGUF into an engine, its prompts, its cache and its base snapshot."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import blake3

from app.answering.decision import DecisionPrompter
from app.answering.decision_format import WHOLE, DecisionError, read_format
from app.answering.dependence import dependence_of
from app.answering.encoders import EncoderPrompter, Specials
from app.answering.prompter import ContextBound, Prompter
from app.answering.prompting import OwnPrompter
from app.answering.service import ModelService
from app.calibration import CONTENT_FREE_STATES, Calibration, DiskPriors, FitStore, Priors
from app.engine.bindings import decision_order_setter, shipped_backends
from app.engine.devices import gpu_layers_problem
from app.engine.disk_tier import DiskTier
from app.engine.engine import Engine
from app.engine.fingerprint import model_digest
from app.engine.ram_tier import CacheKey, RamTier, cache_key
from app.engine.snapshot_file import SnapshotIdentity
from app.engine.tiers import PrefixCache
from app.platform.tuning import choose, choose_threads
from app.serving.specs import ModelSpec

log = logging.getLogger("onepass.loading")

QUESTION_SETS = 8  # question-first layout: question sets kept (a pipeline asks one set many times)


def read_context(path: Path | None) -> str:
    """The system context file's text (the config check made sure it exists); none without one."""
    return "" if path is None else path.read_text(encoding="utf-8")


def prompter_for(engine: Engine, template: str = "auto", context: str = "", layout: str = "state-first") -> Prompter:
    """The prompts a model is served with: a decision GGUF's own format (app/answering/decision.py), else its
    chat template ("auto") or the plain layout. The prompters read the model's vocabulary alone.

    The bench renders llama-server's prompts with this too, so both sides see the same text.
    """
    vocab = engine.vocab
    decision = read_format(vocab.metadata, vocab.metadata_keys())
    if decision is not None:
        # the BOS and EOS libmtmd adds to a prompt with images: the ones the vocabulary adds
        ends = (vocab.bos_token if vocab.add_bos else None, vocab.eos_token if vocab.add_eos else None)
        if context.strip() or layout != "state-first":
            log.warning(
                "a %s decision model is prompted by its own template: context and layout are ignored", decision.kind
            )
        if decision.kind in WHOLE:
            if not engine.memoryless:
                raise DecisionError(f"a {decision.kind} decision model keeps no memory, but this one does: not served")
            if decision.kind == "clef" and decision_order_setter() is None:
                raise DecisionError(
                    f"clef needs llama_batch_ext_set_decision_order, which this llama.cpp build ({engine.build}) lacks"
                )
            texts = {t: vocab.piece(t) for t in (vocab.mask_token, vocab.sep_token) if t >= 0}
            specials = Specials(vocab.mask_token, vocab.sep_token, texts)
            # an encoder cuts its prompt to fit: no text is refused for its length, only kept when it fits
            whole = ContextBound(engine.n_ctx)
            return EncoderPrompter(vocab, decision, vocab.control_texts(), specials, engine.vision, ends, whole)
        bound = ContextBound(engine.n_ctx, vocab.longest_token_bytes())
        return DecisionPrompter(vocab, decision, vocab.control_texts(), engine.vision, ends, bound)
    chat_template = vocab.metadata("tokenizer.chat_template") if template == "auto" else None
    return OwnPrompter.for_model(
        vocab,
        chat_template,
        vocab.special_token_text(vocab.bos_token),
        vocab.special_token_text(vocab.eos_token),
        context,
        layout,
        engine.vision,
        ContextBound(engine.n_ctx, vocab.longest_token_bytes()),
    )


@dataclass(frozen=True)
class SpeedSettings:
    threads: int
    repack: bool
    flash_attn: bool


def speed_settings_for(spec: ModelSpec) -> SpeedSettings:
    """Threads, repacked weights and flash attention as configured, or measured (0 threads and
    "auto"; each with the settings before it as they will be). With layers on a GPU repacked
    weights are never used, and "auto" flash attention is on where the build's GPU backend is CUDA
    (docs/gpu.md: on an H200 it kept hit, miss and cache off exact and restored snapshots many times
    faster, its V cache no longer transposed), else off, as no other device has been measured. A
    missing model file gets plain settings: the engine then reports it."""
    if not spec.path.is_file():
        return SpeedSettings(spec.settings.threads, False, False)
    threads = spec.settings.threads or choose_threads(spec.path)
    if spec.settings.n_gpu_layers != 0 or spec.settings.repack == "off":
        repack = False
    else:
        repack = spec.settings.repack == "on" or choose(spec.path, threads, "repack")
    if spec.settings.n_gpu_layers != 0 and spec.settings.flash_attn == "auto":
        return SpeedSettings(threads, repack, "cuda" in shipped_backends())
    if spec.settings.flash_attn != "auto" or spec.settings.n_gpu_layers != 0:
        return SpeedSettings(threads, repack, spec.settings.flash_attn == "on")
    return SpeedSettings(threads, repack, choose(spec.path, threads, "flash_attn", {"repack": repack}))


def model_folder(spec: ModelSpec, engine: Engine) -> str:
    """A model's subfolder name (snapshots, fits): its file and fingerprint, so servers of one model
    file share it and different models never meet."""
    return _folder_name(spec, engine.fingerprint)


def _folder_name(spec: ModelSpec, fingerprint: bytes) -> str:
    return f"{spec.path.stem}-{fingerprint.hex()[:16]}"


def fits_folder(spec: ModelSpec) -> Path:
    """The folder fits_for gives the model, named from its files without loading it: the fingerprint is
    the engine's (model_digest), read from its record while the files are unchanged, else hashed.
    OSError when a file is missing."""
    return spec.settings.calibration_dir / _folder_name(spec, model_digest(spec.path, spec.settings.mmproj))


def disk_tier_for(spec: ModelSpec, engine: Engine) -> DiskTier | None:
    """The model's snapshot folder (model_folder)."""
    if spec.settings.session_cache_disk_bytes <= 0:
        return None
    fingerprint = engine.fingerprint.hex()
    return DiskTier(
        spec.settings.session_cache_dir / model_folder(spec, engine),
        spec.settings.session_cache_disk_bytes,
        SnapshotIdentity(build=engine.build, model=fingerprint, kv=engine.kv_settings),
    )


def fits_for(spec: ModelSpec, engine: Engine, prompter: Prompter) -> FitStore:
    """The model's fitted calibrations (model_folder), valid only for the prompt they were fitted
    under (its text around the state, and the layout; a decision model's template)."""
    identity = blake3.blake3(f"{engine.fingerprint.hex()}\0{prompter.identity}".encode()).hexdigest()
    return FitStore(spec.settings.calibration_dir / model_folder(spec, engine), identity[:32])


def assemble(
    name: str,
    engine: Engine,
    prompter: Prompter,
    cache: RamTier,
    *,
    calibration: str = "none",
    calibration_temperature: float = 1.0,
    coverage: float = 0.9,
    disk: DiskTier | None = None,
    fits: FitStore | None = None,
    key_fn: Callable[..., CacheKey] = cache_key,
    max_prompt_tokens: int = 0,
) -> ModelService:
    """A model's service from its parts: the states' prefix cache on `cache` and `disk`, the question
    sets' beside it, the content-free priors (kept on `disk` too), the calibration and its `fits`, the
    budget of prompt tokens per request (0: none). `key_fn`: a test hook (a constant key forces hash
    collisions)."""
    states = PrefixCache(engine, cache, disk, key_fn)
    # "0 disables the cache" (session_cache_entries or _tokens) holds for the question sets' too
    question_sets = PrefixCache(engine, RamTier(QUESTION_SETS if cache.enabled else 0, cache.max_tokens), disk, key_fn)
    priors = Priors(
        [prompter.state_tokens(state) for state in CONTENT_FREE_STATES],
        lambda base, jobs: engine.decode_suffixes(base, jobs).readouts,
        DiskPriors(disk, engine.fingerprint, engine.kv_settings) if disk is not None else None,
    )
    policy = Calibration(calibration, calibration_temperature, priors, fits, coverage)
    dependence = dependence_of(prompter)
    return ModelService(name, engine, prompter, states, question_sets, policy, dependence, max_prompt_tokens)


def load_spec(spec: ModelSpec) -> ModelService:
    problem = gpu_layers_problem(spec.settings.n_gpu_layers)
    if problem is not None:  # the CLI refuses to start with it; a caller that loads anyway is told
        log.warning("%s: %s", spec.name, problem)
    speed = speed_settings_for(spec)
    engine = Engine(
        spec.path,
        n_ctx=spec.settings.n_ctx,
        n_gpu_layers=spec.settings.n_gpu_layers,
        threads=speed.threads,
        contexts=spec.settings.contexts,
        repack=speed.repack,
        flash_attn=speed.flash_attn,
        probe_layer="middle",  # the state probe fit's vector: Snapshot.state_mean
        mmproj=spec.settings.mmproj,
        batch_requests=spec.settings.batch_requests,
        answer_during_prefill=spec.settings.answer_during_prefill,
    )
    if spec.settings.mmproj is not None:
        # The folder's name holds the projector's fingerprint too: what was kept without this
        # projector (or with another) is not found here, and a user who just added one should know.
        log.info(
            "%s: with its projector, fits and snapshots are kept in %s/ (the model file and projector "
            "together): those made without it, or with another, are not used",
            spec.name,
            model_folder(spec, engine),
        )
    try:
        prompter = prompter_for(
            engine, spec.settings.template, read_context(spec.settings.context_path), spec.settings.layout
        )
        cache = RamTier(spec.settings.session_cache_entries, spec.settings.session_cache_tokens)
        calibration = spec.settings.calibration
        if isinstance(prompter, DecisionPrompter) and calibration == "contextual" and not prompter.state_first:
            log.info("%s: no contextual calibration (its template does not put the state first)", spec.name)
            calibration = "none"
        return assemble(
            spec.name,
            engine,
            prompter,
            cache,
            calibration=calibration,
            calibration_temperature=spec.settings.calibration_temperature,
            coverage=spec.settings.answer_set_coverage,
            disk=disk_tier_for(spec, engine) if cache.enabled else None,
            fits=fits_for(spec, engine, prompter),
            max_prompt_tokens=spec.settings.max_prompt_tokens,
        )
    except BaseException:
        engine.close()
        raise
