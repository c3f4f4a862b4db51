"""Exported teachers: reading what they are, calling them, checking them against the student.

`describe_teacher` reads a teacher's export (the tfxkit Trainer's, or any Keras model a
`run_fn` saved) into a `TeacherInfo`; `ExportedTeacher` calls it on transformed features;
`class_logits` turns its output into class logits; the `check_*` functions refuse
teachers the student cannot learn from. No TFX types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf
import tf_keras as keras

from components.config import NOISY_STUDENT, PipelineConfig
from components.distillation import positional
from components.distillation.model import count_params
from components.training.export import SERVING_OUTPUT_KEYS, TRANSFORMED_LOGITS_SIGNATURE

TFXKIT = "tfxkit"
KERAS = "keras"
LOGITS = "logits"
PROBABILITIES = "probabilities"
# Clip of probabilities before their log: a certain teacher gives finite logits.
_EPSILON = 1e-7


@dataclasses.dataclass(frozen=True)
class TeacherInfo:
    """What the Distiller needs to know about one exported teacher.

    Attributes:
      export_dir: The serving SavedModel directory.
      kind: `TFXKIT` (the tfxkit Trainer's export) or `KERAS` (a Keras model
        saved by a user's run_fn).
      input_specs: Transformed feature name -> the spec the teacher reads.
      output_keys: Output keys of its `serving_default` signature.
      num_classes: Classes it predicts (2 for one binary unit).
      width: Width of its model output (1 for one binary unit).
      output: `LOGITS` or `PROBABILITIES`: what its model output means.
      num_params: Trainable parameters of the model.
      serving_inputs: Input specs of `serving_default` (name -> spec).
      parse_keys: The raw tf.Example features `serving_default` parses (a
        Keras teacher's only).
      transform_signatures: Its other signatures, each a transform of raw
        examples (TFX's `transform_features`): name -> (the raw features it
        parses, the transformed features it returns). A Keras teacher's only.
      serving_problem: Why a student could not serve as this teacher does
        ("" when it can); `components.distillation.students` refuses on it.
      positional: The transformed feature each input of a Keras 3 model's
        call reads, in call order (`components.distillation.positional`);
        empty where the call takes named inputs.
    """

    export_dir: str
    kind: str
    input_specs: dict[str, tf.TensorSpec]
    output_keys: tuple[str, ...]
    num_classes: int
    width: int
    output: str
    num_params: int
    serving_inputs: dict[str, tf.TensorSpec] = dataclasses.field(default_factory=dict)
    parse_keys: tuple[str, ...] = ()
    transform_signatures: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = dataclasses.field(
        default_factory=dict
    )
    serving_problem: str = ""
    positional: tuple[str, ...] = ()


def _load(export_dir: str):
    if not tf.io.gfile.exists(export_dir):
        raise ValueError(f"distillation: teacher model directory {export_dir!r} does not exist")
    try:
        return tf.saved_model.load(export_dir)
    except (OSError, ValueError, tf.errors.OpError) as e:
        raise ValueError(
            f"distillation: teacher model {export_dir!r} is not a readable SavedModel: {e}"
        ) from e


def describe_teacher(
    export_dir: str,
    teacher_output: str = "auto",
    transformed_features: Sequence[str] = (),
) -> TeacherInfo:
    """Reads a teacher's signatures, output and size without running it.

    Args:
      export_dir: The teacher's serving SavedModel.
      teacher_output: `distillation.teacher_output` of a Keras teacher:
        "auto" (read from the model's graph), "logits" or "probabilities".
      transformed_features: The transformed feature names (a Keras teacher's
        signatures that return some of them are transform signatures).

    Raises:
      ValueError: if the directory holds no SavedModel, or no signature the
        Distiller can use, naming what is missing and the fix.
    """
    loaded = _load(export_dir)
    serving = _serving_default(loaded, export_dir)
    output_keys = tuple(sorted(serving.structured_outputs))
    num_params = count_params(getattr(loaded, "trainable_variables", ()))
    if TRANSFORMED_LOGITS_SIGNATURE in loaded.signatures:
        logits_fn = loaded.signatures[TRANSFORMED_LOGITS_SIGNATURE]
        width = int(logits_fn.structured_outputs["logits"].shape[-1])
        return TeacherInfo(
            export_dir=export_dir,
            kind=TFXKIT,
            input_specs=dict(logits_fn.structured_input_signature[1]),
            output_keys=output_keys,
            num_classes=width,
            width=width,
            output=LOGITS,
            num_params=num_params,
        )
    call, positional_names = _keras_call(loaded, serving, export_dir, transformed_features)
    specs = tf.nest.flatten(call.structured_input_signature[0][0])
    if positional_names:
        specs = [
            tf.TensorSpec(s.shape, s.dtype, name=n)
            for s, n in zip(specs, positional_names, strict=True)
        ]
        num_params = count_params(call.trainable_variables)
    width = _output_width(call, export_dir)
    output = teacher_output if teacher_output != "auto" else read_output_kind(call)
    parse_keys, transform_signatures, problems = _read_signatures(
        loaded.signatures, output_keys, export_dir, transformed_features
    )
    return TeacherInfo(
        export_dir=export_dir,
        kind=KERAS,
        input_specs={spec.name: spec for spec in specs},
        output_keys=output_keys,
        num_classes=max(width, 2),
        width=width,
        output=output,
        num_params=num_params,
        serving_inputs=dict(serving.structured_input_signature[1]),
        parse_keys=parse_keys,
        transform_signatures=transform_signatures,
        # What a student_fn student could not reproduce: refused only on that path.
        serving_problem="; ".join(problems),
        positional=positional_names,
    )


def _serving_default(loaded, export_dir: str):
    """The teacher's `serving_default` signature, which every teacher must have."""
    signatures = loaded.signatures
    if "serving_default" not in signatures:
        raise ValueError(
            f"distillation: teacher model {export_dir!r} has no 'serving_default' signature (it has "
            f"{sorted(signatures)}); export the teacher with model.save(..., signatures={{'serving_default': ...}}) "
            "as TFX's examples do"
        )
    return signatures["serving_default"]


def _keras_call(loaded, serving, export_dir: str, transformed_features: Sequence[str]):
    """The restored Keras call on transformed features of a teacher without tfxkit's signature.

    Returns:
      `(call, positional names)`: a tf_keras model's inference call (names
      empty: its inputs are named), or a Keras 3 model's positional call and
      the transformed feature each input reads. Without `transformed_features`
      a positional call keeps its own input names (`inputs_0`, ...).
    """
    call = _inference_call(loaded)
    if call is not None:
        return call, ()
    call = positional.positional_call(loaded)
    if call is not None:
        specs = tf.nest.flatten(call.structured_input_signature[0][0])
        if not transformed_features:
            return call, tuple(s.name for s in specs)
        return call, positional.input_names(call, serving, transformed_features, export_dir)
    raise ValueError(
        f"distillation: teacher model {export_dir!r} has neither a '{TRANSFORMED_LOGITS_SIGNATURE}' signature "
        "(the tfxkit Trainer's export) nor a restorable Keras call on transformed features; save the teacher "
        "with the Keras model's model.save(serving_model_dir, signatures=...) in its run_fn"
    )


def _output_width(call, export_dir: str) -> int:
    """The width of a Keras teacher's one `[batch, classes]` output."""
    out_spec = call.structured_outputs
    if not isinstance(out_spec, tf.TensorSpec) or out_spec.shape.rank != 2:
        raise ValueError(
            f"distillation: teacher model {export_dir!r} returns {out_spec!r}; the Distiller needs one "
            "[batch, classes] output (logits, probabilities or one binary unit)"
        )
    return int(out_spec.shape[-1])


def _read_signatures(
    signatures,
    output_keys: tuple[str, ...],
    export_dir: str,
    transformed_features: Sequence[str],
) -> tuple[tuple[str, ...], dict[str, tuple[tuple[str, ...], tuple[str, ...]]], list[str]]:
    """Reads a Keras teacher's signatures as a `student_fn` student would have to serve them.

    Returns:
      The raw features `serving_default` parses, the transform signatures
      (name -> (raw features parsed, transformed features returned)), and
      why a student could not serve as the teacher does: its serving outputs
      (`output_keys`) unless one, then one reason per signature it could not
      reproduce.
    """
    problems = []
    if len(output_keys) != 1:
        problems.append(
            f"it serves outputs {list(output_keys)}; a student_fn student reproduces one serving output, so "
            "serve one key from the teacher's serving_default"
        )
    parse_keys: tuple[str, ...] = ()
    transform_signatures = {}
    wanted = set(transformed_features)
    for name, fn in signatures.items():
        try:
            if name == "serving_default":
                parse_keys = _parsed_features(fn, export_dir, name)
            elif wanted and set(fn.structured_outputs) <= wanted:
                transform_signatures[name] = (
                    _parsed_features(fn, export_dir, name),
                    tuple(sorted(fn.structured_outputs)),
                )
            else:
                problems.append(
                    f"it has a signature {name!r} that is neither 'serving_default' nor a transform of raw "
                    "examples, so the student could not serve it as the teacher does; remove it from the "
                    "teacher's export"
                )
        except ValueError as e:
            problems.append(str(e))
    return parse_keys, transform_signatures, problems


def _inference_call(loaded):
    """The restored Keras call of `loaded` in inference mode (`training=False`), or None."""
    try:
        concretes = loaded.__call__.concrete_functions
    except AttributeError:  # not a Keras model: no restored call
        return None
    for concrete in concretes:
        args, kwargs = concrete.structured_input_signature
        training = args[1] if len(args) > 1 else kwargs.get("training")
        if training is False:
            return concrete
    return None


# Ops an output passes through unchanged in meaning.
_PASS_THROUGH = {"Identity", "IdentityN", "Cast", "Reshape", "Squeeze", "ExpandDims"}
_CALLS = {"StatefulPartitionedCall", "PartitionedCall"}


def read_output_kind(call) -> str:
    """`PROBABILITIES` when the model's output comes from a Softmax / Sigmoid op, else `LOGITS`."""
    graph_def = call.graph.as_graph_def()
    library = {f.signature.name: f for f in graph_def.library.function}

    def producer(nodes, ref, depth):
        node = nodes.get(ref.split(":")[0].lstrip("^"))
        while node is not None and depth < 32:
            if node.op in _PASS_THROUGH:
                node = nodes.get(node.input[0].split(":")[0])
                continue
            if node.op in _CALLS:
                function = library.get(node.attr["f"].func.name)
                if function is None:
                    return node.op
                inner = {n.name: n for n in function.node_def}
                return producer(
                    inner, function.ret[function.signature.output_arg[0].name], depth + 1
                )
            return node.op
        return None

    top = {n.name: n for n in graph_def.node}
    op = producer(top, call.outputs[0].name, 0)
    return PROBABILITIES if op in ("Softmax", "Sigmoid") else LOGITS


def _parsed_features(fn, export_dir: str, name: str) -> tuple[str, ...]:
    """The raw features a signature parses from serialized tf.Examples (its ParseExample ops)."""
    graph_def = fn.graph.as_graph_def()
    functions = [list(graph_def.node)] + [list(f.node_def) for f in graph_def.library.function]
    keys: list[str] = []
    found = False
    for nodes in functions:
        by_name = {n.name: n for n in nodes}
        for node in nodes:
            if node.op != "ParseExampleV2":
                continue
            found = True
            # Inputs: serialized, names, sparse_keys, dense_keys, ragged_keys, defaults...
            for ref in list(node.input)[2:5]:
                const = by_name.get(ref.split(":")[0])
                if const is None or const.op != "Const":
                    raise ValueError(
                        f"its signature {name!r} parses features whose names are computed, so the student "
                        "cannot parse the same ones"
                    )
                keys += [s.decode() for s in const.attr["value"].tensor.string_val]
    if not found:
        raise ValueError(
            f"its signature {name!r} does not parse serialized tf.Examples (no tf.io.parse_example in it), so "
            "the student cannot serve the same input; serve raw examples as TFX's examples do"
        )
    return tuple(sorted(set(keys)))


def check_agreement(teachers: Sequence[TeacherInfo], teacher_weights: Sequence[float] = ()) -> None:
    """Fails when several teachers cannot be averaged into one target.

    Raises:
      ValueError: naming the teachers that disagree (classes, output width
        or meaning of the serving output, serving keys) or
        `distillation.teacher_weights` of the wrong length.
    """
    if not teachers:
        raise ValueError(
            "distillation: no teacher model was given; pass one or more trained teacher Model artifacts "
            "(the teacher Trainers' outputs['model'])"
        )
    if teacher_weights and len(teacher_weights) != len(teachers):
        raise ValueError(
            f"distillation.teacher_weights: {len(teacher_weights)} weights for {len(teachers)} teacher models; "
            "give one weight per teacher"
        )
    first = teachers[0]
    for i, teacher in enumerate(teachers[1:], start=1):
        for what, a, b in (
            ("kind of export", first.kind, teacher.kind),
            ("classes", first.num_classes, teacher.num_classes),
            ("serving output keys", first.output_keys, teacher.output_keys),
            ("output width", first.width, teacher.width),
            (
                "serving inputs",
                _describe_specs(first.serving_inputs),
                _describe_specs(teacher.serving_inputs),
            ),
        ):
            if a != b:
                raise ValueError(
                    f"teacher_models: teacher 0 ({first.export_dir}) and teacher {i} ({teacher.export_dir}) "
                    f"disagree on their {what} ({a} vs {b}); distil from teachers of one task and one serving "
                    "contract"
                )


def check_teachers(
    config: PipelineConfig, teachers: Sequence[TeacherInfo], student: keras.Model
) -> None:
    """Fails before training when the teachers cannot teach the configured student.

    Args:
      config: The validated pipeline config (the student's task).
      teachers: Descriptions of the teacher models (tfxkit exports).
      student: An (untrained) student of the configured shape.

    Raises:
      ValueError: naming the config field to fix.
    """
    check_agreement(teachers, config.distillation.teacher_weights)
    num_classes = config.data.label.num_classes
    student_inputs = {
        k: (tuple(t.shape.as_list()[1:]), t.dtype)
        for k, t in zip(student.input_names, student.inputs, strict=True)
    }
    for i, teacher in enumerate(teachers):
        where = f"teacher {i} ({teacher.export_dir})"
        if teacher.kind != TFXKIT:
            raise ValueError(
                f"distillation: {where} was not exported by the tfxkit Trainer, so the configured student cannot "
                "serve like it; give the Distiller a module_file with student_fn (your own student model) instead"
            )
        if teacher.num_classes != num_classes:
            raise ValueError(
                f"data.label.num_classes: {where} predicts {teacher.num_classes} classes but the student's task has "
                f"{num_classes}; distil from teachers trained on this label"
            )
        if set(teacher.output_keys) != set(SERVING_OUTPUT_KEYS):
            raise ValueError(
                f"distillation: {where} serves outputs {sorted(teacher.output_keys)} but the student serves "
                f"{sorted(SERVING_OUTPUT_KEYS)}; Evaluator and Pusher compare them as one model, so export the "
                "teacher with the tfxkit Trainer"
            )
        teacher_inputs = {
            k: (tuple(s.shape.as_list()[1:]), s.dtype) for k, s in teacher.input_specs.items()
        }
        if teacher_inputs != student_inputs:
            raise ValueError(
                f"data.features: {where} reads transformed features {_describe(teacher_inputs)} but the student reads "
                f"{_describe(student_inputs)}; distil from teachers trained on this feature config"
            )
        check_compression(
            config, student, teacher, where, "shrink student.hidden_units / student.embedding_dim"
        )


def check_compression(
    config: PipelineConfig, student: keras.Model, teacher: TeacherInfo, where: str, fix: str
) -> None:
    """Refuses a student not smaller than its teacher while `distillation.require_compression` holds
    (never for method noisy_student, whose students may be larger).

    Raises:
      ValueError: naming the field, with `fix` as the way to shrink the student.
    """
    if config.distillation.method == NOISY_STUDENT:
        # Noisy Student's students may be as large as their teachers or larger.
        return
    student_params = count_params(student.trainable_weights)
    if config.distillation.require_compression and student_params >= teacher.num_params:
        raise ValueError(
            f"student: the student has {student_params} parameters, not fewer than the {teacher.num_params} of "
            f"{where}, and distillation.require_compression is true; {fix} or set "
            "distillation.require_compression: false"
        )


def check_outputs(teacher: TeacherInfo, outputs: np.ndarray, index: int) -> None:
    """Checks the reading of a teacher's output on the first batch.

    Probabilities must lie in [0, 1], and sum to 1 per row when there are
    several classes; outputs read as logits that look exactly like
    probabilities are refused too (softmax outputs read as logits would
    distil the wrong targets).

    Raises:
      ValueError: naming `distillation.teacher_output` and the fix.
    """
    if teacher.kind != KERAS or outputs.size == 0:
        return
    where = f"teacher {index} ({teacher.export_dir})"
    in_range = bool(np.all((outputs >= 0.0) & (outputs <= 1.0)))
    sums_to_one = teacher.width > 1 and bool(np.allclose(outputs.sum(axis=-1), 1.0, atol=1e-3))
    if teacher.output == PROBABILITIES:
        if not in_range or (teacher.width > 1 and not sums_to_one):
            raise ValueError(
                f"distillation.teacher_output: {where} was read as giving probabilities, but on the first batch its "
                f"outputs range over [{outputs.min():.4g}, {outputs.max():.4g}]"
                + (
                    ""
                    if teacher.width == 1
                    else f" and its rows sum to {outputs.sum(axis=-1)[:3].round(4).tolist()}..."
                )
                + "; set distillation.teacher_output: logits"
            )
    elif in_range and sums_to_one:
        raise ValueError(
            f"distillation.teacher_output: {where} was read as giving logits, but on the first batch every row of "
            "its outputs lies in [0, 1] and sums to 1, as probabilities do; set distillation.teacher_output: "
            "probabilities"
        )


def check_labels(teacher: TeacherInfo, labels: np.ndarray) -> None:
    """Refuses labels the teacher's classes do not cover (negative ones are unlabeled).

    Raises:
      ValueError: naming the label feature's fix.
    """
    labels = np.asarray(labels).reshape(-1)
    bad = labels[labels >= teacher.num_classes]
    if bad.size:
        raise ValueError(
            f"distillation.label_key: the first batch has label {int(bad[0])}, outside the {teacher.num_classes} "
            f"classes of teacher {teacher.export_dir}; check the label feature (unlabeled examples take "
            "a negative label)"
        )


def _describe(inputs: dict[str, tuple]) -> str:
    return (
        "{"
        + ", ".join(
            f"{k}: {list(shape)} {dtype.name}" for k, (shape, dtype) in sorted(inputs.items())
        )
        + "}"
    )


def _describe_specs(specs: Mapping[str, tf.TensorSpec]) -> str:
    return _describe({k: (tuple(s.shape.as_list()), s.dtype) for k, s in specs.items()})


def class_logits(outputs: tf.Tensor, output: str, width: int) -> tf.Tensor:
    """A model output as `[batch, classes]` logits for the KD loss.

    One binary unit `z` becomes the two logits `[0, z]` (`softmax([0, z])` is
    `[1 - sigmoid(z), sigmoid(z)]`); probabilities become their logs (equal
    to the logits up to a per-row constant, which softmax ignores).
    """
    outputs = tf.cast(outputs, tf.float32)
    if output == PROBABILITIES:
        p = tf.clip_by_value(outputs, _EPSILON, 1.0 - _EPSILON if width == 1 else 1.0)
        outputs = tf.math.log(p) - tf.math.log1p(-p) if width == 1 else tf.math.log(p)
    if width == 1:
        outputs = tf.concat([tf.zeros_like(outputs), outputs], axis=-1)
    return outputs


def conform(features: Mapping[str, tf.Tensor], spec: tf.TensorSpec) -> tf.Tensor:
    """A transformed feature as a Keras input of `spec` takes it (rank and dtype), as Keras's fit does.

    Raises:
      ValueError: naming the feature, where no cast turns its dtype into the
        input's (strings and numbers). Keras's fit fails on the same cast only
        where the model reads the input; an exported teacher is called with
        every input its signature declares.
    """
    value = tf.convert_to_tensor(features[spec.name])
    if spec.shape.rank is not None and value.shape.rank == spec.shape.rank - 1:
        value = tf.expand_dims(value, -1)
    if value.dtype == spec.dtype:
        return value
    if (value.dtype == tf.string) != (spec.dtype == tf.string):
        why = (
            " (SchemaGen infers a column without values as a string)"
            if value.dtype == tf.string
            else ""
        )
        raise ValueError(
            f"distillation: the teacher's input {spec.name!r} takes {spec.dtype.name} but the Transform "
            f"output holds it as {value.dtype.name}, which no cast turns into {spec.dtype.name}; give the "
            f"raw column the teacher's type in the schema the Transform reads{why}"
        )
    return tf.cast(value, spec.dtype)


class ExportedTeacher(keras.layers.Layer):
    """A frozen exported teacher called on transformed features; returns class logits.

    Load it inside the strategy scope the student trains in, so its variables
    are placed like the student's.

    Args:
      export_dir: The teacher's serving SavedModel.
      info: Its description (`describe_teacher`); read from `export_dir` when
        not given (a tfxkit export).
    """

    def __init__(self, export_dir: str, info: TeacherInfo | None = None, **kwargs):
        super().__init__(trainable=False, **kwargs)
        self.export_dir = export_dir
        self.info = info if info is not None else describe_teacher(export_dir)
        self._loaded = tf.saved_model.load(export_dir)
        if self.info.kind == TFXKIT:
            self._logits_fn = self._loaded.signatures[TRANSFORMED_LOGITS_SIGNATURE]
            self.input_keys = tuple(sorted(self._logits_fn.structured_input_signature[1]))
        elif self.info.positional:
            call = positional.positional_call(self._loaded)
            self._structure = call.structured_input_signature[0][0]
        else:
            self._structure = _inference_call(self._loaded).structured_input_signature[0][0]

    def outputs_of(self, features) -> tf.Tensor:
        """The teacher model's own output (as it serves it, before `class_logits`)."""
        if self.info.kind == TFXKIT:
            return self._logits_fn(**{k: features[k] for k in self.input_keys})["logits"]
        if self.info.positional:
            flat = [conform(features, self.info.input_specs[name]) for name in self.info.positional]
            inputs = tf.nest.pack_sequence_as(self._structure, flat)
            return self._loaded._default_save_signature(inputs)
        inputs = tf.nest.map_structure(lambda spec: conform(features, spec), self._structure)
        return self._loaded(inputs, training=False)

    def call(self, features, training=None):
        # A restored graph is a frozen inference function: `training` has no effect.
        del training
        return class_logits(self.outputs_of(features), self.info.output, self.info.width)
