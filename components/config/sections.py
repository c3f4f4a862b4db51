"""The pipeline configuration: every section, its fields and its rules.

One `PipelineConfig` (nested frozen dataclasses) is loaded from YAML and
validated before anything runs (`components.config.loading`). It crosses into
TFX components once, as JSON under a single `custom_config` key
(`components.payload.CONFIG_KEY`), and executors parse it back on their first
line (`components.payload.decode`).

Every section is validated when it is constructed, `dataclasses.replace`
included. Every error is a `ConfigError` whose message starts with the dotted
path of the offending field (for example `train.learning_rate`) and says what
is expected.
"""

from __future__ import annotations

import json
import math
import re
import typing
from dataclasses import field
from typing import Literal, Self

from pydantic import model_validator

from components.config.secret_scan import reject_secrets
from components.config.validation import fail, section
from components.kubeflow.placement import TPU_TOPOLOGY_DIMS, accelerator_node_labels, is_tpu

BUILTIN_DATASETS = ("taxi", "digits", "fashion_mnist")
BUILTIN_FORMATS = {"taxi": "csv", "digits": "tfrecord", "fashion_mnist": "tfrecord"}

FeatureKind = Literal["float", "int_categorical", "string_categorical"]
FloatTransform = Literal["zscore", "bucketize", "identity"]
CategoricalTransform = Literal["vocabulary", "identity"]


# --------------------------------------------------------------------------- #
# Sections
# --------------------------------------------------------------------------- #


@section()
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
      shape: Image shape of a float feature, `[height, width, channels]`
        (e.g. `[28, 28, 1]`; the product must equal `size`): the values are
        row-major pixels, which a model's `conv` tower and
        `train.augmentation` treat as an image. Empty for plain vectors.
    """

    name: str
    kind: FeatureKind
    transform: str | None = None
    size: int = 1
    num_buckets: int = 0
    oov_buckets: int = 1
    top_k: int = 0
    fill_value: float | None = None
    shape: tuple[int, ...] = ()

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

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):
            fail("name", f"expected an identifier ([A-Za-z_][A-Za-z0-9_]*), got {self.name!r}")
        allowed = typing.get_args(FloatTransform if self.kind == "float" else CategoricalTransform)
        if self.transform is not None and self.transform not in allowed:
            fail(
                "transform",
                f"expected one of {list(allowed)} for kind {self.kind!r}, got {self.transform!r}",
            )
        if self.size < 1:
            fail("size", f"expected an integer >= 1, got {self.size}")
        t = self.effective_transform
        if t == "bucketize" and self.num_buckets < 2:
            fail(
                "num_buckets",
                f"expected an integer >= 2 for transform 'bucketize', got {self.num_buckets}",
            )
        if self.kind != "float" and t == "identity":
            if self.kind == "string_categorical":
                fail("transform", "'identity' needs integer values; use 'vocabulary' for strings")
            if self.num_buckets < 1:
                fail(
                    "num_buckets",
                    "expected the id range (>= 1) for an 'identity' integer categorical",
                )
        if t == "vocabulary" and self.oov_buckets < 1:
            fail(
                "oov_buckets",
                f"expected an integer >= 1 (unseen values need a bucket), got {self.oov_buckets}",
            )
        if self.top_k < 0:
            fail("top_k", f"expected an integer >= 0 (0 keeps all), got {self.top_k}")
        if self.kind != "float" and self.size != 1:
            fail("size", "categorical features must be scalars (size 1)")
        if self.shape:
            if self.kind != "float" or self.effective_transform == "bucketize":
                fail(
                    "shape",
                    f"an image shape needs a float feature with transform 'zscore' or 'identity', got kind {self.kind!r} with transform {self.effective_transform!r}",
                )
            if len(self.shape) != 3 or any(d < 1 for d in self.shape):
                fail(
                    "shape",
                    f"expected [height, width, channels] of positive integers, got {list(self.shape)}",
                )
            if math.prod(self.shape) != self.size:
                fail(
                    "shape",
                    f"{list(self.shape)} holds {math.prod(self.shape)} values but size is {self.size}; make size the product of the shape",
                )
        return self


@section("data.label")
class LabelConfig:
    """The classification target.

    Attributes:
      name: Column / feature key of the integer class label.
      num_classes: Number of classes; labels are ints in `[0, num_classes)`.
        Binary tasks use 2 (two-logit softmax form).
    """

    name: str = "label"
    num_classes: int = 2

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):
            fail("name", f"expected an identifier ([A-Za-z_][A-Za-z0-9_]*), got {self.name!r}")
        if self.num_classes < 2:
            fail("num_classes", f"expected an integer >= 2, got {self.num_classes}")
        return self


@section("data")
class DataConfig:
    """Where the raw data is and what it contains.

    Attributes:
      builtin: `taxi` or `digits` to use data that ships in installed packages,
        `fashion_mnist` for Fashion-MNIST from local IDX files (see
        `components.fashion_mnist`; its official test set is the eval split);
        empty to use `path`.
      path: A CSV / TFRecord file or a directory of them (user data).
      format: `csv` or `tfrecord` (of tf.Example).
      label: The label column.
      features: The model's input features; the label must not be one of them.
      exclude: Columns that must never become features (for example the
        raw source of the label). ExampleGen drops them, so no component
        sees them (statistics, schema, drift check, Transform, serving,
        Evaluator) and data without them is not a schema change.
      labeled_fraction: Fraction of the training split whose labels may be
        used (1: all). Below 1 the rest is an unlabeled transfer set: the
        teacher Trainers train on the labeled examples only, and the
        Distiller learns the teachers' soft targets on every example and
        the hard labels where they are kept (the few-labels, many-images
        case where distillation pays most). Which examples keep their label
        is decided by a fingerprint of their features, the same everywhere.
      train_buckets: Hash buckets of the train split (ExampleGen).
      eval_buckets: Hash buckets of the eval split. Both are unused for data
        that comes already split (`fashion_mnist`).
    """

    builtin: str = ""
    path: str = ""
    format: Literal["csv", "tfrecord"] = "csv"
    label: LabelConfig = field(default_factory=LabelConfig)
    features: tuple[FeatureConfig, ...] = ()
    exclude: tuple[str, ...] = ()
    labeled_fraction: float = 1.0
    train_buckets: int = 4
    eval_buckets: int = 1

    @model_validator(mode="after")
    def _check(self) -> Self:
        if bool(self.builtin) == bool(self.path):
            fail(
                "",
                f"set exactly one of 'builtin' ({', '.join(BUILTIN_DATASETS)}) or 'path' (your CSV/TFRecord files)",
            )
        if self.builtin and self.builtin not in BUILTIN_DATASETS:
            fail("builtin", f"expected one of {list(BUILTIN_DATASETS)}, got {self.builtin!r}")
        if self.builtin and self.format != BUILTIN_FORMATS[self.builtin]:
            fail(
                "format",
                f"built-in {self.builtin!r} is {BUILTIN_FORMATS[self.builtin]}; set format: {BUILTIN_FORMATS[self.builtin]}",
            )
        if not self.features:
            fail("features", "expected at least one feature")
        seen: set[str] = set()
        for i, feat in enumerate(self.features):
            if feat.name in seen:
                fail(f"features[{i}].name", f"duplicate feature {feat.name!r}")
            seen.add(feat.name)
            if feat.name == self.label.name:
                fail(
                    f"features[{i}].name",
                    f"{feat.name!r} is the label; a label cannot also be a feature",
                )
            if self.format == "csv" and feat.size != 1:
                fail(
                    f"features[{i}].size",
                    f"feature {feat.name!r}: a CSV cell holds one value, so a CSV feature has size 1, got {feat.size} "
                    "(vector features need format: tfrecord)",
                )
            if feat.name in self.exclude:
                fail(
                    f"features[{i}].name",
                    f"{feat.name!r} is listed in data.exclude (it leaks the label)",
                )
        if self.label.name in self.exclude:
            fail("exclude", f"the label {self.label.name!r} cannot be excluded")
        if not 0.0 < self.labeled_fraction <= 1.0:
            fail(
                "labeled_fraction",
                f"expected a number in (0, 1] (1 uses every label), got {self.labeled_fraction}",
            )
        for name in ("train_buckets", "eval_buckets"):
            if getattr(self, name) < 1:
                fail(name, f"expected an integer >= 1, got {getattr(self, name)}")
        return self


@section("transform")
class TransformConfig:
    """How Transform writes its output (recorded for the Trainer in `tfxkit_layout.json`).

    Attributes:
      num_shards: Output files per split; 0 picks a default sized for parallel
        reads and per-worker file sharding: at least 8 and at least
        2 x `strategy.workers`, a multiple of the workers.
      compression: `gzip` (TFX's default, `.gz` files) or `none`
        (`.tfrecord` files: faster to read, larger on disk).
      pack_features: Write every dense numeric transformed feature (label
        included) as one fixed-length float32 vector per example, so parsing
        costs one feature. Integer ids must stay below 2^24 (exact in float32;
        the Transform fails naming the feature otherwise). Stock TFX readers
        (`data_accessor`) cannot unpack it: keep it off for user `run_fn`s.
    """

    num_shards: int = 0
    compression: Literal["gzip", "none"] = "gzip"
    pack_features: bool = False

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.num_shards < 0:
            fail("num_shards", f"expected an integer >= 0 (0 = automatic), got {self.num_shards}")
        return self


@section("ingestion")
class IngestionConfig:
    """The Trainer's tf.data input pipeline.

    Attributes:
      batch_size: Global batch size (split across replicas).
      eval_batch_size: Global batch size for evaluation.
      shuffle_buffer: Examples mixed together when training (0 disables
        shuffling): files are reshuffled every epoch, parsed batches are
        shuffled in a buffer of about this many examples and examples are
        permuted within windows of this many.
      cache: `none`, `memory`, or `file` (under the model run directory): keep
        the parsed training data after the first epoch, so later epochs skip
        reading and parsing. Needs the (packed) data to fit in memory / disk.
      num_parallel_reads: Files read concurrently (0 = autotune).
      num_parallel_calls: Parallel parse calls (0 = autotune).
      prefetch: Batches prefetched (0 = autotune).
      deterministic: Keep element order reproducible across runs (slower);
        without shuffling, every epoch then has the same order.
    """

    batch_size: int = 256
    eval_batch_size: int = 256
    shuffle_buffer: int = 10000
    cache: Literal["none", "memory", "file"] = "none"
    num_parallel_reads: int = 0
    num_parallel_calls: int = 0
    prefetch: int = 0
    deterministic: bool = False

    @model_validator(mode="after")
    def _check(self) -> Self:
        for name in ("batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                fail(name, f"expected an integer >= 1, got {getattr(self, name)}")
        for name in ("shuffle_buffer", "num_parallel_reads", "num_parallel_calls", "prefetch"):
            if getattr(self, name) < 0:
                fail(name, f"expected an integer >= 0, got {getattr(self, name)}")
        return self


StrategyKind = Literal[
    "auto",
    "one_device",
    "mirrored",
    "multi_worker_mirrored",
    "parameter_server",
    "central_storage",
    "tpu",
]


# Strategies that use every accelerator their task sees: `num_gpus` cannot select among them.
WHOLE_TASK_KINDS = ("multi_worker_mirrored", "parameter_server", "tpu")


def whole_task_gpus_message(kind: str, num_gpus: int) -> str:
    return (
        f"kind {kind!r} uses every accelerator its task sees, so num_gpus {num_gpus} would be ignored; "
        "set num_gpus: 0 and size each replica with the Kubeflow placement's accelerator_count "
        "(or CUDA_VISIBLE_DEVICES)"
    )


@section("strategy")
class StrategyConfig:
    """Which tf.distribute strategy the Trainer uses.

    Attributes:
      kind: One of `auto`, `one_device`, `mirrored`, `multi_worker_mirrored`,
        `parameter_server`, `central_storage`, `tpu` (see
        `components.strategies` for what `auto` picks).
      num_gpus: GPUs to use on this machine under `mirrored` and
        `central_storage` (0: every visible GPU; `one_device` takes at most 1);
        more than are visible fails before training. Multi-worker,
        parameter-server and TPU strategies use every accelerator their task
        sees (size them with the Kubeflow placement's `accelerator_count`), so
        they refuse a non-zero value, also when `auto` resolves to them.
      num_cpu_devices: Logical CPU devices to create when there is no GPU
        (lets `mirrored` run on CPU; 0 keeps TensorFlow's default of one).
      communication: Collective implementation, `auto`, `ring` or `nccl`
        (multi-worker all-reduce; `nccl` also selects NCCL for `mirrored`).
      all_reduce_pack_bytes: Pack small gradients into chunks of this size
        for the multi-worker all-reduce (0: TensorFlow's default).
      tpu: TPU name or address for `TPUClusterResolver` ('' = local / env).
      workers: Expected worker replicas (used to size shards and TFJobs).
      parameter_servers: Expected parameter-server replicas.
      steps_per_execution: Steps per `tf.function` call (fewer round trips;
        matters most for parameter server and TPU). Backups are counted in
        steps regardless.
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

    @model_validator(mode="after")
    def _check(self) -> Self:
        for name in ("num_gpus", "num_cpu_devices", "all_reduce_pack_bytes", "parameter_servers"):
            if getattr(self, name) < 0:
                fail(name, f"expected an integer >= 0, got {getattr(self, name)}")
        for name in ("workers", "steps_per_execution"):
            if getattr(self, name) < 1:
                fail(name, f"expected an integer >= 1, got {getattr(self, name)}")
        if self.kind == "parameter_server" and self.parameter_servers < 1 and self.workers > 1:
            fail("parameter_servers", "expected >= 1 parameter server for kind 'parameter_server'")
        if self.kind == "one_device" and self.num_gpus > 1:
            fail(
                "num_gpus",
                f"kind 'one_device' uses one device, got num_gpus {self.num_gpus}; use kind 'mirrored' for several GPUs",
            )
        if self.kind in WHOLE_TASK_KINDS and self.num_gpus:
            fail("num_gpus", whole_task_gpus_message(self.kind, self.num_gpus))
        if self.kind == "tpu" and self.communication == "nccl":
            fail(
                "communication", "'nccl' is for GPUs; TPUs have their own interconnect (use 'auto')"
            )
        return self


@section("train.augmentation")
class AugmentationConfig:
    """Random views of the training batches, in the input pipeline (evaluation data never).

    Applied before the model, so in distillation the teachers and the
    student see the same batch ("function matching", Beyer et al. 2022):
    the teachers' soft targets are computed on the views and mixes.

    Attributes:
      translate: Largest random shift in pixels along each axis of the
        image-shaped features (`shape` set; 0: off); pixels shifted in take
        the image's darkest value (its background).
      flip: Mirror each image left-right with probability 1/2 (right for
        clothing or scenes, wrong for digits or text).
      mixup: Mixup (Zhang et al. 2018): alpha of the Beta(alpha, alpha)
        distribution of the mixing weight (0: off; 0.2 to 0.4 is usual).
        After the image views, each training example i draws its own weight
        lam_i and a partner p(i) from a random permutation of the batch, and
        every float (dense) transformed feature, images included, becomes
        `lam_i * x_i + (1 - lam_i) * x_p(i)`; categorical (integer id)
        features keep the example's own value. The hard-label loss becomes
        `lam_i * CE(y_i) + (1 - lam_i) * CE(y_p(i))`, where a label the
        example lacks (`data.labeled_fraction`) contributes nothing (its
        share is not moved to the other label); labels stay integer class
        ids. Needs at least one float feature.
    """

    translate: int = 0
    flip: bool = False
    mixup: float = 0.0

    @property
    def image_views(self) -> bool:
        """Whether image-shaped features get random shifts or mirrors."""
        return bool(self.translate or self.flip)

    @property
    def enabled(self) -> bool:
        return self.image_views or bool(self.mixup)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.translate < 0:
            fail(
                "translate", f"expected an integer >= 0 (0 disables shifting), got {self.translate}"
            )
        if not self.mixup >= 0:
            fail(
                "mixup",
                f"expected a number >= 0, the alpha of Beta(alpha, alpha) (0 turns mixup off; "
                f"0.2 to 0.4 is usual), got {self.mixup}",
            )
        return self


@section("train")
class TrainConfig:
    """Optimisation settings shared by the teacher and the student.

    Attributes:
      train_steps: Optimizer steps.
      eval_steps: Evaluation batches after training.
      steps_per_epoch: Steps between Keras epoch boundaries (callbacks, logs).
      learning_rate: Adam learning rate (the peak, with a schedule).
      lr_schedule: `constant`, or `cosine`: linear warm-up from 0 over
        `warmup_steps`, then cosine decay to 0 at the last step (of the
        teacher's `train_steps`, or the student's
        `distillation.student_train_steps`).
      warmup_steps: Warm-up steps of the `cosine` schedule.
      mixed_precision: `none`, `mixed_float16` (GPU) or `mixed_bfloat16`
        (TPU / CPU).
      grad_accum_steps: Micro-batches per optimizer update (1 = off); each
        micro-batch holds `ingestion.batch_size` examples, so an update sees
        `grad_accum_steps * batch_size`, and `train_steps` counts updates.
      checkpoint_every_steps: `BackupAndRestore` save frequency in steps (a
        killed Trainer resumes from the last one; under `parameter_server`
        epochs are shortened to it, as Keras backs up at epoch ends there).
      seed: Random seed for initialisation and shuffling.
      augmentation: Random views (image shifts and mirrors, mixup) of the
        training batches (see `AugmentationConfig`); in distillation the
        teachers and the student see the same augmented batch.
      gradient_checkpointing: Recompute each conv block's activations in the
        backward pass (`tf.recompute_grad`) instead of keeping them, so a
        larger conv model or batch fits in accelerator memory, at the cost
        of about one more forward pass per step. Same gradients; applies to
        `conv` towers (models without one are unaffected).
    """

    train_steps: int = 1000
    eval_steps: int = 50
    steps_per_epoch: int = 100
    learning_rate: float = 1e-3
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    mixed_precision: Literal["none", "mixed_float16", "mixed_bfloat16"] = "none"
    grad_accum_steps: int = 1
    checkpoint_every_steps: int = 100
    seed: int = 42
    augmentation: AugmentationConfig = field(default_factory=lambda: AugmentationConfig())
    gradient_checkpointing: bool = False

    @model_validator(mode="after")
    def _check(self) -> Self:
        for name in ("train_steps", "eval_steps", "steps_per_epoch", "checkpoint_every_steps"):
            if getattr(self, name) < 1:
                fail(name, f"expected an integer >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            fail("learning_rate", f"expected a number > 0, got {self.learning_rate}")
        if self.grad_accum_steps < 1:
            fail(
                "grad_accum_steps",
                f"expected an integer >= 1 (1 disables accumulation), got {self.grad_accum_steps}",
            )
        if self.warmup_steps < 0:
            fail("warmup_steps", f"expected an integer >= 0, got {self.warmup_steps}")
        if self.warmup_steps and self.lr_schedule != "cosine":
            fail(
                "warmup_steps",
                "warm-up belongs to the 'cosine' schedule; set lr_schedule: cosine or warmup_steps: 0",
            )
        if self.warmup_steps >= self.train_steps:
            fail(
                "warmup_steps",
                f"expected fewer warm-up steps than train_steps ({self.train_steps}), got {self.warmup_steps}",
            )
        return self


@section()
class ConvTowerConfig:
    """A convolutional tower over each image-shaped feature (`shape` set).

    Each entry of `filters` is one block: `convs_per_block` x (Conv2D
    `kernel_size`, same padding -> batch norm if `batch_norm` -> ReLU), then
    2x2 max pooling and `dropout`. The tower's output is flattened and joins
    the other features before the hidden layers.

    Attributes:
      filters: Filters of each block (e.g. `[32, 64]`).
      kernel_size: Square kernel size of every convolution.
      convs_per_block: Convolutions per block before its pooling.
      batch_norm: Batch normalisation after each convolution.
      dropout: Dropout rate after each block's pooling.
    """

    filters: tuple[int, ...] = (32, 64)
    kernel_size: int = 3
    convs_per_block: int = 1
    batch_norm: bool = True
    dropout: float = 0.0

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.filters:
            fail("filters", "expected at least one block's filter count")
        for i, f in enumerate(self.filters):
            if f < 1:
                fail(f"filters[{i}]", f"expected an integer >= 1, got {f}")
        if self.kernel_size < 1:
            fail("kernel_size", f"expected an integer >= 1, got {self.kernel_size}")
        if self.convs_per_block < 1:
            fail("convs_per_block", f"expected an integer >= 1, got {self.convs_per_block}")
        if not 0.0 <= self.dropout < 1.0:
            fail("dropout", f"expected a number in [0, 1), got {self.dropout}")
        return self


@section()
class ModelConfig:
    """Shape of a classifier over the transformed features.

    Attributes:
      hidden_units: Width of each hidden layer.
      embedding_dim: Embedding width for categorical features.
      dropout: Dropout rate after each hidden layer.
      conv: A convolutional tower for image-shaped features (null: they
        enter the hidden layers as flat vectors, an MLP).
    """

    hidden_units: tuple[int, ...] = (64, 32)
    embedding_dim: int = 8
    dropout: float = 0.0
    conv: ConvTowerConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.hidden_units:
            fail("hidden_units", "expected at least one hidden layer width")
        for i, w in enumerate(self.hidden_units):
            if w < 1:
                fail(f"hidden_units[{i}]", f"expected an integer >= 1, got {w}")
        if self.embedding_dim < 1:
            fail("embedding_dim", f"expected an integer >= 1, got {self.embedding_dim}")
        if not 0.0 <= self.dropout < 1.0:
            fail("dropout", f"expected a number in [0, 1), got {self.dropout}")
        return self


def min_ids(feature: FeatureConfig) -> int:
    """The fewest ids a categorical transformed feature can take (its vocabulary may add more)."""
    t = feature.effective_transform
    if t == "bucketize":
        return feature.num_buckets
    if t == "identity":
        return feature.num_buckets + 1
    return feature.oov_buckets


def _conv_params(shape: tuple[int, ...], conv: ConvTowerConfig) -> tuple[int, int]:
    """(trainable parameters, flattened output width) of `components.models.conv_tower`."""
    height, width, channels = shape
    params = 0
    for filters in conv.filters:
        for _ in range(conv.convs_per_block):
            kernel = conv.kernel_size * conv.kernel_size * channels * filters
            # With batch norm: no bias, and a trainable scale and shift per filter.
            params += kernel + (2 * filters if conv.batch_norm else filters)
            channels = filters
        if min(height, width) >= 2:
            height, width = height // 2, width // 2
    return params, height * width * channels


def min_trainable_params(data: DataConfig, model: ModelConfig) -> int:
    """Trainable parameters of `components.models.build_classifier` with every
    categorical at its fewest ids (`min_ids`): a lower bound known before any data is read."""
    params, width = 0, 0
    for feature in data.features:
        if feature.is_categorical:
            params += min_ids(feature) * model.embedding_dim
            width += model.embedding_dim
        elif feature.shape and model.conv is not None:
            conv_params, conv_width = _conv_params(feature.shape, model.conv)
            params += conv_params
            width += conv_width
        else:
            width += feature.size
    for units in (*model.hidden_units, data.label.num_classes):
        params += width * units + units
        width = units
    return params


# Teacher inputs of the Distiller component (one named input each).
MAX_TEACHERS = 8


@section("distillation")
class DistillationConfig:
    """Teacher-then-student distillation (see `components.distillation`).

    Attributes:
      enabled: Add the distillation stage after the teacher Trainer: the
        Distiller trains the `student` shape on the teachers' soft targets,
        and the Evaluator gates it against the first teacher.
      student_train_steps: Optimizer steps of the student (0: `train.train_steps`).
        A student learning to match its teachers keeps improving long
        after a model on hard labels would have converged (Beyer et al.
        2022), so a patient schedule gives it more steps than the teacher.
      alpha: Weight of the soft-target loss; `1 - alpha` weighs the hard loss
        (cross-entropy at T = 1).
      temperature: Softmax temperature T of the soft targets (the soft loss
        is scaled by T^2).
      num_teachers: Teacher Trainers (seeds `train.seed + i`) whose soft
        targets are averaged; at most `MAX_TEACHERS`.
      teacher_weights: Optional weights of the teachers (normalised).
      cache_teacher_logits: Keep each distinct example's teacher soft
        targets in memory instead of running the teachers at every step
        (exact: teachers are frozen; not with the parameter-server strategy).
      require_compression: Reject, before training, a student with as many
        parameters as a teacher or more.
      scratch_baseline: Also train the `student` shape alone, on hard labels
        only, with the student's steps, schedule and augmentation (the
        `StudentBaseline` Trainer), so that the run's report shows whether
        distillation paid: the distilled student against the same student
        trained without a teacher.
    """

    enabled: bool = False
    student_train_steps: int = 0
    alpha: float = 0.9
    temperature: float = 4.0
    num_teachers: int = 1
    teacher_weights: tuple[float, ...] = ()
    cache_teacher_logits: bool = False
    require_compression: bool = True
    scratch_baseline: bool = False

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.student_train_steps < 0:
            fail(
                "student_train_steps",
                f"expected an integer >= 0 (0: train.train_steps), got {self.student_train_steps}",
            )
        if not 0.0 <= self.alpha <= 1.0:
            fail("alpha", f"expected a number in [0, 1], got {self.alpha}")
        if not self.temperature > 0:
            fail("temperature", f"expected a number > 0, got {self.temperature}")
        if not 1 <= self.num_teachers <= MAX_TEACHERS:
            fail(
                "num_teachers",
                f"expected an integer in [1, {MAX_TEACHERS}], got {self.num_teachers}",
            )
        if self.teacher_weights:
            if len(self.teacher_weights) != self.num_teachers:
                fail(
                    "teacher_weights",
                    f"expected {self.num_teachers} weights (one per teacher), got {len(self.teacher_weights)}",
                )
            if any(w < 0 for w in self.teacher_weights) or sum(self.teacher_weights) <= 0:
                fail("teacher_weights", "expected non-negative weights with a positive sum")
        return self


@section("evaluation")
class EvaluationConfig:
    """Evaluator (TFMA) gates.

    Attributes:
      min_accuracy: Value threshold: the candidate must reach this accuracy.
      max_accuracy_drop: Change threshold for the student against the
        teacher baseline: accuracy may drop at most this much (absolute).
    """

    min_accuracy: float = 0.5
    max_accuracy_drop: float = 0.05

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not 0.0 <= self.min_accuracy <= 1.0:
            fail("min_accuracy", f"expected a number in [0, 1], got {self.min_accuracy}")
        if not 0.0 <= self.max_accuracy_drop <= 1.0:
            fail("max_accuracy_drop", f"expected a number in [0, 1], got {self.max_accuracy_drop}")
        return self


@section()
class Toleration:
    """A Kubernetes toleration."""

    key: str
    operator: Literal["Equal", "Exists"] = "Exists"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.key:
            fail("key", "expected a non-empty toleration key")
        if self.operator == "Exists" and self.value:
            fail("value", "operator 'Exists' takes no value; use operator 'Equal'")
        return self


@section()
class Placement:
    """Where and with what one component runs on Kubernetes.

    Attributes:
      image: Container image ('' = `kubeflow.image`).
      cpu_request / cpu_limit: CPU as a Kubernetes quantity ('4', '500m').
      memory_request / memory_limit: Memory quantity ('16Gi').
      accelerator_type: e.g. `nvidia-l4`, `nvidia-tesla-a100`, `tpu-v5-lite-podslice`.
      accelerator_count: Accelerators per replica.
      tpu_topology: TPU slice topology such as `2x4` (TPU only).
      node_selector: Node labels the pod requires. The GKE accelerator
        labels (`cloud.google.com/gke-accelerator`,
        `cloud.google.com/gke-tpu-accelerator`, `cloud.google.com/gke-tpu-topology`)
        are derived from the accelerator fields and need not be repeated.
      tolerations: Taints the pod tolerates.
      beam_args: Extra Beam pipeline args for this component only (Beam-based
        components such as Transform and StatisticsGen), appended to
        `kubeflow.beam_args`, e.g. to run it on Dataflow.
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
    beam_args: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> Self:
        for name in ("cpu_request", "cpu_limit"):
            value = getattr(self, name)
            if value and not re.fullmatch(r"([0-9]*[.])?[0-9]+m?", value):
                fail(name, f"expected a CPU quantity such as '4', '0.5' or '500m', got {value!r}")
        for name in ("memory_request", "memory_limit"):
            value = getattr(self, name)
            if value and not re.fullmatch(r"[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?", value):
                fail(name, f"expected a memory quantity such as '16Gi' or '512Mi', got {value!r}")
        if self.accelerator_count < 0:
            fail("accelerator_count", f"expected an integer >= 0, got {self.accelerator_count}")
        if self.accelerator_count and not self.accelerator_type:
            fail(
                "accelerator_type",
                "accelerator_count is set but accelerator_type is empty; name the accelerator (e.g. nvidia-l4)",
            )
        if self.accelerator_type:
            self._check_accelerator()
        elif self.tpu_topology:
            fail(
                "tpu_topology",
                "tpu_topology is set but accelerator_type is empty; name the TPU (e.g. tpu-v5-lite-podslice)",
            )
        if self.tolerations and not self.node_selector and not self.accelerator_type:
            fail(
                "",
                "the tolerations let the pod onto a tainted node pool, but neither node_selector nor "
                "accelerator_type selects a pool; add node_selector (e.g. cloud.google.com/gke-nodepool: <pool>) "
                "or accelerator_type",
            )
        for key, value in self.node_selector.items():
            if not key or not value:
                fail(
                    "node_selector",
                    f"expected non-empty label keys and values, got {key!r}: {value!r}",
                )
        return self

    def _check_accelerator(self) -> None:
        kind = self.accelerator_type
        if self.accelerator_count < 1:
            fail(
                "accelerator_count",
                f"expected an integer >= 1 with accelerator_type {kind!r}, got {self.accelerator_count}",
            )
        if not is_tpu(kind):
            if not kind.startswith("nvidia-"):
                fail(
                    "accelerator_type",
                    f"expected a GKE accelerator name: nvidia-* for GPUs (e.g. nvidia-l4) or one of {sorted(TPU_TOPOLOGY_DIMS)}, got {kind!r}",
                )
            if self.tpu_topology:
                fail(
                    "tpu_topology",
                    f"tpu_topology is for TPU accelerators only, but accelerator_type is the GPU {kind!r}",
                )
        else:
            if kind not in TPU_TOPOLOGY_DIMS:
                fail(
                    "accelerator_type",
                    f"unknown TPU {kind!r}; expected one of {sorted(TPU_TOPOLOGY_DIMS)}",
                )
            dims = TPU_TOPOLOGY_DIMS[kind]
            example = "2x4" if dims == 2 else "2x2x2"
            if not self.tpu_topology:
                fail(
                    "tpu_topology",
                    f"a TPU slice needs its topology (GKE schedules {kind} by it), e.g. {example!r}",
                )
            if not re.fullmatch(r"[1-9][0-9]*(x[1-9][0-9]*)*", self.tpu_topology):
                fail(
                    "tpu_topology",
                    f"expected a topology such as {example!r}, got {self.tpu_topology!r}",
                )
            sizes = [int(s) for s in self.tpu_topology.split("x")]
            if len(sizes) != dims:
                fail(
                    "tpu_topology",
                    f"{self.tpu_topology!r} does not match {kind}: its slices have a {dims}-D topology (e.g. {example!r})",
                )
            chips = math.prod(sizes)
            if self.accelerator_count > chips or chips % self.accelerator_count:
                fail(
                    "accelerator_count",
                    f"{self.accelerator_count} chips per pod does not divide the {chips} chips of topology {self.tpu_topology!r}",
                )
        derived = accelerator_node_labels(kind, self.tpu_topology)
        for key, value in self.node_selector.items():
            if key in derived and value != derived[key]:
                fail(
                    f"node_selector.{key}",
                    f"{value!r} contradicts the accelerator fields, which select {derived[key]!r}; drop the label",
                )


def _check_not_empty(placement: Placement, path: str) -> None:
    # `Placement()` itself is valid: it is what a component without an entry gets.
    if placement == Placement():
        fail(
            path,
            "empty placement: it names no node pool (node_selector or accelerator_type) and no image or resources; "
            "fill it in or remove the entry",
        )


@section("kubeflow")
class KubeflowConfig:
    """Kubeflow Pipelines compilation and placement.

    Attributes:
      image: Default container image of every component.
      pipeline_root: Pipeline root URI on the cluster (e.g. gs://bucket/root);
        every pod (and every TFJob replica) reads and writes artifacts there.
      serving_dir: Push destination URI on the cluster.
      data_uri: Directory URI of the input files on the cluster (all files in
        it are ExampleGen's input). Required for built-in data, which lives
        on the machine that compiles; defaults to `data.path` otherwise.
      placements: Component id -> Placement. When the Trainer (or the
        Distiller) trains across pods (strategy `multi_worker_mirrored` or
        `parameter_server` with more than one replica) its placement applies
        to the training job's workers (and, for `tfjob`, its chief); the
        pipeline step that submits and watches the job keeps only the image
        and runs on the default pool. Every job replica without CPU or
        memory in its placement requests 1 CPU and 2Gi.
      beam_args: Beam pipeline args for Beam-based components on the cluster.
      job_backend: What runs multi-pod training: `trainjob` (Kubeflow Trainer
        v2 `TrainJob` on the runtime `trainjob_runtime`; the product derives
        each replica's `TF_CONFIG`) or `tfjob` (the end-of-life Training
        Operator v1 `TFJob`, for clusters that still run it).
      trainjob_runtime: Name of the TensorFlow training runtime TrainJobs
        reference ('' = the shipped `tfxkit-tensorflow-multi-worker` or
        `tfxkit-tensorflow-parameter-server`, by strategy kind).
      trainjob_runtime_kind: `ClusterTrainingRuntime` (cluster-wide) or
        `TrainingRuntime` (in the job's namespace).
      tfjob_timeout_seconds: Bound on the wait for a multi-worker training job
        of either backend (also its `activeDeadlineSeconds`); the job is
        deleted when it passes.
      tfjob_backoff_limit: Replica restarts the TFJob allows (preempted
        replicas resume from their `BackupAndRestore` checkpoint); for
        `trainjob` the runtime's `failurePolicy.maxRestarts` holds it.
      tfjob_ps_placement: Placement of parameter-server replicas, either
        backend (default: the default node pool with the Trainer's image).
      tfjob_service_account: Service account of training-job replicas, either
        backend ('' = the namespace default); it needs access to
        `pipeline_root`.
      namespace: Kubernetes namespace of training jobs ('' = the namespace of
        the pipeline step's pod).
    """

    image: str = "tfxkit:0.1.0"
    pipeline_root: str = ""
    serving_dir: str = ""
    data_uri: str = ""
    placements: dict[str, Placement] = field(default_factory=dict)
    beam_args: tuple[str, ...] = ()
    job_backend: Literal["trainjob", "tfjob"] = "trainjob"
    trainjob_runtime: str = ""
    trainjob_runtime_kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = (
        "ClusterTrainingRuntime"
    )
    tfjob_timeout_seconds: int = 3600
    tfjob_backoff_limit: int = 3
    tfjob_ps_placement: Placement | None = None
    tfjob_service_account: str = ""
    namespace: str = ""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.image:
            fail(
                "image",
                "expected the default container image (e.g. us-docker.pkg.dev/<project>/tfxkit/tfxkit:0.1.0)",
            )
        for name, placement in self.placements.items():
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                fail(
                    f"placements.{name}", "expected a component id (letters, digits, '_', '.', '-')"
                )
            _check_not_empty(placement, f"placements.{name}")
        if self.tfjob_ps_placement is not None:
            _check_not_empty(self.tfjob_ps_placement, "tfjob_ps_placement")
            if self.tfjob_ps_placement.beam_args:
                fail(
                    "tfjob_ps_placement.beam_args",
                    "parameter servers run no Beam pipeline; remove beam_args",
                )
        if self.tfjob_timeout_seconds < 1:
            fail(
                "tfjob_timeout_seconds",
                f"expected an integer >= 1, got {self.tfjob_timeout_seconds}",
            )
        if self.tfjob_backoff_limit < 0:
            fail("tfjob_backoff_limit", f"expected an integer >= 0, got {self.tfjob_backoff_limit}")
        if self.trainjob_runtime and not (
            len(self.trainjob_runtime) <= 253
            and re.fullmatch(
                r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
                self.trainjob_runtime,
            )
        ):
            fail(
                "trainjob_runtime",
                "expected a Kubernetes object name (lowercase letters, digits, '-' and '.', starting and "
                f"ending with a letter or digit, at most 253), got {self.trainjob_runtime!r}; "
                "'' picks the shipped runtime",
            )
        if self.tfjob_service_account and not re.fullmatch(
            r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
            self.tfjob_service_account,
        ):
            fail(
                "tfjob_service_account",
                f"expected a Kubernetes service account name, got {self.tfjob_service_account!r}",
            )
        if self.namespace and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", self.namespace):
            fail(
                "namespace",
                f"expected a Kubernetes namespace name (lowercase letters, digits, '-'), got {self.namespace!r}",
            )
        return self


@section()
class PipelineConfig:
    """The whole pipeline.

    Attributes:
      name: Pipeline name (ML Metadata context, push sub-directory).
      data, transform, ingestion, strategy, train, teacher, student,
      distillation, evaluation, kubeflow: the sections above.
      beam_args: Beam pipeline args for local runs. Empty (the default):
        Beam's DirectRunner defaults, in memory on one worker; TFX then
        also skips building a source package of itself for Beam to stage,
        which only remote runners need (about 1.3 s per Beam component).
    """

    name: str = "tfxkit"
    data: DataConfig = field(default_factory=DataConfig)
    transform: TransformConfig = field(default_factory=TransformConfig)
    ingestion: IngestionConfig = field(default_factory=IngestionConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    teacher: ModelConfig = field(default_factory=ModelConfig)
    student: ModelConfig = field(
        default_factory=lambda: ModelConfig(hidden_units=(16,), embedding_dim=2)
    )
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    kubeflow: KubeflowConfig = field(default_factory=KubeflowConfig)
    beam_args: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", self.name):
            fail("name", f"expected letters, digits, '_' or '-', got {self.name!r}")
        images = [f.name for f in self.data.features if f.shape]
        for role in ("teacher", "student"):
            if getattr(self, role).conv is not None and not images:
                fail(
                    f"{role}.conv",
                    "a conv tower needs an image-shaped feature: give a float feature a shape such as [28, 28, 1]",
                )
        student_steps = self.student_train_steps()
        if self.distillation.enabled and self.train.warmup_steps >= student_steps:
            fail(
                "distillation.student_train_steps",
                f"expected more steps than train.warmup_steps ({self.train.warmup_steps}), got {student_steps}",
            )
        if self.train.augmentation.enabled and self.distillation.cache_teacher_logits:
            fail(
                "distillation.cache_teacher_logits",
                "the cache keys soft targets by example, and with train.augmentation every view is a new "
                "example (the cache would grow without bound and never hit); turn one of them off",
            )
        if self.train.augmentation.image_views and not images:
            fail(
                "train.augmentation",
                "augmentation shifts and flips images: no feature has a shape (e.g. [28, 28, 1]); turn it off or declare the shape",
            )
        if self.train.augmentation.mixup and all(f.is_categorical for f in self.data.features):
            fail(
                "train.augmentation.mixup",
                "mixup mixes float (dense) features, and every feature is categorical "
                "(integer ids, bucketized floats included); set mixup: 0",
            )
        if self.distillation.enabled and self.distillation.require_compression:
            self._check_student_is_smaller()
        reject_secrets(self)
        return self

    def _check_student_is_smaller(self) -> None:
        # Both models embed the same categoricals; vocabularies only add
        # `embedding_dim` parameters per id. With the student's embeddings at
        # least as wide, a student no smaller at the fewest ids is no smaller
        # for any data. Other cases depend on the vocabularies: the Distiller
        # checks them with the real sizes before training.
        student = min_trainable_params(self.data, self.student)
        teacher = min_trainable_params(self.data, self.teacher)
        if self.student.embedding_dim >= self.teacher.embedding_dim and student >= teacher:
            fail(
                "student",
                f"the student has at least {student} trainable parameters, not fewer than the teacher's {teacher} "
                "(whatever the vocabulary sizes), and distillation.require_compression is true; shrink "
                "student.hidden_units / student.embedding_dim or set distillation.require_compression: false",
            )

    def student_train_steps(self) -> int:
        """Optimizer steps of the student: `distillation.student_train_steps`, else `train.train_steps`.

        The Distiller, the scratch baseline (the student's shape trained alone
        for the same steps) and the config's own checks all read it here.
        """
        return self.distillation.student_train_steps or self.train.train_steps

    def transform_view(self) -> PipelineConfig:
        """This config with only what Transform reads; every other section at its default.

        Transform reads `data`, `transform` and `strategy` (the worker count
        sets the shard count). The rest is reset so that it does not enter
        Transform's execution properties: changing, say, `train.train_steps`
        re-runs the Trainer and reuses the cached Transform output.
        """
        return type(self)(
            name=self.name,
            data=self.data,
            transform=self.transform,
            strategy=self.strategy,
        )

    def to_json(self) -> str:
        """The config as JSON (sorted keys), as it travels in `custom_config`."""
        return json.dumps(_loading().to_dict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PipelineConfig:
        """Parses and validates the JSON of `to_json`."""
        return _loading().from_dict(json.loads(text))


def _loading():
    # The loader builds a TypeAdapter over these classes, so it imports this module, not the reverse.
    from components.config import loading

    return loading
