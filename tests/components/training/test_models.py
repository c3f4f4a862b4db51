"""Model builder: gradient checkpointing of conv blocks (`train.gradient_checkpointing`)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from components.config import from_dict
from components.training import models


def _config(
    convs_per_block: int = 2, dropout: float = 0.0, residual: bool = False, stochastic_depth=0.0
):
    return from_dict(
        {
            "name": "models-test",
            "data": {
                "path": "unused.tfrecord",
                "format": "tfrecord",
                "label": {"name": "y", "num_classes": 3},
                "features": [
                    {"name": "img", "kind": "float", "size": 64, "shape": [8, 8, 1]},
                    {"name": "x", "kind": "float"},
                ],
            },
            "teacher": {
                "hidden_units": [8],
                "conv": {
                    "filters": [4, 6],
                    "convs_per_block": convs_per_block,
                    "batch_norm": True,
                    "dropout": dropout,
                    "residual": residual,
                },
                "stochastic_depth": stochastic_depth,
            },
        }
    )


def _key(variable: tf.Variable) -> str:
    # The checkpointed block nests its layers one scope deeper; the layer and
    # weight names are the same as in the plain tower.
    return "/".join(variable.name.split("/")[-2:])


def _pair(convs_per_block: int = 2, dropout: float = 0.0):
    """A plain and a checkpointed model with the same weights."""
    config = _config(convs_per_block, dropout)
    plain = models.build_classifier(config.data, config.teacher, {}, "plain")
    checkpointed = models.build_classifier(
        config.data, config.teacher, {}, "checkpointed", recompute=True
    )
    by_name = {_key(v): v for v in plain.variables}
    assert sorted(by_name) == sorted(_key(v) for v in checkpointed.variables)
    for v in checkpointed.variables:
        v.assign(by_name[_key(v)])
    return plain, checkpointed


def _batch(n: int = 16):
    rng = np.random.default_rng(0)
    features = {
        "img_xf": rng.normal(size=(n, 64)).astype("float32"),
        "x_xf": rng.normal(size=(n, 1)).astype("float32"),
    }
    return features, rng.integers(0, 3, size=(n,))


def _gradients(model, features, labels):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(features, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    return {_key(v): g.numpy() for v, g in zip(model.trainable_variables, grads, strict=True)}


def test_checkpointed_blocks_give_the_same_gradients():
    plain, checkpointed = _pair()
    features, labels = _batch()
    expected = _gradients(plain, features, labels)
    got = _gradients(checkpointed, features, labels)
    assert sorted(got) == sorted(expected)
    for name, grad in expected.items():
        assert np.abs(grad).max() > 0, name  # every layer takes part
        np.testing.assert_allclose(got[name], grad, rtol=1e-4, atol=1e-6, err_msg=name)


def test_checkpointed_blocks_train_like_plain_ones_and_move_batch_norm_stats_once():
    plain, checkpointed = _pair()
    features, labels = _batch(32)
    for model in (plain, checkpointed):
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.fit(features, labels, batch_size=8, epochs=1, shuffle=False, verbose=0)
    trained = {_key(v): v.numpy() for v in plain.variables}
    moving = [v for v in checkpointed.variables if "moving_" in v.name]
    assert moving and any(
        np.abs(v.numpy() - (1.0 if "variance" in v.name else 0.0)).max() > 1e-3 for v in moving
    )
    for v in checkpointed.variables:
        np.testing.assert_allclose(
            v.numpy(), trained[_key(v)], rtol=1e-4, atol=1e-5, err_msg=v.name
        )
    np.testing.assert_allclose(
        checkpointed(features, training=False).numpy(),
        plain(features, training=False).numpy(),
        rtol=1e-4,
        atol=1e-5,
    )


def test_checkpointing_keeps_the_block_dropout_outside_the_recomputed_part():
    config = _config(convs_per_block=1, dropout=0.5)
    model = models.build_classifier(config.data, config.teacher, {}, "t", recompute=True)
    names = [layer.name for layer in model.layers]
    assert "img_xf_block0" in names and "img_xf_block0_dropout" in names
    block = model.get_layer("img_xf_block0")
    assert isinstance(block, models.CheckpointedConvBlock)
    assert not any(isinstance(layer, keras.layers.Dropout) for layer in block._flatten_layers())


@pytest.mark.parametrize("recompute", [False, True])
def test_models_without_a_conv_tower_ignore_checkpointing(recompute):
    config = _config()
    shape = config.student
    model = models.build_classifier(config.data, shape, {}, "s", recompute=recompute)
    assert not any(isinstance(layer, models.CheckpointedConvBlock) for layer in model.layers)


def _residual(stochastic_depth: float = 0.0):
    return _config(residual=True, stochastic_depth=stochastic_depth)


def test_residual_branches_add_their_input_and_stochastic_depth_is_noise_in_training_only():
    config = _residual(stochastic_depth=0.5)
    model = models.build_classifier(config.data, config.teacher, {}, "student")
    names = [layer.name for layer in model.layers]
    # One branch per block (its second convolution), each skippable.
    assert [n for n in names if n.endswith("_residual")] == [
        "img_xf_block0_conv1_residual",
        "img_xf_block1_conv1_residual",
    ]
    assert sum(isinstance(layer, models.StochasticDepth) for layer in model.layers) == 2
    features, _ = _batch(64)
    assert not np.array_equal(
        model(features, training=True).numpy(), model(features, training=True).numpy()
    )
    np.testing.assert_array_equal(
        model(features, training=False).numpy(), model(features, training=False).numpy()
    )
    # Without stochastic depth the same residual model has the same weights, and no noise.
    plain = models.build_classifier(config.data, _residual().teacher, {}, "plain")
    assert [v.shape for v in plain.trainable_variables] == [
        v.shape for v in model.trainable_variables
    ]


def test_stochastic_depth_drops_whole_examples_and_keeps_the_expectation():
    layer = models.StochasticDepth(0.25)
    x = tf.ones([20000, 3, 3, 2])
    out = layer(x, training=True).numpy()
    per_example = out.reshape(len(out), -1)
    # Each example's branch is all kept (scaled by 4 / 3) or all dropped.
    np.testing.assert_allclose(np.unique(per_example), [0.0, 1 / 0.75], rtol=1e-6)
    assert (per_example == per_example[:, :1]).all()
    assert 0.72 < (per_example[:, 0] > 0).mean() < 0.78
    assert abs(out.mean() - 1.0) < 0.03
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())


@pytest.mark.parametrize(
    "edit, match",
    [
        (
            lambda d: d["teacher"].pop("conv"),
            r"^teacher\.stochastic_depth: stochastic depth skips the residual branches of a conv "
            r"tower, and this model has no conv tower",
        ),
        (
            lambda d: d["teacher"]["conv"].update(residual=False),
            r"^teacher\.stochastic_depth: .*conv\.residual: false",
        ),
        (
            lambda d: d["teacher"]["conv"].update(convs_per_block=1),
            r"^teacher\.conv\.residual: residual branches are a block's second",
        ),
        (
            lambda d: d.setdefault("train", {}).update(gradient_checkpointing=True),
            r"^teacher\.conv\.residual: train\.gradient_checkpointing recomputes whole conv blocks",
        ),
    ],
)
def test_stochastic_depth_a_model_cannot_take_is_refused_naming_the_field(edit, match):
    from components.config import ConfigError, to_dict

    data = to_dict(_residual(stochastic_depth=0.2))
    edit(data)
    with pytest.raises(ConfigError, match=match):
        from_dict(data)
