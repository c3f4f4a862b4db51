"""What the Distiller tests share: a user's student_fn run on penguin data with Keras
teachers, and the raw digits examples a tiny pipeline run served."""

from __future__ import annotations

import os

import tensorflow as tf
import tensorflow_transform as tft
from tfx.components.trainer.fn_args_utils import FnArgs
from tfx.types import channel, standard_artifacts

from components.config import module_config_from_dict, payload
from components.distiller import run_fn as distiller_run_fn
from components.distiller.component import Distiller
from tests.components.distiller.test_student_strategies import STUDENT_MODULE, _save_teacher
from tests.components.training import penguins


def penguin_teachers(root: str, count: int, data: penguins.Materialized):
    """`count` Keras teachers on the float features of penguin Transform output `data`
    (the `penguin_inputs` fixture, or a variant of it) and a student_fn module over
    them: `(data, teacher_dirs, module_path)`."""
    tft_output = tft.TFTransformOutput(data.transform_output)
    features = sorted(
        k for k, s in tft_output.transformed_feature_spec().items() if s.dtype == tf.float32
    )
    teachers = [os.path.join(root, f"teacher{i}") for i in range(count)]
    for teacher in teachers:
        _save_teacher(teacher, tft_output, features)
    module = os.path.join(root, "student_module.py")
    with open(module, "w") as f:
        f.write(STUDENT_MODULE.format(features=features))
    return data, teachers, module


def run_student_fn(
    data: penguins.Materialized, teachers, module: str, root: str, sections: dict
) -> dict:
    """The Distiller's run_fn on the student_fn module, one device; returns the run's
    `TrainingInputs` fields (its serving directory among them)."""
    config = module_config_from_dict({"strategy": {"kind": "one_device"}, **sections})
    custom_config = payload.encode(None, config=config)
    custom_config[payload.TEACHER_DIRS_KEY] = list(teachers)
    custom_config[payload.STUDENT_MODULE_KEY] = {"module_file": module}
    inputs = penguins.inputs_for(data, root, "run", config)
    distiller_run_fn.run_fn(FnArgs(**inputs, custom_config=custom_config))
    return inputs


def raw_digits_examples(output: str, label: str, n: int = 16) -> tf.Tensor:
    """The first `n` raw digits examples of a tiny run's data, label removed (as served)."""
    records = tf.data.TFRecordDataset(os.path.join(output, "data", "digits", "digits.tfrecord"))
    examples = []
    for record in records.take(n):
        example = tf.train.Example.FromString(record.numpy())
        del example.features.feature[label]
        examples.append(example.SerializeToString())
    return tf.constant(examples)


def channels(n: int):
    """Unconnected Examples, TransformGraph and `n` Model channels, for building a Distiller."""
    examples = channel.Channel(type=standard_artifacts.Examples)
    graph = channel.Channel(type=standard_artifacts.TransformGraph)
    return examples, graph, [channel.Channel(type=standard_artifacts.Model) for _ in range(n)]


def student_fn_distiller(root: str, config: dict, teachers: int) -> Distiller:
    """A Distiller built in code with a small logit student_fn module and `config`."""
    module = os.path.join(root, "student.py")
    with open(module, "w") as f:
        f.write(
            "import tensorflow as tf\n\n\ndef student_fn(fn_args):\n"
            "    inputs = tf.keras.Input((2,), name='x_xf')\n"
            "    return tf.keras.Model(inputs, tf.keras.layers.Dense(3)(inputs))\n"
        )
    examples, graph, models = channels(teachers)
    return Distiller(
        config=config,
        examples=examples,
        transform_graph=graph,
        teacher_models=models,
        module_file=module,
    )
