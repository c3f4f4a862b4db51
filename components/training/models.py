"""Teacher / student classifiers built from the feature config (no TFX types).

`build_classifier` embeds categorical features and feeds everything through an MLP (after
a `conv_tower` over image features) to float32 logits; `precision_policy`,
`accumulate_gradients` and `GradientAccumulationMixin` provide mixed precision and
gradient accumulation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf
import tf_keras as keras

from components.config import ConvTowerConfig, DataConfig, ModelConfig
from components.data import augment

LOGITS_LAYER = "logits"


def build_classifier(
    data: DataConfig,
    model: ModelConfig,
    cardinalities: dict[str, int],
    name: str,
    recompute: bool = False,
) -> keras.Model:
    """Builds an uncompiled classifier over the transformed features.

    Args:
      data: The `data` config section (features and label).
      model: Hidden widths, embedding size, dropout.
      cardinalities: Number of ids of each categorical feature, keyed by the
        raw feature name (see `preprocessing.num_ids`).
      name: Keras model name (`teacher`, `student`).
      recompute: Gradient checkpointing (`train.gradient_checkpointing`): each
        conv block keeps only its input for the backward pass and recomputes
        its activations there (`CheckpointedConvBlock`).

    Returns:
      A `keras.Model` taking a dict keyed by transformed feature names and
      returning float32 logits of shape `[batch, num_classes]`. Image-shaped
      features (`shape` set) go through `conv_tower` when `model.conv` is
      set, and enter as flat vectors otherwise.
    """
    inputs, parts = {}, []
    for feature in data.features:
        key = feature.transformed_name
        if feature.is_categorical:
            inp = keras.Input(shape=(1,), dtype="int64", name=key)
            emb = keras.layers.Embedding(
                cardinalities[feature.name], model.embedding_dim, name=f"{key}_embedding"
            )(inp)
            parts.append(keras.layers.Flatten(name=f"{key}_flat")(emb))
        else:
            inp = keras.Input(shape=(feature.size,), dtype="float32", name=key)
            parts.append(
                conv_tower(inp, feature.shape, model.conv, key, recompute, model.stochastic_depth)
                if feature.shape and model.conv
                else inp
            )
        inputs[key] = inp
    x = keras.layers.Concatenate(name="features")(parts) if len(parts) > 1 else parts[0]
    for i, width in enumerate(model.hidden_units):
        x = keras.layers.Dense(width, activation="relu", name=f"hidden_{i}")(x)
        if model.dropout:
            x = keras.layers.Dropout(model.dropout, name=f"dropout_{i}")(x)
    logits = keras.layers.Dense(data.label.num_classes, dtype="float32", name=LOGITS_LAYER)(x)
    return Classifier(inputs=inputs, outputs=logits, name=name)


def conv_tower(
    flat: keras.KerasTensor,
    shape: Sequence[int],
    conv: ConvTowerConfig,
    key: str,
    recompute: bool = False,
    stochastic_depth: float = 0.0,
) -> keras.KerasTensor:
    """Conv blocks over one image-shaped feature, flattened (see `ConvTowerConfig`).

    Args:
      flat: The feature as Transform writes it, `[batch, prod(shape)]`.
      shape: `[height, width, channels]` of one example.
      conv: Filters, kernel, convolutions per block, batch norm, dropout.
      key: Transformed feature name (prefix of the layer names).
      recompute: Each block (convolutions, batch norm, ReLU, pooling) becomes
        one `CheckpointedConvBlock` whose activations are recomputed in the
        backward pass; the block's dropout stays outside it.
      stochastic_depth: Rate of skipping each residual branch in training
        (`StochasticDepth`; `conv.residual` makes the branches).

    Returns:
      `[batch, features]`: the last block's output, flattened.
    """
    x = keras.layers.Reshape(tuple(shape), name=f"{key}_image")(flat)
    for b, filters in enumerate(conv.filters):
        if recompute:
            pool = min(x.shape[1], x.shape[2]) >= 2
            x = CheckpointedConvBlock(filters, conv, pool, name=f"{key}_block{b}")(x)
            if conv.dropout:
                x = keras.layers.Dropout(conv.dropout, name=f"{key}_block{b}_dropout")(x)
            continue
        for c in range(conv.convs_per_block):
            name = f"{key}_block{b}_conv{c}"
            shortcut = x
            # Batch norm has its own shift, so the convolution needs no bias.
            x = keras.layers.Conv2D(
                filters, conv.kernel_size, padding="same", use_bias=not conv.batch_norm, name=name
            )(x)
            if conv.batch_norm:
                x = keras.layers.BatchNormalization(name=f"{name}_bn")(x)
            x = keras.layers.ReLU(name=f"{name}_relu")(x)
            if conv.residual and c > 0:
                if stochastic_depth:
                    x = StochasticDepth(stochastic_depth, name=f"{name}_drop_path")(x)
                x = keras.layers.Add(name=f"{name}_residual")([shortcut, x])
        if min(x.shape[1], x.shape[2]) >= 2:
            x = keras.layers.MaxPooling2D(2, name=f"{key}_block{b}_pool")(x)
        if conv.dropout:
            x = keras.layers.Dropout(conv.dropout, name=f"{key}_block{b}_dropout")(x)
    return keras.layers.Flatten(name=f"{key}_conv_flat")(x)


class StochasticDepth(keras.layers.Layer):
    """Skips a residual branch per example in training (Huang et al. 2016).

    In training each example's branch output is zeroed with probability
    `rate` and otherwise scaled by `1 / (1 - rate)`, so its expectation is
    unchanged; at evaluation and serving it passes through.
    """

    def __init__(self, rate: float, **kwargs):
        super().__init__(**kwargs)
        self.rate = float(rate)

    def call(self, x, training=None):
        if not training or not self.rate:
            return x
        keep = 1.0 - self.rate
        shape = tf.concat([tf.shape(x)[:1], tf.ones([tf.rank(x) - 1], tf.int32)], axis=0)
        mask = tf.floor(keep + tf.random.uniform(shape, dtype=x.dtype))
        return x * mask / tf.cast(keep, x.dtype)

    def get_config(self):
        return {**super().get_config(), "rate": self.rate}


class _RecomputableBatchNorm(keras.layers.BatchNormalization):
    """Batch norm whose moving-statistics updates can be switched off.

    A recomputed block runs its forward pass twice per step (once forward,
    once in the backward pass); the moving mean and variance must move once.
    """

    skip_updates = False

    def add_update(self, updates):
        if not self.skip_updates:
            super().add_update(updates)


class CheckpointedConvBlock(keras.layers.Layer):
    """One conv block whose activations are recomputed in the backward pass.

    `convs_per_block` x (Conv2D -> batch norm -> ReLU), then 2x2 max pooling
    when `pool`: the same layers and names as an ordinary block of
    `conv_tower`, but in training the block runs under `tf.recompute_grad`,
    so only the block's input is kept for the backward pass, and the
    convolutions' outputs are computed again there (memory for compute).
    The block is deterministic (its dropout is applied outside it) and its
    batch norm updates the moving statistics only in the forward pass, so
    the gradients and the moving statistics equal those without it.
    """

    def __init__(self, filters: int, conv: ConvTowerConfig, pool: bool, **kwargs):
        super().__init__(**kwargs)
        prefixes = [f"{self.name}_conv{c}" for c in range(conv.convs_per_block)]
        self.convs = [
            keras.layers.Conv2D(
                filters, conv.kernel_size, padding="same", use_bias=not conv.batch_norm, name=p
            )
            for p in prefixes
        ]
        self.norms = (
            [_RecomputableBatchNorm(name=f"{p}_bn") for p in prefixes] if conv.batch_norm else []
        )
        self.pool = keras.layers.MaxPooling2D(2, name=f"{self.name}_pool") if pool else None

    def _block(self, x, training):
        for i, conv_layer in enumerate(self.convs):
            x = conv_layer(x)
            if self.norms:
                x = self.norms[i](x, training=training)
            x = tf.nn.relu(x)
        return self.pool(x) if self.pool is not None else x

    def call(self, x, training=None):
        if not training:
            return self._block(x, training)
        norms = list(self.norms)
        calls = []

        def block(inputs):
            # The first call is the forward pass; later ones are the
            # backward pass's recomputation, which must not move the
            # moving statistics a second time.
            for norm in norms:
                norm.skip_updates = bool(calls)
            calls.append(None)
            try:
                return self._block(inputs, training)
            finally:
                for norm in norms:
                    norm.skip_updates = False

        return tf.recompute_grad(block)(x)


# --------------------------------------------------------------------------- #
# Mixed precision
# --------------------------------------------------------------------------- #


@contextlib.contextmanager
def precision_policy(name: str, keras_module=keras) -> Iterator[keras.mixed_precision.Policy]:
    """Sets the global Keras dtype policy for `train.mixed_precision`, then restores it.

    Layers take the global policy when they are created, so build the model
    inside this context. The previous policy comes back on exit, so that
    layers built later (the serving export's transform layer) stay float32.

    Args:
      name: `none` (float32), `mixed_float16` (GPU: float16 compute, needs
        loss scaling, which `compile` adds) or `mixed_bfloat16` (TPU and
        recent CPUs: bfloat16 compute, no loss scaling needed).
      keras_module: The Keras whose policy is set: tf_keras (the product's
        models), or what `tf.keras` is for a user's run_fn (Keras 3 too).

    """
    mixed_precision = keras_module.mixed_precision
    previous = mixed_precision.global_policy()
    policy = mixed_precision.Policy("float32" if name == "none" else name)
    mixed_precision.set_global_policy(policy)
    try:
        yield policy
    finally:
        mixed_precision.set_global_policy(previous)


# --------------------------------------------------------------------------- #
# Gradient accumulation
# --------------------------------------------------------------------------- #


def accumulate_gradients(
    loss_fn: Callable[[Any], tf.Tensor],
    data: Any,
    variables: Sequence[tf.Variable],
    steps: int,
    optimizer: keras.optimizers.Optimizer | None = None,
) -> list[tf.Tensor]:
    """Gradients of the mean loss over `steps` stacked micro-batches.

    One micro-batch at a time goes through the forward and backward pass (so
    activation memory is that of one micro-batch) and the gradients are
    summed in a `tf.while_loop`. No optimizer update and no cross-replica
    communication happens inside the loop, which is what makes this work under
    every strategy: the caller applies the result once with
    `optimizer.apply_gradients`, which all-reduces it (mirrored, multi-worker,
    TPU) or sends it to the parameter servers.

    Args:
      loss_fn: Maps one micro-batch (the structure of `data` without its
        leading axis) to a scalar loss already averaged over the *global*
        micro-batch (Keras's compiled loss is; in custom code use
        `tf.nn.compute_average_loss`). It may update metrics.
      data: A structure of tensors whose leading axis has size `steps` (the
        micro-batches stacked); with `steps == 1`, one ordinary batch.
      variables: The variables to differentiate (e.g. a student's trainable
        weights, never a frozen teacher's).
      steps: Micro-batches per update (`train.grad_accum_steps`).
      optimizer: When it is a `LossScaleOptimizer` (mixed_float16), each
        micro-batch loss is scaled before and its gradients unscaled after
        differentiation; non-finite sums are then skipped by its
        `apply_gradients` as usual.

    Returns:
      One dense gradient per variable: the gradient of
      `mean(loss_fn(micro_batch_i) for i in range(steps))`, equal to the
      gradient of one batch `steps` times larger.
    """
    scale = isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)

    def micro_gradients(micro):
        with tf.GradientTape() as tape:
            loss = loss_fn(micro) / steps
            target = optimizer.get_scaled_loss(loss) if scale else loss
        grads = tape.gradient(target, variables)
        if scale:
            grads = optimizer.get_unscaled_gradients(grads)
        # Embedding gradients arrive as IndexedSlices; a loop carry needs one
        # fixed dense shape per variable.
        return [
            tf.zeros(v.shape, v.dtype) if g is None else tf.convert_to_tensor(g)
            for g, v in zip(grads, variables, strict=True)
        ]

    if steps == 1:
        return micro_gradients(data)

    def body(i, acc):
        micro = tf.nest.map_structure(lambda t: t[i], data)
        return i + 1, [a + g for a, g in zip(acc, micro_gradients(micro), strict=True)]

    zeros = [tf.zeros(v.shape, v.dtype) for v in variables]
    _, summed = tf.while_loop(lambda i, _: i < steps, body, (tf.constant(0), zeros))
    return summed


class GradientAccumulationMixin:
    """Gives a Keras model one optimizer update per `grad_accum_steps` micro-batches.

    Mix it in before `keras.Model`. The Trainer's `fit` sets
    `grad_accum_steps` and feeds each step `grad_accum_steps` micro-batches
    stacked on a new leading axis (`dataset.batch(grad_accum_steps)`), so a
    Keras step is still one optimizer update and `train.train_steps` keeps
    its meaning.

    A model with its own `train_step` (e.g. a distiller) keeps it and calls
    `accumulate_gradients(loss_fn, data, variables, self.grad_accum_steps,
    self.optimizer)` there, then `self.optimizer.apply_gradients(...)`. `fit`
    refuses `grad_accum_steps > 1` for models that do not carry this mixin.
    """

    supports_gradient_accumulation = True
    grad_accum_steps = 1

    # Plain TensorFlow control flow only (an explicit `tf.while_loop`): with
    # AutoGraph on, every Keras function reached from here would be
    # re-transpiled, which costs tens of seconds per process on few cores.
    @tf.autograph.experimental.do_not_convert
    def train_step(self, data):
        if self.grad_accum_steps == 1:
            return super().train_step(data)

        def loss_fn(micro):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(micro)
            y_pred = self(x, training=True)
            loss = self.compute_loss(x, y, y_pred, sample_weight)
            # Update only: reading results inside the loop would be a
            # cross-replica synchronisation, which a loop body cannot hold.
            # Training metrics score the example's own label (see `Classifier`).
            self.compiled_metrics.update_state(augment.own_labels(y), y_pred, sample_weight)
            return loss

        variables = self.trainable_variables
        grads = accumulate_gradients(
            loss_fn, data, variables, self.grad_accum_steps, self.optimizer
        )
        self.optimizer.apply_gradients(zip(grads, variables, strict=True))
        return self.get_metrics_result()

    @tf.autograph.experimental.do_not_convert
    def test_step(self, data):
        return super().test_step(data)


class Classifier(GradientAccumulationMixin, keras.Model):
    """The functional teacher / student classifier (see `build_classifier`).

    A saved Classifier loads back as a plain functional Keras model; the class
    only adds to training: gradient accumulation, and mixup batches, whose
    label is `augment.MixedLabels` (`train.augmentation.mixup`). Their loss
    is `lam * CE(y) + (1 - lam) * CE(y[perm])` per example (missing labels
    dropped, see `augment.label_terms`), through the compiled loss; training
    accuracy scores the example's own label. `augment.SoftLabels` (Noisy
    Student's soft pseudo-labels) train on the cross-entropy against their
    target distribution, the same way.
    """

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        if not isinstance(y, (augment.MixedLabels, augment.SoftLabels)):
            return super().compute_loss(x, y, y_pred, sample_weight)
        # The compiled cross-entropy (a mean over its rows) over the batch
        # written once per label term, each row weighted by its term's weight
        # times the number of terms, is the batch mean of the weighted sum per
        # example; through the compiled loss, Keras keeps its loss scaling
        # across replicas, the regularisation losses and the `loss` metric.
        terms = augment.label_terms(y)
        ids = tf.concat([i for i, _ in terms], axis=0)
        weights = tf.concat([w for _, w in terms], axis=0) * float(len(terms))
        if sample_weight is not None:
            weights *= tf.tile(tf.reshape(tf.cast(sample_weight, tf.float32), [-1]), [len(terms)])
        logits = tf.tile(y_pred, [len(terms), 1])
        return self.compiled_loss(ids, logits, weights, regularization_losses=self.losses)

    def compute_metrics(self, x, y, y_pred, sample_weight):
        return super().compute_metrics(x, augment.own_labels(y), y_pred, sample_weight)
