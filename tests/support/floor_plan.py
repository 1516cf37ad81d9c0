"""app/'s floor plan: the modules of its ground floor and its rooms (subpackages) layer by layer, lowest
first. tests/test_layering.py checks that the code keeps to it, tests/test_glossary.py that
docs/architecture.md says it."""

from __future__ import annotations

# Lowest first. The ground floor is app/'s own modules; a subpackage may import those and the
# subpackages of lower layers, never one of its own layer or above.
GROUND = {
    "config",
    "config_sources",
    "confidence",
    "errors",
    "jobs",
    "paths",
    "progress",
}


LAYERS: list[set[str]] = [
    {"wire"},  # what a client sends and reads: the contract's shapes, its images read and checked
    {"engine", "fleet"},  # llama.cpp and the snapshot tiers; the replicas' routing key and processes
    {"calibration"},  # raw label probabilities to an answer's: contextual calibration, fits, their store
    {"answering", "platform"},  # one model's request path; this machine (CPU, build, tuning)
    {"serving"},  # settings per model, loading, the registry
    {"fitting"},  # fitting calibration to a user's examples: the fitting run (onepass calibrate, the jobs)
    {"labelling"},  # onepass label: a session of states ranked, labelled and refitted, on the fitting run
    {"http"},  # the HTTP edge
    {"__main__"},  # the CLI
]
