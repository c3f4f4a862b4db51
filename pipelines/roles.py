"""Which pipeline node plays which role, decided by component type, not by id.

`model_role`, `is_teacher` and `trains` read a node's role from its component type, so a
component renamed with `.with_id()` keeps its role; `GATE_ID` is the one fixed id, since
TFX resolves the drift baseline by producer id.
"""

from __future__ import annotations

from tfx import components as stock

from components.distiller.component import Distiller, EnsembleStudent, StudentRound
from components.trainer import executor as trainer_executor
from components.trainer.baseline import ModelBaseline, StudentBaseline
from components.trainer.component import Trainer
from components.validation.component import DataGate

TEACHER = "teacher"
STUDENT = "student"
# The student's shape trained alone (`distillation.scratch_baseline`).
SCRATCH = "scratch"
# Another model a user would train alone instead (`distillation.baselines`).
BASELINE = "baseline"
# One student of all the teachers (`EnsembleStudent`, beside an M-on-M Distiller).
ENSEMBLE_STUDENT = "one_student"
# Rows the report adds with `distillation.method: m_on_m`: each student of
# the M-on-M ensemble, and the teachers' own ensemble.
MEMBER = "member"
TEACHER_ENSEMBLE = "teachers"
# A Noisy Student round before the last (`StudentRound`).
ROUND = "round"

GATE_ID = "DataGate"
# Output key of the gate's validated schema (the next run's drift baseline).
GATE_SCHEMA_KEY = "validated_schema"
# The Evaluator of the candidate (stock's default id).
EVALUATOR_ID = "Evaluator"
# The Evaluator that compares a distilled student with the served model
# (`evaluation.against_served`); without distillation the `Evaluator` does.
SERVED_GATE_ID = "ServedEvaluator"
# The Resolver of the served model: the latest model blessed by the served
# gate. TFX binds its blessing channel by producer id, hence fixed ids.
SERVED_RESOLVER_ID = "latest_served_model"

_TRAINER_TYPE = Trainer.get_class_type()
_DISTILLER_TYPE = Distiller.get_class_type()
_SCRATCH_TYPE = StudentBaseline.get_class_type()
_MODEL_BASELINE_TYPE = ModelBaseline.get_class_type()
_ENSEMBLE_STUDENT_TYPE = EnsembleStudent.get_class_type()
_ROUND_TYPE = StudentRound.get_class_type()
EVALUATOR_TYPE = stock.Evaluator.get_class_type()
PUSHER_TYPE = stock.Pusher.get_class_type()
GATE_TYPE = DataGate.get_class_type()


def teacher_id(index: int) -> str:
    """Node id of the `index`-th teacher Trainer (`Trainer`, `Trainer_1`, ...)."""
    return "Trainer" if index == 0 else f"Trainer_{index}"


def baseline_id(name: str) -> str:
    """Node id of a `distillation.baselines` entry's `ModelBaseline`."""
    return f"Baseline_{name}"


def model_role(execution_type: str) -> str | None:
    """`TEACHER` for a Trainer, `STUDENT` for a Distiller, `SCRATCH` for a
    `StudentBaseline`, `BASELINE` for a `ModelBaseline`, `ENSEMBLE_STUDENT` for an `EnsembleStudent`, `ROUND` for a
    `StudentRound`, None otherwise."""
    return {
        _TRAINER_TYPE: TEACHER,
        _DISTILLER_TYPE: STUDENT,
        _SCRATCH_TYPE: SCRATCH,
        _MODEL_BASELINE_TYPE: BASELINE,
        _ENSEMBLE_STUDENT_TYPE: ENSEMBLE_STUDENT,
        _ROUND_TYPE: ROUND,
    }.get(execution_type)


def is_teacher(node) -> bool:
    """Whether a pipeline node is a teacher Trainer (type `Trainer`, whatever its id)."""
    return model_role(node.type) == TEACHER


def trains(node) -> bool:
    """Whether a pipeline node trains a model: its executor is the tfxkit
    Trainer's or a subclass of it (teacher Trainers, `StudentBaseline`, the
    Distiller, and any later component that trains through it)."""
    executor_class = getattr(getattr(node, "executor_spec", None), "executor_class", None)
    return isinstance(executor_class, type) and issubclass(
        executor_class, trainer_executor.Executor
    )
