"""`preprocessing_fn` generated from the feature config.

`build_preprocessing_fn` transforms each feature by its kind (`transform_feature`): floats
imputed, then z-scored, bucketized or passed through; categoricals to vocabulary or
identity ids. Every transformed feature is rank 2; the label is an int64 vector.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tensorflow_transform as tft

from components.config import ConfigError, FeatureConfig, PipelineConfig, payload


def vocabulary_name(feature: FeatureConfig) -> str:
    """The TFT vocabulary file name of a `vocabulary` feature."""
    return f"vocab_{feature.name}"


def num_ids(feature: FeatureConfig, tft_output: tft.TFTransformOutput) -> int:
    """Number of distinct ids a categorical transformed feature takes."""
    t = feature.effective_transform
    if t == "bucketize":
        return feature.num_buckets
    if t == "identity":
        return feature.num_buckets + 1
    return tft_output.vocabulary_size_by_name(vocabulary_name(feature)) + feature.oov_buckets


def _to_dense(x: Any, default: Any, size: int) -> tf.Tensor:
    """Densifies a (possibly sparse / missing-valued) feature to `[batch, size]`."""
    if isinstance(x, tf.SparseTensor):
        batch = x.dense_shape[0]
        x = tf.sparse.to_dense(
            tf.SparseTensor(x.indices, x.values, tf.stack([batch, tf.constant(size, tf.int64)])),
            default_value=default,
        )
    elif isinstance(x, tf.RaggedTensor):
        x = x.to_tensor(default_value=default, shape=[None, size])
    return tf.reshape(x, [-1, size])


def _present_values(x: Any) -> tf.Tensor:
    if isinstance(x, tf.SparseTensor):
        return x.values
    if isinstance(x, tf.RaggedTensor):
        return x.flat_values
    return tf.reshape(x, [-1])


def _map_values(x: Any, fn) -> Any:
    if isinstance(x, tf.SparseTensor):
        return tf.SparseTensor(x.indices, fn(x.values), x.dense_shape)
    if isinstance(x, tf.RaggedTensor):
        return x.with_flat_values(fn(x.flat_values))
    return fn(x)


def transform_feature(feature: FeatureConfig, x: Any) -> tf.Tensor:
    """Applies the configured transform to one raw feature tensor."""
    t = feature.effective_transform
    if feature.kind != "string_categorical" and x.dtype == tf.string:
        # A CSV column with no values at all is inferred as string; the gate
        # has already rejected columns holding actual non-numeric text.
        x = _map_values(
            x,
            lambda v: tf.strings.to_number(v, tf.float32 if feature.kind == "float" else tf.int64),
        )
    if feature.kind == "float":
        # Every analyzer below reads raw present values only, so the whole
        # preprocessing_fn is one analysis phase (one pass over the data), and
        # imputed values do not bias the statistics.
        # NaN and +-Inf count as missing: they are excluded from the
        # statistics and imputed like absent values.
        values = tf.cast(_present_values(x), tf.float32)
        values = tf.boolean_mask(values, tf.math.is_finite(values))
        mean = tft.mean(values)
        fill = mean if feature.fill_value is None else tf.constant(feature.fill_value, tf.float32)
        dense = _to_dense(tf.cast(x, tf.float32), float("nan"), feature.size)
        filled = tf.where(tf.math.is_finite(dense), dense, tf.fill(tf.shape(dense), fill))
        if t == "zscore":
            std = tf.sqrt(tft.var(values))
            centered = filled - mean
            return tf.where(std > 0, centered / tf.where(std > 0, std, 1.0), centered)
        if t == "bucketize":
            boundaries = tft.quantiles(values, feature.num_buckets, epsilon=0.01)
            return tf.cast(tft.apply_buckets(filled, boundaries), tf.int64)
        return filled
    if feature.kind == "string_categorical":
        dense = _to_dense(x, "", 1)
        return tft.compute_and_apply_vocabulary(
            dense,
            top_k=feature.top_k or None,
            num_oov_buckets=feature.oov_buckets,
            vocab_filename=vocabulary_name(feature),
        )
    dense = _to_dense(tf.cast(x, tf.int64), tf.constant(-1, tf.int64), 1)
    if t == "identity":
        in_range = tf.logical_and(dense >= 0, dense < feature.num_buckets)
        return tf.where(
            in_range, dense, tf.fill(tf.shape(dense), tf.constant(feature.num_buckets, tf.int64))
        )
    return tft.compute_and_apply_vocabulary(
        dense,
        top_k=feature.top_k or None,
        num_oov_buckets=feature.oov_buckets,
        vocab_filename=vocabulary_name(feature),
    )


def build_preprocessing_fn(config: PipelineConfig):
    """Returns a `preprocessing_fn(inputs)` for the config's features."""
    data = config.data

    def preprocessing_fn(inputs: dict[str, Any]) -> dict[str, tf.Tensor]:
        outputs = {}
        for feature in data.features:
            outputs[feature.transformed_name] = transform_feature(feature, inputs[feature.name])
        label = _to_dense(tf.cast(inputs[data.label.name], tf.int64), tf.constant(-1, tf.int64), 1)
        outputs[data.label.name] = tf.reshape(label, [-1])
        return outputs

    return preprocessing_fn


def preprocessing_fn(inputs: dict[str, Any], custom_config: dict[str, Any]) -> dict[str, tf.Tensor]:
    """The entry point TFX's Transform executor calls (via `custom_config`).

    Raises:
      ConfigError: naming the key when `custom_config` carries no tfxkit
        config (this function is the tfxkit Transform's own).
    """
    config = payload.decode(custom_config).config
    if config is None:
        raise ConfigError(
            f"custom_config: no {payload.CONFIG_KEY!r}; the generated preprocessing_fn needs the "
            "config the tfxkit Transform writes"
        )
    return build_preprocessing_fn(config)(inputs)
