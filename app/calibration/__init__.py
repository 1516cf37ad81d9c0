"""Calibration: how a question's raw label probabilities become its answer's.

The room below the request path. Its one face is this module: code outside imports these names
only (tests/test_layering.py says so). Calibration (policy.py) is what a loaded model asks; fitting
runs (app/fitting/) choose fits with it and keep them in its FitStore.
"""

from app.calibration.choosing import FOLDS, MIN_LABELLED, FitChoice, TooFewExamples
from app.calibration.contextual import CONTENT_FREE_STATES, DiskPriors, Priors, PriorStore
from app.calibration.evidence import Evidence, Example, SetRow, example_of, ratio_of
from app.calibration.fit import Fit, FitRecord
from app.calibration.metrics import Scores
from app.calibration.policy import AnswerProbabilities, Calibration, FitsFound, Mode, QuestionReadouts, fits_among
from app.calibration.scoring import softmax
from app.calibration.store import ANY_PROMPT, FitStore, question_key

__all__ = [
    "ANY_PROMPT",
    "CONTENT_FREE_STATES",
    "FOLDS",
    "MIN_LABELLED",
    "AnswerProbabilities",
    "Calibration",
    "DiskPriors",
    "Evidence",
    "Example",
    "Fit",
    "FitChoice",
    "FitRecord",
    "FitStore",
    "FitsFound",
    "Mode",
    "PriorStore",
    "Priors",
    "QuestionReadouts",
    "Scores",
    "SetRow",
    "TooFewExamples",
    "example_of",
    "fits_among",
    "question_key",
    "ratio_of",
    "softmax",
]
