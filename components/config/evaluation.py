"""The `evaluation` section: the Evaluator's accuracy gates."""

from __future__ import annotations

from typing import Self

from pydantic import model_validator

from components.config.validation import fail, section


@section("evaluation")
class EvaluationConfig:
    """Evaluator (TFMA) gates.

    Attributes:
      min_accuracy: Value threshold: the candidate must reach this accuracy.
      max_accuracy_drop: Change threshold for the student against the
        teacher baseline: accuracy may drop at most this much (absolute).
    """

    min_accuracy: float = 0.5
    max_accuracy_drop: float = 0.05

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not 0.0 <= self.min_accuracy <= 1.0:
            fail("min_accuracy", f"expected a number in [0, 1], got {self.min_accuracy}")
        if not 0.0 <= self.max_accuracy_drop <= 1.0:
            fail("max_accuracy_drop", f"expected a number in [0, 1], got {self.max_accuracy_drop}")
        return self
