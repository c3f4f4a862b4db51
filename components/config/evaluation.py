"""The `evaluation` section: the Evaluator's accuracy gates."""

from __future__ import annotations

from typing import Self

from pydantic import model_validator

from components.config.validation import fail, section


@section("evaluation")
class EvaluationConfig:
    """Evaluator (TFMA) gates: a candidate that fails one is not pushed.

    Attributes:
      min_accuracy: Value threshold: the candidate must reach this accuracy.
      max_accuracy_drop: Change threshold for the student against the
        teacher baseline: accuracy may drop at most this much (absolute).
      against_served: Compare the candidate with the latest model this
        pipeline blessed (what it serves): a run that does not match it
        within `change_threshold` is not pushed. A first run, with nothing
        served yet, is judged by `min_accuracy` alone.
      change_threshold: How far (absolute) the candidate's accuracy may fall
        below the served model's and still be pushed; 0 means it must match
        or beat it.
    """

    min_accuracy: float = 0.5
    max_accuracy_drop: float = 0.05
    against_served: bool = True
    change_threshold: float = 0.0

    @model_validator(mode="after")
    def _check(self) -> Self:
        for name in ("min_accuracy", "max_accuracy_drop", "change_threshold"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                fail(name, f"expected a number in [0, 1], got {value}")
        return self
