"""A student from the user's module file: `student_fn(fn_args) -> keras.Model`.

`load_student_fn` and `build` load and build it, `check_at_build` checks it when the
pipeline is built, `check_student` and `check_logits` before training, `class_logits_model` is the view the KD loss trains and
`export_like_teacher` exports it with the teacher's serving signatures.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
import tf_keras as keras
from absl import logging
from tfx.components.trainer.fn_args_utils import FnArgs
from tfx.components.util import udf_utils

from components.compat import legacy_keras, user_code
from components.config import ConfigError, PipelineConfig
from components.distillation import keras3 as keras3_lib
from components.distillation import teachers as teachers_lib

STUDENT_FN = "student_fn"


def load_student_fn(student_module: Mapping[str, str], get_fn=udf_utils.get_fn) -> Callable:
    """The module's `student_fn`.

    Args:
      student_module: `module_file` and/or `module_path` (TFX's packaged copy).
      get_fn: How to import it: TFX's loader (the Distiller's run), or
        `import_as_python_does` (at pipeline build).

    Raises:
      ConfigError: naming `module_file` when the module cannot be imported or
        defines no `student_fn`.
    """
    module_file = student_module.get("module_file") or student_module.get("module_path")
    try:
        fn = get_fn(dict(student_module), STUDENT_FN)
    except (AttributeError, ImportError, FileNotFoundError, SyntaxError) as e:
        raise ConfigError(
            f"module_file: cannot load {STUDENT_FN} from {module_file!r}: {e}; define "
            f"`def {STUDENT_FN}(fn_args) -> tf.keras.Model` in the Distiller's module_file"
        ) from e
    if not callable(fn):
        raise ConfigError(f"module_file: {STUDENT_FN} in {module_file!r} is not a function")
    # The module keeps the Keras it imports (Keras 3 or tf_keras), but one, not both.
    try:
        legacy_keras.check_one_keras(getattr(fn, "__globals__", {}), f"module_file {module_file!r}")
    except legacy_keras.KerasMismatchError as e:
        raise ConfigError(str(e)) from None
    return fn


def module_of(student_module: Mapping[str, str]) -> str:
    """The module file holding `student_fn`, as the user gave it."""
    return student_module.get("module_file") or student_module.get("module_path") or "?"


def build(student_fn: Callable, fn_args, module: str = "?") -> keras.Model:
    """`student_fn(fn_args)`, checked to be a Keras model with one output.

    A Keras 3 model (the Keras a module gets on TFX 1.21, or imports as
    `keras`) is returned as a tf_keras view that trains its own variables
    (`keras3.as_tf_keras`); a tf_keras model as it is.

    Args:
      module: The module file holding `student_fn` (named in errors).

    Raises:
      UserCodeError: naming `student_fn` and `module` when it raises (the
        user's exception is the cause).
      ConfigError: naming `module_file` when it returns something else.
    """
    model = user_code.call_user_fn(student_fn, f"{STUDENT_FN} of module_file {module!r}", fn_args)
    keras3 = keras3_lib.is_keras3_model(model)
    if not (keras3 or isinstance(model, keras.Model)):
        raise ConfigError(
            f"module_file: {STUDENT_FN} returned {type(model).__name__}, not a Keras model; return "
            "a functional model (tf.keras, keras or tf_keras) with one [batch, classes] logits output"
        )
    outputs = _outputs(model)
    if len(outputs) != 1:
        raise ConfigError(
            f"module_file: {STUDENT_FN}'s model has {len(outputs)} outputs; return a functional "
            "model with one [batch, classes] logits output"
        )
    if keras3:
        try:
            return keras3_lib.as_tf_keras(model)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"module_file: {STUDENT_FN}'s model: {e}") from None
    return model


def _outputs(model) -> list:
    """A functional model's output tensors (none for a subclassed model not built
    functionally)."""
    try:
        outputs = model.outputs
    except (AttributeError, ValueError):
        return []
    return list(outputs or ())


def check_student(
    config: PipelineConfig,
    student: keras.Model,
    teachers: Sequence[teachers_lib.TeacherInfo],
    transformed_features: Sequence[str],
) -> None:
    """Fails before training when the student cannot learn from or serve like its teachers.

    Raises:
      ValueError: naming the argument or field: a student whose output width
        differs from the teachers', reading features Transform does not
        write, or not smaller than a teacher (`distillation.require_compression`).
    """
    for i, info in enumerate(teachers):
        if info.serving_problem:
            raise ValueError(
                f"teacher_models: teacher {i} ({info.export_dir}) cannot be served by a student: "
                f"{info.serving_problem}"
            )
    teacher = teachers[0]
    width = int(student.output_shape[-1])
    if width != teacher.width:
        raise ValueError(
            f"module_file: {STUDENT_FN}'s model outputs {width} logits per example but teacher 0 "
            f"({teacher.export_dir}) outputs {teacher.width}"
            + (" (one binary unit)" if teacher.width == 1 else f" ({teacher.num_classes} classes)")
            + "; give the student's last layer as many units as the teacher's"
        )
    unknown = sorted(set(student.input_names) - set(transformed_features))
    if unknown:
        raise ValueError(
            f"module_file: {STUDENT_FN}'s model reads {unknown}, which Transform does not write (it writes "
            f"{sorted(transformed_features)}); name the student's inputs after transformed features"
        )
    for i, info in enumerate(teachers):
        teachers_lib.check_compression(
            config,
            student,
            info,
            f"teacher {i} ({info.export_dir})",
            f"shrink the model {STUDENT_FN} builds",
        )


def check_logits(
    student: keras.Model, features, module: str = "?", batch: str = "the first batch"
) -> None:
    """Fails before training when the student outputs probabilities instead of logits.

    Read twice on a batch: the op its output comes from (a final Softmax or
    Sigmoid), and the values (every row in [0, 1] and summing to 1, for more
    than one unit). The KD loss softens logits by the temperature;
    probabilities trained as logits learn the wrong targets.

    Args:
      batch: What `features` is, as the message says it.

    Raises:
      ValueError: naming `student_fn`, `module`, what was found and the fix.
    """
    call = tf.function(lambda f: student(f, training=False)).get_concrete_function(features)
    outputs = np.asarray(call(features))
    found = ""
    if teachers_lib.read_output_kind(call) == teachers_lib.PROBABILITIES:
        found = "its output comes from a final softmax / sigmoid activation"
    elif (
        outputs.ndim == 2
        and outputs.shape[-1] > 1
        and outputs.size
        and bool(np.all((outputs >= 0.0) & (outputs <= 1.0)))
        and bool(np.allclose(outputs.sum(axis=-1), 1.0, atol=1e-3))
    ):
        found = f"on {batch} every row of its output lies in [0, 1] and sums to 1"
    if found:
        raise ValueError(
            f"module_file: {STUDENT_FN} of {module!r} returns probabilities, not logits: {found}. "
            "The Distiller trains logits (softened by distillation.temperature); drop the final "
            "activation (for example Dense(n) instead of Dense(n, activation='softmax')) so the "
            "model returns logits; the export still serves what the teacher serves."
        )


# `FnArgs` fields that name the run's artifacts (Transform's output, the data,
# the model directories), unknown when the pipeline is built.
RUN_TIME_FIELDS = frozenset(
    {
        "working_dir",
        "train_files",
        "eval_files",
        "schema_path",
        "schema_file",
        "transform_graph_path",
        "transform_output",
        "data_accessor",
        "serving_model_dir",
        "eval_model_dir",
        "model_run_dir",
        "base_model",
    }
)
# The batch a student is called on at pipeline build (shape `[None, ...]`
# inputs get this many rows).
BUILD_BATCH = 2


class BuildFnArgs(FnArgs):
    """`FnArgs` as known at pipeline build, recording which run-time field `student_fn` reads.

    The steps, `custom_config` and `hyperparameters` (when the Distiller has
    no hyperparameters input) are what the executor will pass; the fields
    of `RUN_TIME_FIELDS` (and `hyperparameters` from an input) are None.
    """

    def __init__(self, *, unknown: frozenset[str] = RUN_TIME_FIELDS, **known):
        super().__init__(**known)
        object.__setattr__(self, "_unknown", unknown)
        object.__setattr__(self, "read_unknown", set())

    def __getattribute__(self, name):
        if name in object.__getattribute__(self, "_unknown"):
            object.__getattribute__(self, "read_unknown").add(name)
        return super().__getattribute__(name)


def location(student_fn: Callable, module_file: str) -> str:
    """`path:line` of the `def student_fn` line, or the module file where it cannot be read."""
    try:
        return f"{module_file}:{inspect.getsourcelines(student_fn)[1]}"
    except (OSError, TypeError):
        return module_file


def _raised_at(error: BaseException, module_file: str) -> str:
    """` (at path:line)`: the last line of the module file the error passed through, or ''."""
    target, line = os.path.realpath(module_file), None
    tb = error.__traceback__
    while tb is not None:
        if os.path.realpath(tb.tb_frame.f_code.co_filename) == target:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" (at {module_file}:{line})" if line else ""


def zeros_batch(model: keras.Model) -> dict[str, tf.Tensor] | None:
    """A batch of zeros (empty strings) for every input of `model`, by input name.

    Returns:
      None when an input is sparse or ragged (no dense batch to call it on).
    """
    features = {}
    for name, spec in zip(model.input_names, model.inputs, strict=True):
        if isinstance(getattr(spec, "type_spec", None), (tf.SparseTensorSpec, tf.RaggedTensorSpec)):
            return None
        shape = [BUILD_BATCH if d is None else d for d in spec.shape]
        if spec.dtype == tf.string:
            features[name] = tf.fill(shape, b"")
        else:
            features[name] = tf.zeros(shape, spec.dtype)
    return features


def check_at_build(module_file: str, fn_args: BuildFnArgs) -> bool:
    """Builds `student_fn` once when the pipeline is built, and checks it returns logits.

    Run before any component, so a student_fn that raises, returns no Keras
    model or returns probabilities is refused in seconds, naming the module
    file and line, rather than inside the Distiller's run after Transform
    and the teachers. A student_fn that reads a run-time field of `fn_args`
    (Transform's output, say) is built only where the Distiller runs, which
    checks it then (`build`, `check_logits`, `check_student`).

    Args:
      module_file: The module file defining `student_fn`, a local path.
      fn_args: What is known of the Distiller's `FnArgs` now.

    Returns:
      True when the student was built and checked; False when it depends on
      the run (the executor checks it).

    Raises:
      ConfigError: naming the module file and line of `student_fn`: it
        returns no Keras model, several outputs, or probabilities; or the
        module cannot be loaded.
      UserCodeError: `student_fn` raised (naming the line it raised at);
        the user's exception is the cause.
    """
    try:
        student_fn = load_student_fn({"module_file": module_file}, import_as_python_does)
    except ConfigError as e:
        missing = e.__cause__
        if (
            isinstance(missing, ModuleNotFoundError)
            and missing.name
            and not (os.path.basename(module_file).startswith(missing.name.split(".")[0]))
        ):
            # A package installed only where the pipeline runs (a cluster's
            # image) is no reason to refuse a pipeline compiled here.
            return _deferred(module_file, fn_args, f"it imports {missing.name}, not installed here")
        raise
    where = location(student_fn, module_file)
    try:
        model = build(student_fn, fn_args, module_file)
    except user_code.UserCodeError as e:
        if fn_args.read_unknown:
            return _deferred(where, fn_args)
        raise user_code.UserCodeError(
            f"{where}: {e}{_raised_at(e.__cause__, module_file)}, built at pipeline build with "
            f"fn_args holding train_steps, eval_steps, custom_config and hyperparameters; make "
            f"{STUDENT_FN} build from those (or from Transform's output, read where the "
            "Distiller runs)"
        ) from e.__cause__
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    if fn_args.read_unknown:
        return _deferred(where, fn_args)
    features = zeros_batch(model)
    if features is None:
        return _deferred(where, fn_args, "it reads sparse or ragged inputs")
    try:
        check_logits(model, features, where, batch="a batch of zeros at pipeline build")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return True


def import_as_python_does(student_module: Mapping[str, str], name: str):
    """`name` of the module file, imported as Python imports a file (`__file__` set).

    TFX's own loader leaves `__file__` unset, while the Distiller's run imports
    the packaged module normally, so a module that reads `__file__` at import
    (to find a helper beside it) loads where the Distiller runs; at pipeline
    build it must too.
    """
    module_file = student_module["module_file"]
    stem = os.path.splitext(os.path.basename(module_file))[0]
    spec = importlib.util.spec_from_file_location(f"_tfxkit_student_check_{stem}", module_file)
    if spec is None:
        raise ImportError(f"not a Python module file: {module_file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _deferred(where: str, fn_args: BuildFnArgs, why: str = "") -> bool:
    why = why or f"it reads fn_args.{', fn_args.'.join(sorted(fn_args.read_unknown))}"
    logging.info(
        "%s of %s is checked when the Distiller runs, not at pipeline build: %s, known then.",
        STUDENT_FN,
        where,
        why,
    )
    return False


def label_key(
    config: PipelineConfig,
    teachers: Sequence[teachers_lib.TeacherInfo],
    transformed_features: Sequence[str],
) -> str:
    """The transformed label: `distillation.label_key`, else the one feature no teacher reads.

    Raises:
      ValueError: naming `distillation.label_key` when it is unknown or cannot
        be inferred.
    """
    features = set(transformed_features)
    given = config.distillation.label_key
    if given:
        if given not in features:
            raise ValueError(
                f"distillation.label_key: {given!r} is not a transformed feature; Transform writes "
                f"{sorted(features)}"
            )
        return given
    read = set().union(*(t.input_specs for t in teachers))
    left = sorted(features - read)
    if len(left) != 1:
        raise ValueError(
            f"distillation.label_key: cannot tell the label from the transformed features the teachers do not "
            f"read ({left}); set distillation.label_key to the transformed label feature"
        )
    return left[0]


def class_logits_model(student: keras.Model, width: int) -> keras.Model:
    """The student as the KD loss trains it: `[batch, classes]` logits.

    A one-unit (binary) student is wrapped so its logit `z` reads as the two
    logits `[0, z]`; the wrapper shares every layer, so training it trains
    `student`, which is what is exported. Wider students are returned as
    they are.
    """
    if width != 1:
        return student
    two = teachers_lib.class_logits(student.outputs[0], teachers_lib.LOGITS, 1)
    return keras.Model(student.inputs, two, name=f"{student.name}_two_class")


def export_like_teacher(
    student: keras.Model,
    tft_output: tft.TFTransformOutput,
    teacher: teachers_lib.TeacherInfo,
    export_dir: str,
) -> None:
    """Saves `student` with the teacher's serving signatures.

    `serving_default` parses the raw features the teacher's parses, applies
    the transform graph, runs the student and returns the teacher's output
    key with the teacher's meaning (softmax / sigmoid applied when the teacher
    gives probabilities); each transform signature of the teacher is
    reproduced from the transform graph alone.

    Raises:
      ValueError: when the teacher parses a raw feature the transform graph
        does not describe.
    """
    student.tft_layer = tft_output.transform_features_layer()
    raw_spec = tft_output.raw_feature_spec()

    def spec_of(keys: Sequence[str], signature: str) -> dict:
        missing = sorted(set(keys) - set(raw_spec))
        if missing:
            raise ValueError(
                f"distillation: teacher {teacher.export_dir} signature {signature!r} parses {missing}, which the "
                "transform graph's raw features do not include; distil on the teacher's own Transform output"
            )
        return {k: raw_spec[k] for k in keys}

    ((input_name, input_spec),) = teacher.serving_inputs.items()
    signature = [tf.TensorSpec(input_spec.shape, input_spec.dtype, name=input_name)]
    serve_spec = spec_of(teacher.parse_keys, "serving_default")
    input_keys = list(student.input_names)
    (output_key,) = teacher.output_keys

    @tf.function(input_signature=signature, autograph=False)
    def serve(examples):
        parsed = tf.io.parse_example(examples, serve_spec)
        transformed = student.tft_layer(parsed)
        out = tf.cast(student({k: transformed[k] for k in input_keys}, training=False), tf.float32)
        if teacher.output == teachers_lib.PROBABILITIES:
            out = tf.sigmoid(out) if teacher.width == 1 else tf.nn.softmax(out)
        return {output_key: out}

    signatures = {"serving_default": serve.get_concrete_function()}
    for name, (keys, outputs) in teacher.transform_signatures.items():
        signatures[name] = _transform_signature(
            student.tft_layer, spec_of(keys, name), outputs, signature
        ).get_concrete_function()
    student.save(export_dir, save_format="tf", signatures=signatures, include_optimizer=False)


def _transform_signature(tft_layer, parse_spec, outputs, signature):
    @tf.function(input_signature=signature, autograph=False)
    def transform(examples):
        transformed = tft_layer(tf.io.parse_example(examples, parse_spec))
        return {k: transformed[k] for k in outputs}

    return transform
