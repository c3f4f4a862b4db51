"""Teacher / student classifiers built from the feature config (no TFX types).

Both roles share one builder: categorical transformed features (vocabulary,
identity and bucketized ids) are embedded, numeric ones are used as they are,
everything is concatenated and fed through a ReLU MLP to `num_classes` logits.
The logits layer is float32 even under a mixed-precision policy, so softmax
and losses stay numerically safe.
"""

from __future__ import annotations

import tf_keras as keras

from components.config import DataConfig, ModelConfig

LOGITS_LAYER = "logits"


def build_classifier(
    data: DataConfig, model: ModelConfig, cardinalities: dict[str, int], name: str
) -> keras.Model:
    """Builds an uncompiled classifier over the transformed features.

    Args:
      data: The `data` config section (features and label).
      model: Hidden widths, embedding size, dropout.
      cardinalities: Number of ids of each categorical feature, keyed by the
        raw feature name (see `preprocessing.num_ids`).
      name: Keras model name (`teacher`, `student`).

    Returns:
      A `keras.Model` taking a dict keyed by transformed feature names and
      returning float32 logits of shape `[batch, num_classes]`.
    """
    inputs, parts = {}, []
    for feature in data.features:
        key = feature.transformed_name
        if feature.is_categorical:
            inp = keras.Input(shape=(1,), dtype="int64", name=key)
            emb = keras.layers.Embedding(cardinalities[feature.name], model.embedding_dim, name=f"{key}_embedding")(inp)
            parts.append(keras.layers.Flatten(name=f"{key}_flat")(emb))
        else:
            inp = keras.Input(shape=(feature.size,), dtype="float32", name=key)
            parts.append(inp)
        inputs[key] = inp
    x = keras.layers.Concatenate(name="features")(parts) if len(parts) > 1 else parts[0]
    for i, width in enumerate(model.hidden_units):
        x = keras.layers.Dense(width, activation="relu", name=f"hidden_{i}")(x)
        if model.dropout:
            x = keras.layers.Dropout(model.dropout, name=f"dropout_{i}")(x)
    logits = keras.layers.Dense(data.label.num_classes, dtype="float32", name=LOGITS_LAYER)(x)
    return keras.Model(inputs=inputs, outputs=logits, name=name)
