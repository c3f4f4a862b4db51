"""What the distillation benchmarks share: configs, the Transform run, the `Bench`
that trains and measures models, seeds and stage timers.

`benchmarks/distillation.py` (teacher / scratch / distilled) and
`benchmarks/distillation_methods.py` (Noisy Student, M-on-M, KD) both import
this module and neither imports the other's internals.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_transform as tft  # noqa: E402
import tf_keras as keras  # noqa: E402

from components.config import PipelineConfig, from_dict, payload, to_dict  # noqa: E402
from components.distiller.run_fn import train_student  # noqa: E402
from components.training import fit as training  # noqa: E402
from components.training import task as task_lib  # noqa: E402
from components.training.export import export_serving_model  # noqa: E402
from pipelines import report  # noqa: E402
from pipelines.configs import load_config  # noqa: E402

MNIST_PATH = os.path.join(REPO, "tests", "data", "mnist_1000.tfrecord")


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def mnist_config() -> PipelineConfig:
    """MNIST-1000 with the digits config's training settings and Hinton-like shapes.

    The teacher is Hinton et al.'s MNIST teacher shape (2 x 1200 ReLU units,
    dropout); the student is one hidden layer of 64 units (about 2% of the
    teacher's parameters).
    """
    data = to_dict(load_config("digits"))
    data.pop("kubeflow", None)
    data.update(
        name="mnist",
        data={
            "path": MNIST_PATH,
            "format": "tfrecord",
            "label": {"name": "image_class", "num_classes": 10},
            "features": [
                {"name": "image_floats", "kind": "float", "size": 784, "transform": "identity"}
            ],
        },
        teacher={"hidden_units": [1200, 1200], "dropout": 0.3},
        student={"hidden_units": [64]},
    )
    return from_dict(data)


def dataset_config(name: str) -> PipelineConfig:
    return mnist_config() if name == "mnist" else load_config(name)


def run_transform(config: PipelineConfig, workdir: str, data=None) -> dict[str, str]:
    """Runs ExampleGen -> Statistics -> Schema -> Transform; returns artifact paths.

    Args:
      data: The ExampleGen input (`components.data.sources.ResolvedInput`;
        default: the config's data). Splits beyond train / eval get
        `<split>` and `raw_<split>` paths too.
    """
    from tfx import v1 as tfx
    from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

    from components.data.sources import check_input, resolve_input
    from components.transform.component import Transform
    from pipelines.pipeline import example_gen

    root = os.path.join(workdir, config.name)
    if data is None:
        data = resolve_input(config.data, os.path.join(root, "data"))
    check_input(config.data, data)
    gen = example_gen(config, data)
    stats = tfx.components.StatisticsGen(examples=gen.outputs["examples"])
    schema = tfx.components.SchemaGen(
        statistics=stats.outputs["statistics"], infer_feature_shape=True
    )
    transform = Transform(
        config=config, examples=gen.outputs["examples"], schema=schema.outputs["schema"]
    )
    pipeline = tfx.dsl.Pipeline(
        pipeline_name=f"bench-{config.name}",
        pipeline_root=os.path.join(root, "pipeline_root"),
        components=[gen, stats, schema, transform],
        enable_cache=True,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            os.path.join(root, "metadata.sqlite")
        ),
        beam_pipeline_args=list(config.beam_args),
    )
    BeamDagRunner().run(pipeline)

    def newest(*parts):
        matches = tf.io.gfile.glob(os.path.join(root, "pipeline_root", *parts))
        return max(matches, key=lambda p: int(p.rstrip("/").split("/")[-1]))

    examples = newest("Transform", "transformed_examples", "*")
    raw = newest(gen.id, "examples", "*")
    paths = {"transform_graph": newest("Transform", "transform_graph", "*")}
    for split in [name for name, _ in data.splits] or ["train", "eval"]:
        paths[split] = os.path.join(examples, f"Split-{split}", "*")
        paths[f"raw_{split}"] = os.path.join(raw, f"Split-{split}", "*")
    return paths


class SteadyStateTimer(keras.callbacks.Callback):
    """Steps/s over the Keras epochs after the first (tracing and cache filling excluded)."""

    def __init__(self):
        super().__init__()
        self.start, self.steps, self.steps_per_second = None, 0, float("nan")

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            self.start = time.perf_counter()
            self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        if self.start is not None:
            self.steps += 1

    def on_train_end(self, logs=None):
        if self.start is not None and self.steps:
            self.steps_per_second = self.steps / (time.perf_counter() - self.start)


class Bench:
    """Trains and measures the three roles on one dataset's Transform output."""

    def __init__(self, config: PipelineConfig, paths: dict[str, str], workdir: str, choice):
        self.config, self.paths, self.workdir, self.choice = config, paths, workdir, choice
        self.tft_output = tft.TFTransformOutput(paths["transform_graph"])
        self.serialized, self.labels = report.read_eval_examples(
            paths["raw_eval"], config.data.label.name
        )

    def inputs(self, run: str, steps: int = 0) -> training.TrainingInputs:
        base = os.path.join(self.workdir, self.config.name, "runs", run)
        if tf.io.gfile.exists(base):
            tf.io.gfile.rmtree(base)
        return training.TrainingInputs(
            train_files=(self.paths["train"],),
            eval_files=(self.paths["eval"],),
            transform_output=self.paths["transform_graph"],
            serving_model_dir=os.path.join(base, "serving"),
            model_run_dir=os.path.join(base, "run"),
            train_steps=steps or self.config.train.train_steps,
            eval_steps=self.config.train.eval_steps,
        )

    def export(self, model: keras.Model, inputs: training.TrainingInputs) -> str:
        export_serving_model(
            model, self.tft_output, self.config.data.label.name, inputs.serving_model_dir
        )
        return inputs.serving_model_dir

    @staticmethod
    def role_steps(config: PipelineConfig, role: str) -> int:
        """The steps `role` trains for under `config` (the one given, not the bench's):
        the teacher's `train.train_steps`, a student's `student_train_steps()`."""
        return config.train.train_steps if role == "teacher" else config.student_train_steps()

    def train_classifier(self, config: PipelineConfig, role: str, run: str) -> str:
        """Trains on hard labels: the teacher, or the student from scratch with the
        distilled student's steps, schedule and augmentation."""
        shape = config.teacher if role == "teacher" else config.student
        inputs = self.inputs(run, self.role_steps(config, role))

        def build_and_compile():
            model = training.build_model(config, self.tft_output, shape, role)
            training.compile_classifier(model, config, inputs.train_steps)
            return model

        model, _ = training.fit(config, inputs, build_and_compile, choice=self.choice)
        return self.export(model, inputs)

    def distil(
        self, config: PipelineConfig, teacher_dirs, run: str, timer: SteadyStateTimer | None = None
    ) -> str:
        inputs = self.inputs(run, config.student_train_steps())
        teacher_dirs = [teacher_dirs] if isinstance(teacher_dirs, str) else list(teacher_dirs)
        distiller = task_lib.Task("Distiller", self.choice, payload.Payload(config=config))
        student, _ = train_student(
            distiller, inputs, teacher_dirs, callbacks=[timer] if timer else ()
        )
        return self.export(student, inputs)

    def probabilities(self, serving_dir: str) -> np.ndarray:
        serve = tf.saved_model.load(serving_dir).signatures["serving_default"]
        return np.concatenate(
            [
                serve(examples=tf.constant(self.serialized[i : i + 1024]))["probabilities"].numpy()
                for i in range(0, len(self.serialized), 1024)
            ]
        )

    def ensemble_accuracy(self, teacher_dirs: list[str]) -> float:
        """Accuracy of the teachers' averaged probabilities (what the ensemble student learns from, at T = 1)."""
        probs = np.mean([self.probabilities(d) for d in teacher_dirs], axis=0)
        known = self.labels >= 0
        return float(np.mean(np.argmax(probs[known], axis=1) == self.labels[known]))

    def measure(self, serving_dir: str, latency: bool = True) -> dict[str, float]:
        if latency:
            return report.measure_model(serving_dir, self.serialized, self.labels)
        loaded = tf.saved_model.load(serving_dir)
        probs = loaded.signatures["serving_default"](examples=tf.constant(self.serialized))[
            "probabilities"
        ].numpy()
        known = self.labels >= 0
        return {"accuracy": float(np.mean(np.argmax(probs[known], axis=1) == self.labels[known]))}


def with_mixup(config: PipelineConfig, alpha: float) -> PipelineConfig:
    """The config with `train.augmentation.mixup` = `alpha` (and, with mixup, no
    soft-target cache: mixed examples are never seen twice)."""
    train = config.train
    return dataclasses.replace(
        config,
        train=dataclasses.replace(
            train, augmentation=dataclasses.replace(train.augmentation, mixup=alpha)
        ),
        distillation=dataclasses.replace(
            config.distillation,
            cache_teacher_logits=config.distillation.cache_teacher_logits and not alpha,
        ),
    )


def with_seed(config: PipelineConfig, seed: int, **distillation) -> PipelineConfig:
    return dataclasses.replace(
        config,
        train=dataclasses.replace(config.train, seed=seed),
        distillation=dataclasses.replace(config.distillation, **distillation),
    )


def timed(seconds: dict, stage: str, fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, adding its wall seconds to `seconds[stage]`."""
    started = time.perf_counter()
    out = fn(*args, **kwargs)
    seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - started
    return out
