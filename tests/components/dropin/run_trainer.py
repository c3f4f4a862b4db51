"""Runs the tfxkit Trainer executor once on a user module, in its own process.

Usage: python -m tests.components.dropin.run_trainer WORKDIR STRATEGY_JSON [--no-steps]

`--no-steps` leaves `train_args` / `eval_args` out, as a stock pipeline may.

A separate process because logical CPU devices (mirrored over two CPUs) can
only be created before TensorFlow initialises.
"""

from __future__ import annotations

import json
import os
import sys

from tfx import v1 as tfx
from tfx.types import Channel, artifact_utils, standard_artifacts
from tfx.types import standard_component_specs as specs

from components.trainer.component import Trainer
from tests.components.trainer import test_data_accessor as data

MODULE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "user_module.py")
STEPS = 6


def main(workdir: str, strategy: dict, steps: bool = True) -> None:
    import tensorflow as tf
    from google.protobuf import text_format

    examples = standard_artifacts.Examples()
    examples.uri = os.path.join(workdir, "examples")
    examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
    for split in ("train", "eval"):
        path = os.path.join(examples.uri, f"Split-{split}")
        tf.io.gfile.makedirs(path)
        with tf.io.TFRecordWriter(os.path.join(path, "data.gz"), "GZIP") as writer:
            for i in range(64):
                writer.write(data._example(i))
    schema = standard_artifacts.Schema()
    schema.uri = os.path.join(workdir, "schema")
    tf.io.gfile.makedirs(schema.uri)
    with open(os.path.join(schema.uri, "schema.pbtxt"), "w") as f:
        f.write(text_format.MessageToString(data._schema()))
    component = Trainer(
        examples=Channel(type=standard_artifacts.Examples),
        schema=Channel(type=standard_artifacts.Schema),
        module_file=MODULE,
        train_args=tfx.proto.TrainArgs(num_steps=STEPS) if steps else None,
        eval_args=tfx.proto.EvalArgs(num_steps=1) if steps else None,
        config={"strategy": strategy},
    )
    model, model_run = standard_artifacts.Model(), standard_artifacts.ModelRun()
    model.uri, model_run.uri = os.path.join(workdir, "model"), os.path.join(workdir, "model_run")
    tf.io.gfile.makedirs(model_run.uri)
    properties = {k: v for k, v in component.exec_properties.items() if v is not None}
    executor = component.executor_spec.executor_class(
        component.executor_spec.executor_class.Context(tmp_dir=os.path.join(workdir, "tmp"))
    )
    executor.Do(
        {specs.EXAMPLES_KEY: [examples], specs.SCHEMA_KEY: [schema]},
        {specs.MODEL_KEY: [model], specs.MODEL_RUN_KEY: [model_run]},
        properties,
    )


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), steps="--no-steps" not in sys.argv[3:])
