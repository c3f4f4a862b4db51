"""The `train` section and the `teacher` / `student` model shapes, with the
parameter count known before any data is read."""

from __future__ import annotations

from dataclasses import field
from typing import Literal, Self

from pydantic import model_validator

from components.config.data import DataConfig, FeatureConfig
from components.config.validation import fail, section


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
      input_noise: Standard deviation of Gaussian noise added to every
        tabular float feature (float, no image shape) of each training
        example, in the transformed (z-scored) units (0: off): the input
        noise of a Noisy Student on tabular data. Needs such a feature.
    """

    translate: int = 0
    flip: bool = False
    mixup: float = 0.0
    input_noise: float = 0.0

    @property
    def image_views(self) -> bool:
        """Whether image-shaped features get random shifts or mirrors."""
        return bool(self.translate or self.flip)

    @property
    def enabled(self) -> bool:
        return self.image_views or bool(self.mixup) or bool(self.input_noise)

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
        if not self.input_noise >= 0:
            fail(
                "input_noise",
                f"expected a standard deviation >= 0 (0 turns it off), got {self.input_noise}",
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
      residual: The second and later convolutions of each block add their
        input to their output (`x + f(x)`, He et al. 2016): branches that
        the model's `stochastic_depth` can skip. Needs `convs_per_block >= 2`.
    """

    filters: tuple[int, ...] = (32, 64)
    kernel_size: int = 3
    convs_per_block: int = 1
    batch_norm: bool = True
    dropout: float = 0.0
    residual: bool = False

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
        if self.residual and self.convs_per_block < 2:
            fail(
                "residual",
                "residual branches are a block's second and later convolutions, and "
                f"convs_per_block is {self.convs_per_block}; set convs_per_block: 2 or more, or residual: false",
            )
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
      stochastic_depth: Stochastic depth (Huang et al. 2016), the noise of a
        Noisy Student's conv tower: in training each residual branch
        (`conv.residual`) is skipped for an example with this probability
        (and scaled by 1 / (1 - rate) when kept); never at evaluation or
        serving. Needs a conv tower with `residual: true`.
    """

    hidden_units: tuple[int, ...] = (64, 32)
    embedding_dim: int = 8
    dropout: float = 0.0
    conv: ConvTowerConfig | None = None
    stochastic_depth: float = 0.0

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
        if not 0.0 <= self.stochastic_depth < 1.0:
            fail("stochastic_depth", f"expected a number in [0, 1), got {self.stochastic_depth}")
        if self.stochastic_depth and (self.conv is None or not self.conv.residual):
            fail(
                "stochastic_depth",
                "stochastic depth skips the residual branches of a conv tower, and this model has "
                + ("no conv tower" if self.conv is None else "conv.residual: false")
                + "; give it conv with convs_per_block >= 2 and residual: true, or set stochastic_depth: 0",
            )
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
    """(trainable parameters, flattened output width) of `components.training.models.conv_tower`."""
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
    """Trainable parameters of `components.training.models.build_classifier` with every
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
