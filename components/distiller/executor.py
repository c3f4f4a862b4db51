"""Distiller executor: the Trainer's executor with the teachers passed to `run_fn`.

The teacher model directories, and the module file of a `student_fn`, are
added to the payload (and to the execution properties, through
`components.config.payload`) before the Trainer executor trains, so they reach `run_fn` both in-process and when the Trainer
executor hands the invocation to the replicas of a multi-worker job.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types

from tfx.dsl.io import fileio
from tfx.types import standard_component_specs
from tfx.utils import path_utils

from components.config import payload
from components.distillation import verdict as verdict_lib
from components.trainer import executor as trainer_executor

TEACHER_KEY_PREFIX = "teacher_model_"
# M-on-M (`distillation.method: m_on_m`): each student's serving model, at
# `<model artifact>/MEMBERS_DIR/<i>`, beside the ensemble's `Format-Serving`.
MEMBERS_DIR = "m_on_m_students"
# Noisy Student: what the round's teacher labeled and the student kept, at the
# model artifact's root.
ROUND_FILE = "noisy_student_round.json"


def teacher_model_dirs(input_dict) -> list[str]:
    """Serving model directories of the teacher inputs, in input-key order."""
    keys = sorted(
        (k for k in input_dict if k.startswith(TEACHER_KEY_PREFIX) and input_dict[k]),
        key=lambda k: int(k[len(TEACHER_KEY_PREFIX) :]),
    )
    dirs = []
    for key in keys:
        for artifact in input_dict[key]:
            dirs.append(
                path_utils.serving_model_path(
                    artifact.uri, path_utils.is_old_model_artifact(artifact)
                )
            )
    return dirs


class Executor(trainer_executor.Executor):
    """Validates the config, adds the teacher directories, then trains."""

    def Do(self, input_dict, output_dict, exec_properties):
        super().Do(input_dict, output_dict, exec_properties)
        record_verdict(output_dict)

    def prepare(self, decoded: payload.Payload, input_dict, exec_properties):
        dirs = teacher_model_dirs(input_dict)
        module = {k: exec_properties[k] for k in payload.MODULE_KEYS if exec_properties.get(k)}
        if not module and decoded.student_module:
            module = dict(decoded.student_module)  # a replica: prepared by the step already
        return (
            dataclasses.replace(
                decoded, teacher_dirs=tuple(dirs), student_module=types.MappingProxyType(module)
            ),
            payload.with_distiller_inputs(exec_properties, dirs, module),
        )


def record_verdict(output_dict) -> None:
    """Copies the run's verdict (a `student_fn` run with `distillation.scratch_baseline`)
    into the model artifact's custom properties, where ML Metadata keeps it."""
    for model in output_dict.get(standard_component_specs.MODEL_KEY, ()):
        path = os.path.join(model.uri, verdict_lib.VERDICT_FILE)
        if not fileio.exists(path):
            continue
        with fileio.open(path) as f:
            result = json.loads(f.read())
        model.set_string_custom_property("distillation_verdict", result["message"])
        for key in ("student_acc", "scratch_acc", "teacher_acc"):
            if result.get(key) is not None:
                model.set_float_custom_property(key, float(result[key]))
