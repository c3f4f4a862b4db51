"""TFX's own example pipelines, stock or with the two-import swap to tfxkit.

The pipeline files come from the installed tfx wheel. `load_pipeline` copies
one into a work directory, changing only what the drop-in promise allows: the
`Transform` / `Trainer` imports (the swap) and, for tests, the step counts.
Used by the drop-in end-to-end tests and `benchmarks/drop_in.py`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import sys
from collections.abc import Sequence

import tensorflow as tf
import tfx

EXAMPLES = os.path.join(os.path.dirname(tfx.__file__), "examples")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PENGUIN_CSV = os.path.join(REPO_ROOT, "tests", "data", "penguins_processed.csv")


@dataclasses.dataclass(frozen=True)
class Example:
    """One TFX example pipeline.

    Attributes:
      name: Short name.
      pipeline_file: The pipeline definition in the tfx wheel.
      module_file: Its user module (preprocessing_fn and run_fn).
      swap: (old, new) source edits that make it use the tfxkit components.
      steps: (old, new) templates of its train / eval step arguments.
      accuracy: The TFMA accuracy metric of its own Evaluator.
      student_module: A Distiller module file with a small `student_fn` for
        it (`add_distillation`), if there is one.
      batch: (old, new) template of the batch size in its module file, if
        `module_file_with_batch` may change it.
    """

    name: str
    pipeline_file: str
    module_file: str
    swap: tuple[tuple[str, str], ...]
    steps: tuple[str, str]
    accuracy: str
    student_module: str = ""
    batch: tuple[str, str] = ("", "")


STUDENTS = os.path.join(REPO_ROOT, "benchmarks", "tfx_students")
TAXI = Example(
    name="taxi_native_keras",
    pipeline_file=os.path.join(EXAMPLES, "chicago_taxi_pipeline", "taxi_pipeline_native_keras.py"),
    module_file=os.path.join(EXAMPLES, "chicago_taxi_pipeline", "taxi_utils_native_keras.py"),
    swap=(
        (
            "from tfx.components import Trainer\n",
            "from components.trainer.component import Trainer\n",
        ),
        (
            "from tfx.components import Transform\n",
            "from components.transform.component import Transform\n",
        ),
    ),
    steps=(
        "trainer_pb2.TrainArgs(num_steps=1000)",
        "trainer_pb2.TrainArgs(num_steps={train})",
    ),
    student_module=os.path.join(STUDENTS, "taxi_student.py"),
    accuracy="BinaryAccuracy",
)
TAXI_DATA = os.path.join(EXAMPLES, "chicago_taxi_pipeline", "data", "simple")
# Every example's own local pipeline runs Beam multi-process over every core;
# these runs take one in-memory worker.
IN_MEMORY_BEAM_ARGS = ("--direct_running_mode=in_memory", "--direct_num_workers=1")

PENGUIN = Example(
    name="penguin_keras",
    pipeline_file=os.path.join(EXAMPLES, "penguin", "penguin_pipeline_local.py"),
    module_file=os.path.join(EXAMPLES, "penguin", "penguin_utils_keras.py"),
    # A `tfx.v1` pipeline: the one-line swap (components/tfx_v1.py).
    swap=(("from tfx import v1 as tfx\n", "from components import tfx_v1 as tfx\n"),),
    steps=(
        "train_args=tfx.proto.TrainArgs(num_steps=100)",
        "train_args=tfx.proto.TrainArgs(num_steps={train})",
    ),
    student_module=os.path.join(STUDENTS, "penguin_student.py"),
    accuracy="SparseCategoricalAccuracy",
)


MNIST = Example(
    name="mnist_native_keras",
    pipeline_file=os.path.join(EXAMPLES, "mnist", "mnist_pipeline_native_keras.py"),
    module_file=os.path.join(EXAMPLES, "mnist", "mnist_utils_native_keras.py"),
    swap=TAXI.swap,
    steps=(
        "trainer_pb2.TrainArgs(num_steps=5000)",
        "trainer_pb2.TrainArgs(num_steps={train})",
    ),
    accuracy="SparseCategoricalAccuracy",
    student_module=os.path.join(STUDENTS, "mnist_student.py"),
    # Its run_fn reads training and evaluation batches of 40.
    batch=("tf_transform_output, 40)", "tf_transform_output, {batch})"),
)
MNIST_SAMPLE = os.path.join(REPO_ROOT, "tests", "data", "mnist_1000.tfrecord")
MNIST_IMAGES = 12_000


def mnist_data_root(workdir: str, images: int = MNIST_IMAGES) -> str:
    """A data root for the MNIST example (`ImportExampleGen` over TFRecord files)
    holding the first `images` Fashion-MNIST training images in the example's
    own format: `image_floats` (784 floats in [-0.5, 0.5]) and `image_class`
    (an int64 class id), the format TFX's MNIST example reads.

    Raises:
      components.data.fashion_mnist.FashionMnistMissing: when the images are not installed.
    """
    from components.data import fashion_mnist

    pixels, labels = fashion_mnist.load_split("train")
    pixels, labels = pixels[:images], labels[:images]
    root = os.path.join(workdir, "mnist_data")
    os.makedirs(root, exist_ok=True)
    floats = pixels.reshape(len(pixels), -1).astype("float32") / 255.0 - 0.5
    with tf.io.TFRecordWriter(os.path.join(root, "fashion_mnist.tfrecord")) as writer:
        for image, label in zip(floats, labels, strict=True):
            feature = {
                "image_floats": tf.train.Feature(float_list=tf.train.FloatList(value=image)),
                "image_class": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())
    return root


# The examples by the short key `benchmarks/drop_in.py` takes.
BY_KEY = {"taxi": TAXI, "penguin": PENGUIN, "mnist": MNIST}
BY_NAME = {e.name: e for e in BY_KEY.values()}


def mnist_sample_root(workdir: str) -> str:
    """A data root for the MNIST example holding the repository's 1,000 MNIST digits."""
    root = os.path.join(workdir, "mnist_sample")
    os.makedirs(root, exist_ok=True)
    shutil.copy(MNIST_SAMPLE, root)
    return root


def data_root(example: Example, workdir: str) -> str:
    """The data root `create_pipeline` hands `example` (written under `workdir` when needed)."""
    if example is TAXI:
        return TAXI_DATA
    if example is PENGUIN:
        return penguin_data_root(workdir)
    return mnist_data_root(workdir)


def load_pipeline(example: Example, workdir: str, *, swapped: bool, train_steps: int | None = None):
    """Imports a copy of the example's pipeline file (swapped or stock) from `workdir`.

    Raises:
      AssertionError: if the wheel's file no longer holds a line the edit expects.
    """
    with open(example.pipeline_file, encoding="utf-8") as f:
        source = f.read()
    edits = list(example.swap) if swapped else []
    if train_steps is not None:
        edits.append((example.steps[0], example.steps[1].format(train=train_steps)))
    for old, new in edits:
        assert source.count(old) == 1, f"{example.pipeline_file} no longer has {old!r}"
        source = source.replace(old, new)
    if example is PENGUIN:
        # Its flags are defined at import; a second copy in one process would clash.
        from absl import flags

        for name in ("runner", "model_framework"):
            if name in flags.FLAGS:
                delattr(flags.FLAGS, name)
    name = f"{example.name}_{'swapped' if swapped else 'stock'}"
    path = os.path.join(workdir, f"{name}.py")
    os.makedirs(workdir, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # TFX's function components look their module up by name.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def module_file_with_batch(example: Example, workdir: str, batch_size: int) -> str:
    """A copy of the example's module file under `workdir` reading batches of `batch_size`.

    Only the batch size changes (every place the module sets it): the same
    example as a team with more data would run it.

    Raises:
      ValueError: if the example's module has no batch size to change.
      AssertionError: if the wheel's file no longer holds the expected text.
    """
    old, new = example.batch
    if not old:
        raise ValueError(f"{example.name}: its module file's batch size cannot be changed")
    with open(example.module_file, encoding="utf-8") as f:
        source = f.read()
    assert source.count(old), f"{example.module_file} no longer has {old!r}"
    directory = os.path.join(workdir, "module")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, os.path.basename(example.module_file))
    with open(path, "w", encoding="utf-8") as f:
        f.write(source.replace(old, new.format(batch=batch_size)))
    return path


def penguin_data_root(workdir: str) -> str:
    """A penguin data root (`<root>/labelled/*.csv`) holding the shared penguin CSV."""
    labelled = os.path.join(workdir, "penguin_data", "labelled")
    os.makedirs(labelled, exist_ok=True)
    shutil.copy(PENGUIN_CSV, os.path.join(labelled, "penguins_processed.csv"))
    return os.path.dirname(labelled)


def create_pipeline(
    example: Example,
    module,
    root: str,
    data_root: str,
    module_file: str = "",
    enable_tuning: bool = False,
    beam_pipeline_args: Sequence[str] = IN_MEMORY_BEAM_ARGS,
):
    """The example's pipeline under `root` (pipeline root, metadata, push destination).

    `module_file` replaces the example's own (e.g. `module_file_with_batch`);
    `enable_tuning` adds the penguin example's own stock Tuner, whose best
    hyperparameters its Trainer trains with. `beam_pipeline_args` replace
    the example's multi-process ones; empty, the DirectRunner's defaults run
    the same way (in memory, one worker), and TFX's Beam executors skip
    packaging TFX as an sdist, which each of them does for non-empty args
    that name no package, setup or requirements file or SDK container
    (`tfx.utils.dependency_utils`: about 2 s of CPU and 51 MB left in the
    temp directory per executor).
    """
    common = dict(
        pipeline_name=f"{module.__name__}",
        pipeline_root=os.path.join(root, "pipeline_root"),
        data_root=data_root,
        module_file=module_file or example.module_file,
        serving_model_dir=os.path.join(root, "serving_model"),
        metadata_path=os.path.join(root, "metadata.db"),
        beam_pipeline_args=list(beam_pipeline_args),
    )
    if enable_tuning and example is not PENGUIN:
        raise ValueError(f"{example.name}: only the penguin example has a Tuner")
    if example is TAXI:
        return module._create_pipeline(**common)
    if example is MNIST:
        return module._create_pipeline(**common, accuracy_threshold=0.0)
    return module.create_pipeline(
        **common,
        accuracy_threshold=0.0,
        user_provided_schema_path=None,
        enable_tuning=enable_tuning,
        enable_bulk_inferrer=False,
        enable_example_diff=False,
        examplegen_input_config=None,
        examplegen_range_config_date=None,
        resolver_range_config=None,
        enable_transform_input_cache=False,
    )


STUDENT_PUSH = "serving_model_student"


def add_distillation(
    example: Example,
    pipeline,
    root: str,
    train_steps: int,
    *,
    max_accuracy_drop: float = 1.0,
    config=None,
):
    """Adds what a user adds to distil the example's model: Distiller, Evaluator, Pusher.

    The teacher is the example's own Trainer (stock or swapped), untouched;
    the student is `example.student_module`'s `student_fn`. The Evaluator
    compares the student (candidate) with the teacher (baseline) on the
    example's own eval split and metric, blessing a student whose accuracy is
    at most `max_accuracy_drop` below the teacher's; the Pusher pushes it to
    `<root>/serving_model_student`.

    Returns:
      The pipeline, with the three components added.
    """
    import tensorflow_model_analysis as tfma
    from tfx import v1 as tfx_v1

    from components.distiller.component import Distiller

    by_id = {c.id: c for c in pipeline.components}
    example_gen = next(c for c in pipeline.components if c.id.endswith("ExampleGen"))
    transform = by_id["Transform"]
    trainer = by_id["Trainer.mnist" if example is MNIST else "Trainer"]
    distiller = Distiller(
        module_file=example.student_module,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        teacher_models=[trainer.outputs["model"]],
        train_args=tfx_v1.proto.TrainArgs(num_steps=train_steps),
        eval_args=tfx_v1.proto.EvalArgs(num_steps=5),
        config=config,
    )
    if example is MNIST:
        # Its model serves no transform signature: the Evaluator reads the raw label.
        spec = dict(signature_name="serving_default", label_key="image_class")
    else:
        spec = dict(
            signature_name="serving_default",
            label_key={TAXI.name: "tips_xf", PENGUIN.name: "species_xf"}[example.name],
            preprocessing_function_names=["transform_features"],
        )
    eval_config = tfma.EvalConfig(
        model_specs=[
            tfma.ModelSpec(name="candidate", **spec),
            tfma.ModelSpec(name="baseline", is_baseline=True, **spec),
        ],
        slicing_specs=[tfma.SlicingSpec()],
        metrics_specs=[
            tfma.MetricsSpec(
                metrics=[
                    tfma.MetricConfig(
                        class_name=example.accuracy,
                        threshold=tfma.MetricThreshold(
                            change_threshold=tfma.GenericChangeThreshold(
                                direction=tfma.MetricDirection.HIGHER_IS_BETTER,
                                absolute={"value": -max_accuracy_drop},
                            )
                        ),
                    )
                ]
            )
        ],
    )
    evaluator = tfx_v1.components.Evaluator(
        examples=example_gen.outputs["examples"],
        model=distiller.outputs["model"],
        baseline_model=trainer.outputs["model"],
        eval_config=eval_config,
    ).with_id("StudentEvaluator")
    pusher = tfx_v1.components.Pusher(
        model=distiller.outputs["model"],
        model_blessing=evaluator.outputs["blessing"],
        push_destination=tfx_v1.proto.PushDestination(
            filesystem=tfx_v1.proto.PushDestination.Filesystem(
                base_directory=os.path.join(root, STUDENT_PUSH)
            )
        ),
    ).with_id("StudentPusher")
    pipeline.components = [*pipeline.components, distiller, evaluator, pusher]
    return pipeline


def pushed_models(root: str, destination: str = "serving_model") -> list[str]:
    """The pushed model versions under `root`'s push destination."""
    base = os.path.join(root, destination)
    if not tf.io.gfile.isdir(base):
        return []
    return sorted(os.path.join(base, v) for v in tf.io.gfile.listdir(base))


def signatures(model_dir: str) -> dict[str, tuple]:
    """Every serving signature's input and output specs (name, dtype, shape)."""
    loaded = tf.saved_model.load(model_dir)
    out = {}
    for key, fn in loaded.signatures.items():
        inputs = {
            k: (v.dtype.name, tuple(v.shape)) for k, v in fn.structured_input_signature[1].items()
        }
        outputs = {k: (v.dtype.name, tuple(v.shape)) for k, v in fn.structured_outputs.items()}
        out[key] = (tuple(sorted(inputs.items())), tuple(sorted(outputs.items())))
    return out


def teacher_agreement(root: str, rows: int = 64) -> dict:
    """How the Distiller reads the run's teacher, against the teacher itself.

    The teacher (the run's one Trainer model) described as the Distiller
    describes it, called as the Distiller calls it on the Transform's output
    for raw eval examples, and its own `serving_default` on the same raw
    examples.

    Returns:
      `kind` and `positional` of its description, and `max_abs_diff` between
      the two outputs.
    """
    import glob

    import numpy as np
    import tensorflow_transform as tft

    from components.distillation import teachers as teachers_lib

    pipeline_root = os.path.join(root, "pipeline_root")
    (trainer,) = glob.glob(os.path.join(pipeline_root, "Trainer*", "model", "*", "Format-Serving"))
    (graph,) = glob.glob(os.path.join(pipeline_root, "Transform", "transform_graph", "*"))
    (examples,) = glob.glob(os.path.join(pipeline_root, "*ExampleGen", "examples", "*"))
    files = tf.io.gfile.glob(os.path.join(examples, "Split-eval", "*"))
    raw = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP").take(rows)]
    tft_output = tft.TFTransformOutput(graph)
    info = teachers_lib.describe_teacher(
        trainer, transformed_features=sorted(tft_output.transformed_feature_spec())
    )
    transformed = tft_output.transform_raw_features(
        tf.io.parse_example(raw, tft_output.raw_feature_spec())
    )
    read = teachers_lib.ExportedTeacher(trainer, info).outputs_of(transformed).numpy()
    (served,) = (
        tf.saved_model.load(trainer)
        .signatures["serving_default"](examples=tf.constant(raw))
        .values()
    )
    return {
        "kind": info.kind,
        "positional": list(info.positional),
        "max_abs_diff": float(np.max(np.abs(read - served.numpy()))),
    }
