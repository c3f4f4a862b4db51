"""Typed, validated pipeline configuration.

One `PipelineConfig` (nested frozen dataclasses) is loaded from YAML and
validated before anything runs. It crosses into TFX components once, as JSON
under a single `custom_config` key (`CONFIG_KEY`), and executors parse it back
with `PipelineConfig.from_json` on their first line.

Every error is a `ConfigError` whose message starts with the dotted path of the
offending field (for example `train.learning_rate`) and says what is expected.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

CONFIG_KEY = "tfxkit_config"
SHIPPED_CONFIG_DIR = Path(__file__).resolve().parent.parent / "pipelines" / "configs"

FeatureKind = Literal["float", "int_categorical", "string_categorical"]
FloatTransform = Literal["zscore", "bucketize", "identity"]
CategoricalTransform = Literal["vocabulary", "identity"]


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field path."""


def _fail(path: str, message: str) -> typing.NoReturn:
    raise ConfigError(f"{path}: {message}")


# --------------------------------------------------------------------------- #
# Sections
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class FeatureConfig:
    """One input feature.

    Attributes:
      name: Column (CSV) or feature key (tf.Example) in the raw data.
      kind: `float` (dense numeric, may have missing values), `int_categorical`
        or `string_categorical`.
      transform: For floats `zscore` (default), `bucketize` or `identity`;
        for categoricals `vocabulary` (default) or `identity` (integers in
        `[0, num_buckets)` only).
      size: Number of values per example (1 for scalars, 64 for 8x8 pixels).
      num_buckets: Buckets for `bucketize`, or the id range for an integer
        `identity` categorical.
      oov_buckets: Out-of-vocabulary buckets for `vocabulary`.
      top_k: Keep only the most frequent `top_k` vocabulary entries (0: all).
      fill_value: Value imputed for a missing float; None imputes the mean.
    """

    name: str
    kind: FeatureKind
    transform: str | None = None
    size: int = 1
    num_buckets: int = 0
    oov_buckets: int = 1
    top_k: int = 0
    fill_value: float | None = None

    @property
    def effective_transform(self) -> str:
        if self.transform is not None:
            return self.transform
        return "zscore" if self.kind == "float" else "vocabulary"

    @property
    def transformed_name(self) -> str:
        return f"{self.name}_xf"

    @property
    def is_categorical(self) -> bool:
        """Whether the transformed feature is an integer id (embedded by the model)."""
        return self.kind != "float" or self.effective_transform == "bucketize"

    def validate(self, path: str) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):
            _fail(f"{path}.name", f"expected an identifier ([A-Za-z_][A-Za-z0-9_]*), got {self.name!r}")
        allowed = typing.get_args(FloatTransform if self.kind == "float" else CategoricalTransform)
        if self.transform is not None and self.transform not in allowed:
            _fail(f"{path}.transform", f"expected one of {list(allowed)} for kind {self.kind!r}, got {self.transform!r}")
        if self.size < 1:
            _fail(f"{path}.size", f"expected an integer >= 1, got {self.size}")
        t = self.effective_transform
        if t == "bucketize" and self.num_buckets < 2:
            _fail(f"{path}.num_buckets", f"expected an integer >= 2 for transform 'bucketize', got {self.num_buckets}")
        if self.kind != "float" and t == "identity":
            if self.kind == "string_categorical":
                _fail(f"{path}.transform", "'identity' needs integer values; use 'vocabulary' for strings")
            if self.num_buckets < 1:
                _fail(f"{path}.num_buckets", "expected the id range (>= 1) for an 'identity' integer categorical")
        if t == "vocabulary" and self.oov_buckets < 1:
            _fail(f"{path}.oov_buckets", f"expected an integer >= 1 (unseen values need a bucket), got {self.oov_buckets}")
        if self.top_k < 0:
            _fail(f"{path}.top_k", f"expected an integer >= 0 (0 keeps all), got {self.top_k}")
        if self.kind != "float" and self.size != 1:
            _fail(f"{path}.size", "categorical features must be scalars (size 1)")


@dataclass(frozen=True)
class LabelConfig:
    """The classification target.

    Attributes:
      name: Column / feature key of the integer class label.
      num_classes: Number of classes; labels are ints in `[0, num_classes)`.
        Binary tasks use 2 (two-logit softmax form).
    """

    name: str = "label"
    num_classes: int = 2

    def validate(self, path: str) -> None:
        if self.num_classes < 2:
            _fail(f"{path}.num_classes", f"expected an integer >= 2, got {self.num_classes}")


@dataclass(frozen=True)
class DataConfig:
    """Where the raw data is and what it contains.

    Attributes:
      builtin: `taxi` or `digits` to use data that ships in installed packages;
        empty to use `path`.
      path: A CSV / TFRecord file or a directory of them (user data).
      format: `csv` or `tfrecord` (of tf.Example).
      label: The label column.
      features: The model's input features; the label must not be one of them.
      exclude: Columns present in the data that must never become features
        (for example the raw source of the label).
      train_buckets: Hash buckets of the train split (ExampleGen).
      eval_buckets: Hash buckets of the eval split.
    """

    builtin: str = ""
    path: str = ""
    format: Literal["csv", "tfrecord"] = "csv"
    label: LabelConfig = field(default_factory=LabelConfig)
    features: tuple[FeatureConfig, ...] = ()
    exclude: tuple[str, ...] = ()
    train_buckets: int = 4
    eval_buckets: int = 1

    def validate(self, path: str) -> None:
        if bool(self.builtin) == bool(self.path):
            _fail(path, "set exactly one of 'builtin' (taxi, digits) or 'path' (your CSV/TFRecord files)")
        self.label.validate(f"{path}.label")
        if self.builtin and self.builtin not in ("taxi", "digits"):
            _fail(f"{path}.builtin", f"expected one of ['taxi', 'digits'], got {self.builtin!r}")
        if not self.features:
            _fail(f"{path}.features", "expected at least one feature")
        seen: set[str] = set()
        for i, feat in enumerate(self.features):
            feat.validate(f"{path}.features[{i}]")
            if feat.name in seen:
                _fail(f"{path}.features[{i}].name", f"duplicate feature {feat.name!r}")
            seen.add(feat.name)
            if feat.name == self.label.name:
                _fail(f"{path}.features[{i}].name", f"{feat.name!r} is the label; a label cannot also be a feature")
            if feat.name in self.exclude:
                _fail(f"{path}.features[{i}].name", f"{feat.name!r} is listed in data.exclude (it leaks the label)")
        if self.label.name in self.exclude:
            _fail(f"{path}.exclude", f"the label {self.label.name!r} cannot be excluded")
        for name in ("train_buckets", "eval_buckets"):
            if getattr(self, name) < 1:
                _fail(f"{path}.{name}", f"expected an integer >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class TransformConfig:
    """How Transform writes its output.

    Attributes:
      num_shards: Output files per split; 0 picks a default sized for parallel
        reads and per-worker file sharding (at least 2 x workers).
      compression: `gzip` (TFX's default) or `none` (faster to read).
      pack_features: Write dense numeric transformed features as one
        fixed-length float vector per example.
    """

    num_shards: int = 0
    compression: Literal["gzip", "none"] = "gzip"
    pack_features: bool = False

    def validate(self, path: str) -> None:
        if self.num_shards < 0:
            _fail(f"{path}.num_shards", f"expected an integer >= 0 (0 = automatic), got {self.num_shards}")


@dataclass(frozen=True)
class IngestionConfig:
    """The Trainer's tf.data input pipeline.

    Attributes:
      batch_size: Global batch size (split across replicas).
      eval_batch_size: Global batch size for evaluation.
      shuffle_buffer: Examples in the shuffle buffer (0 disables shuffling).
      cache: `none`, `memory`, or `file` (under the model run directory).
      num_parallel_reads: Files read concurrently (0 = autotune).
      num_parallel_calls: Parallel parse calls (0 = autotune).
      prefetch: Batches prefetched (0 = autotune).
      deterministic: Keep element order reproducible (slower).
    """

    batch_size: int = 256
    eval_batch_size: int = 256
    shuffle_buffer: int = 10000
    cache: Literal["none", "memory", "file"] = "none"
    num_parallel_reads: int = 0
    num_parallel_calls: int = 0
    prefetch: int = 0
    deterministic: bool = False

    def validate(self, path: str) -> None:
        for name in ("batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                _fail(f"{path}.{name}", f"expected an integer >= 1, got {getattr(self, name)}")
        for name in ("shuffle_buffer", "num_parallel_reads", "num_parallel_calls", "prefetch"):
            if getattr(self, name) < 0:
                _fail(f"{path}.{name}", f"expected an integer >= 0, got {getattr(self, name)}")


StrategyKind = Literal[
    "auto",
    "one_device",
    "mirrored",
    "multi_worker_mirrored",
    "parameter_server",
    "central_storage",
    "tpu",
]


@dataclass(frozen=True)
class StrategyConfig:
    """Which tf.distribute strategy the Trainer uses.

    Attributes:
      kind: One of `auto`, `one_device`, `mirrored`, `multi_worker_mirrored`,
        `parameter_server`, `central_storage`, `tpu`.
      num_gpus: GPUs to use on this machine (0: all visible for mirrored,
        CPU otherwise).
      num_cpu_devices: Logical CPU devices to create when there is no GPU
        (lets `mirrored` run on CPU; 0 keeps TensorFlow's default of one).
      communication: Collective implementation, `auto`, `ring` or `nccl`.
      all_reduce_pack_bytes: Pack small gradients into chunks of this size
        for all-reduce (0: TensorFlow's default).
      tpu: TPU name or address for `TPUClusterResolver` ('' = local / env).
      workers: Expected worker replicas (used to size shards and TFJobs).
      parameter_servers: Expected parameter-server replicas.
      steps_per_execution: Steps per `tf.function` call (parameter server, TPU).
    """

    kind: StrategyKind = "auto"
    num_gpus: int = 0
    num_cpu_devices: int = 0
    communication: Literal["auto", "ring", "nccl"] = "auto"
    all_reduce_pack_bytes: int = 0
    tpu: str = ""
    workers: int = 1
    parameter_servers: int = 0
    steps_per_execution: int = 1

    def validate(self, path: str) -> None:
        for name in ("num_gpus", "num_cpu_devices", "all_reduce_pack_bytes", "parameter_servers"):
            if getattr(self, name) < 0:
                _fail(f"{path}.{name}", f"expected an integer >= 0, got {getattr(self, name)}")
        for name in ("workers", "steps_per_execution"):
            if getattr(self, name) < 1:
                _fail(f"{path}.{name}", f"expected an integer >= 1, got {getattr(self, name)}")
        if self.kind == "parameter_server" and self.parameter_servers < 1 and self.workers > 1:
            _fail(f"{path}.parameter_servers", "expected >= 1 parameter server for kind 'parameter_server'")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings shared by the teacher and the student.

    Attributes:
      train_steps: Optimizer steps.
      eval_steps: Evaluation batches after training.
      steps_per_epoch: Steps between Keras epoch boundaries (callbacks, logs).
      learning_rate: Adam learning rate.
      mixed_precision: `none`, `mixed_float16` (GPU) or `mixed_bfloat16`
        (TPU / CPU).
      grad_accum_steps: Micro-batches per optimizer update (1 = off).
      checkpoint_every_steps: `BackupAndRestore` save frequency in steps.
      seed: Random seed for initialisation and shuffling.
    """

    train_steps: int = 1000
    eval_steps: int = 50
    steps_per_epoch: int = 100
    learning_rate: float = 1e-3
    mixed_precision: Literal["none", "mixed_float16", "mixed_bfloat16"] = "none"
    grad_accum_steps: int = 1
    checkpoint_every_steps: int = 100
    seed: int = 42

    def validate(self, path: str) -> None:
        for name in ("train_steps", "eval_steps", "steps_per_epoch", "checkpoint_every_steps"):
            if getattr(self, name) < 1:
                _fail(f"{path}.{name}", f"expected an integer >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            _fail(f"{path}.learning_rate", f"expected a number > 0, got {self.learning_rate}")
        if self.grad_accum_steps < 1:
            _fail(f"{path}.grad_accum_steps", f"expected an integer >= 1 (1 disables accumulation), got {self.grad_accum_steps}")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a feed-forward classifier over the transformed features.

    Attributes:
      hidden_units: Width of each hidden layer.
      embedding_dim: Embedding width for categorical features.
      dropout: Dropout rate after each hidden layer.
    """

    hidden_units: tuple[int, ...] = (64, 32)
    embedding_dim: int = 8
    dropout: float = 0.0

    def validate(self, path: str) -> None:
        if not self.hidden_units:
            _fail(f"{path}.hidden_units", "expected at least one hidden layer width")
        for i, w in enumerate(self.hidden_units):
            if w < 1:
                _fail(f"{path}.hidden_units[{i}]", f"expected an integer >= 1, got {w}")
        if self.embedding_dim < 1:
            _fail(f"{path}.embedding_dim", f"expected an integer >= 1, got {self.embedding_dim}")
        if not 0.0 <= self.dropout < 1.0:
            _fail(f"{path}.dropout", f"expected a number in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class DistillationConfig:
    """Teacher-then-student distillation.

    Attributes:
      enabled: Add the distillation stage after the teacher Trainer.
      alpha: Weight of the soft-target loss; `1 - alpha` weighs the hard loss.
      temperature: Softmax temperature T of the soft targets.
      num_teachers: Teacher Trainers (different seeds) whose soft targets are
        averaged.
      teacher_weights: Optional weights of the teachers (normalised).
      cache_teacher_logits: Compute teacher logits once per run.
      require_compression: Reject a student with as many parameters as the
        teacher or more.
    """

    enabled: bool = False
    alpha: float = 0.9
    temperature: float = 4.0
    num_teachers: int = 1
    teacher_weights: tuple[float, ...] = ()
    cache_teacher_logits: bool = False
    require_compression: bool = True

    def validate(self, path: str) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            _fail(f"{path}.alpha", f"expected a number in [0, 1], got {self.alpha}")
        if not self.temperature > 0:
            _fail(f"{path}.temperature", f"expected a number > 0, got {self.temperature}")
        if self.num_teachers < 1:
            _fail(f"{path}.num_teachers", f"expected an integer >= 1, got {self.num_teachers}")
        if self.teacher_weights:
            if len(self.teacher_weights) != self.num_teachers:
                _fail(f"{path}.teacher_weights", f"expected {self.num_teachers} weights (one per teacher), got {len(self.teacher_weights)}")
            if any(w < 0 for w in self.teacher_weights) or sum(self.teacher_weights) <= 0:
                _fail(f"{path}.teacher_weights", "expected non-negative weights with a positive sum")


@dataclass(frozen=True)
class EvaluationConfig:
    """Evaluator (TFMA) gates.

    Attributes:
      min_accuracy: Value threshold: the candidate must reach this accuracy.
      max_accuracy_drop: Change threshold for the student against the
        teacher baseline: accuracy may drop at most this much (absolute).
    """

    min_accuracy: float = 0.5
    max_accuracy_drop: float = 0.05

    def validate(self, path: str) -> None:
        if not 0.0 <= self.min_accuracy <= 1.0:
            _fail(f"{path}.min_accuracy", f"expected a number in [0, 1], got {self.min_accuracy}")
        if not 0.0 <= self.max_accuracy_drop <= 1.0:
            _fail(f"{path}.max_accuracy_drop", f"expected a number in [0, 1], got {self.max_accuracy_drop}")


@dataclass(frozen=True)
class Toleration:
    """A Kubernetes toleration."""

    key: str
    operator: Literal["Equal", "Exists"] = "Exists"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    def validate(self, path: str) -> None:
        if not self.key:
            _fail(f"{path}.key", "expected a non-empty toleration key")
        if self.operator == "Exists" and self.value:
            _fail(f"{path}.value", "operator 'Exists' takes no value; use operator 'Equal'")


@dataclass(frozen=True)
class Placement:
    """Where and with what one component runs on Kubernetes.

    Attributes:
      image: Container image ('' = `kubeflow.image`).
      cpu_request / cpu_limit: CPU as a Kubernetes quantity ('4', '500m').
      memory_request / memory_limit: Memory quantity ('16Gi').
      accelerator_type: e.g. `nvidia-l4`, `nvidia-tesla-a100`, `tpu-v5-lite-podslice`.
      accelerator_count: Accelerators per replica.
      tpu_topology: TPU slice topology such as `2x4` (TPU only).
      node_selector: Node labels the pod requires.
      tolerations: Taints the pod tolerates.
    """

    image: str = ""
    cpu_request: str = ""
    cpu_limit: str = ""
    memory_request: str = ""
    memory_limit: str = ""
    accelerator_type: str = ""
    accelerator_count: int = 0
    tpu_topology: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()

    def validate(self, path: str) -> None:
        if self.accelerator_count < 0:
            _fail(f"{path}.accelerator_count", f"expected an integer >= 0, got {self.accelerator_count}")
        if self.accelerator_count and not self.accelerator_type:
            _fail(f"{path}.accelerator_type", "accelerator_count is set but accelerator_type is empty; name the accelerator (e.g. nvidia-l4)")
        for i, tol in enumerate(self.tolerations):
            tol.validate(f"{path}.tolerations[{i}]")


@dataclass(frozen=True)
class KubeflowConfig:
    """Kubeflow Pipelines compilation and placement.

    Attributes:
      image: Default container image of every component.
      pipeline_root: Pipeline root URI on the cluster (e.g. gs://bucket/root).
      serving_dir: Push destination URI on the cluster.
      placements: Component id -> Placement.
      beam_args: Beam pipeline args for Beam-based components on the cluster.
      tfjob_timeout_seconds: Bound on the wait for a multi-worker TFJob.
      namespace: Kubernetes namespace of TFJobs.
    """

    image: str = "tfxkit:0.1.0"
    pipeline_root: str = ""
    serving_dir: str = ""
    placements: dict[str, Placement] = field(default_factory=dict)
    beam_args: tuple[str, ...] = ()
    tfjob_timeout_seconds: int = 3600
    namespace: str = "kubeflow"

    def validate(self, path: str) -> None:
        for name, placement in self.placements.items():
            placement.validate(f"{path}.placements.{name}")
        if self.tfjob_timeout_seconds < 1:
            _fail(f"{path}.tfjob_timeout_seconds", f"expected an integer >= 1, got {self.tfjob_timeout_seconds}")


@dataclass(frozen=True)
class PipelineConfig:
    """The whole pipeline.

    Attributes:
      name: Pipeline name (ML Metadata context, push sub-directory).
      data, transform, ingestion, strategy, train, teacher, student,
      distillation, evaluation, kubeflow: the sections above.
      beam_args: Beam pipeline args for local runs.
    """

    name: str = "tfxkit"
    data: DataConfig = field(default_factory=DataConfig)
    transform: TransformConfig = field(default_factory=TransformConfig)
    ingestion: IngestionConfig = field(default_factory=IngestionConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    teacher: ModelConfig = field(default_factory=ModelConfig)
    student: ModelConfig = field(default_factory=lambda: ModelConfig(hidden_units=(16,), embedding_dim=2))
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    kubeflow: KubeflowConfig = field(default_factory=KubeflowConfig)
    beam_args: tuple[str, ...] = ("--direct_running_mode=in_memory", "--direct_num_workers=1")

    def validate(self, path: str = "") -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", self.name):
            _fail(_join(path, "name"), f"expected letters, digits, '_' or '-', got {self.name!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if hasattr(value, "validate"):
                value.validate(_join(path, f.name))

    def to_json(self) -> str:
        return json.dumps(to_dict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PipelineConfig:
        return from_dict(json.loads(text))


# --------------------------------------------------------------------------- #
# Generic typed loading
# --------------------------------------------------------------------------- #


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return f"one of {list(typing.get_args(tp))}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"a mapping of {_describe(typing.get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}.get(
        tp, str(tp)
    )


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value not in typing.get_args(tp):
            _fail(path, f"expected {_describe(tp)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _convert(arg, value, path)
            except ConfigError:
                continue
        _fail(path, f"expected {_describe(tp)}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            _fail(path, f"expected {_describe(tp)}, got {value!r}")
        (item,) = typing.get_args(tp)[:1]
        return tuple(_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            _fail(path, f"expected {_describe(tp)}, got {value!r}")
        _, vt = typing.get_args(tp)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                _fail(path, f"expected string keys, got {k!r}")
            out[k] = _convert(vt, v, f"{path}.{k}")
        return out
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if tp is type(None):
        if value is not None:
            _fail(path, f"expected null, got {value!r}")
        return None
    if tp is bool:
        if not isinstance(value, bool):
            _fail(path, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            _fail(path, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            _fail(path, f"expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp!r} at {path}")


def _build(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        _fail(path or "config", f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        _fail(
            _join(path, str(unknown[0])),
            f"unknown key {unknown[0]!r}; allowed keys: {', '.join(sorted(fields))}",
        )
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], _join(path, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            _fail(_join(path, name), "required key is missing")
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Converts a config dataclass to plain JSON/YAML-serialisable data."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def from_dict(data: Any) -> PipelineConfig:
    """Builds and validates a `PipelineConfig` from plain data.

    Raises:
      ConfigError: naming the field path of the first invalid value.
    """
    config = _build(PipelineConfig, data, "")
    config.validate()
    return config


def resolve_config_path(name_or_path: str) -> Path:
    """Maps a shipped config name (`taxi`) or a YAML path to a file path."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if not candidate.is_file():
            raise ConfigError(f"config: file {name_or_path!r} does not exist")
        return candidate
    shipped = SHIPPED_CONFIG_DIR / f"{name_or_path}.yaml"
    if not shipped.is_file():
        names = sorted(p.stem for p in SHIPPED_CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(f"config: {name_or_path!r} is neither a YAML file nor a shipped config ({', '.join(names)})")
    return shipped


def load_config(name_or_path: str) -> PipelineConfig:
    """Loads and validates a config from a shipped name or a YAML file."""
    path = resolve_config_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"config: {path} is not valid YAML: {e}") from e
    return from_dict(data or {})


def from_custom_config(custom_config: str | dict | None) -> PipelineConfig | None:
    """Parses and validates the config a component carries in `custom_config`.

    Args:
      custom_config: The component's `custom_config` execution property (TFX
        passes it to executors as a JSON string) or the decoded dict.

    Returns:
      The validated config, or None when the component carries none (a stock
      user module without tfxkit config).
    """
    if isinstance(custom_config, str):
        custom_config = json.loads(custom_config) if custom_config else {}
    if not custom_config or CONFIG_KEY not in custom_config:
        return None
    return PipelineConfig.from_json(custom_config[CONFIG_KEY])
