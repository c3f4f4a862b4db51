"""Distiller executor: the Trainer's executor with the teachers passed to `run_fn`.

The teacher model directories, and the module file of a `student_fn`, are
added to the payload (and to the execution properties, through
`components.config.payload`) before the Trainer executor trains, so they reach `run_fn` both in-process and when the Trainer
executor hands the invocation to the replicas of a multi-worker job.
"""

from __future__ import annotations

import dataclasses
import types

from tfx.utils import path_utils

from components.config import payload
from components.trainer import executor as trainer_executor

TEACHER_KEY_PREFIX = "teacher_model_"


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
