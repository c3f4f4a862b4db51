"""The Trainer trains on mixed batches and evaluates on unmixed ones.

A real transformed penguins output through `inputs.make_datasets` and
`training.fit`; the augmentation itself (views, mixup, what teachers and
student see) is tested in `test_inputs.py`.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft

from components.data import augment
from components.training import fit as training
from components.training import strategies
from components.training.inputs import make_datasets
from tests.components.training import penguins


@pytest.fixture(scope="module")
def penguin_data(tmp_path_factory, penguin_inputs):
    """Real transformed penguins: three z-scored floats and a bucketized (integer id) feature."""
    return penguin_inputs, str(tmp_path_factory.mktemp("penguins_mixup"))


def test_the_trainer_mixes_training_batches_only(penguin_data):
    data, root = penguin_data
    config = penguins.penguins_config()
    mixed_config = penguins.with_sections(config, train={"augmentation": {"mixup": 0.4}})
    inputs = training.TrainingInputs(**penguins.inputs_for(data, root, "mixup", mixed_config))
    tft_output = tft.TFTransformOutput(data.transform_output)
    train, evaluation = make_datasets(mixed_config, inputs, tft_output)
    plain_train, plain_eval = make_datasets(config, inputs, tft_output)

    (features, labels), (stored, own) = next(iter(train)), next(iter(plain_train))
    assert isinstance(labels, augment.MixedLabels)
    np.testing.assert_array_equal(labels.label.numpy(), own.numpy())
    for name in penguins.FLOAT_FEATURES:
        assert not np.array_equal(features[f"{name}_xf"].numpy(), stored[f"{name}_xf"].numpy())
    # The bucketized feature is an integer id: each example keeps its own.
    bucket = f"{penguins.BUCKETIZED_FEATURE}_xf"
    np.testing.assert_array_equal(features[bucket].numpy(), stored[bucket].numpy())

    # Evaluation data is never mixed.
    for (features, labels), (stored, own) in zip(evaluation, plain_eval, strict=True):
        assert isinstance(labels, tf.Tensor)
        np.testing.assert_array_equal(labels.numpy(), own.numpy())
        for key in stored:
            np.testing.assert_array_equal(features[key].numpy(), stored[key].numpy())

    # The Trainer's own model trains on the mixed batches, accumulating gradients too.
    accumulating = penguins.with_sections(mixed_config, train={"grad_accum_steps": 2})
    choice = strategies.create_strategy(config.strategy, environ={})

    def build_and_compile():
        model = training.build_model(accumulating, tft_output, accumulating.teacher, "teacher")
        training.compile_classifier(model, accumulating)
        return model

    _, results = training.fit(accumulating, inputs, build_and_compile, choice=choice)
    assert np.isfinite(results["loss"]) and 0.0 <= results["accuracy"] <= 1.0
