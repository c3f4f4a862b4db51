"""The Trainer's inputs (`components.training.inputs`) beyond reading the files.

Augmented training input: one view per batch, seen by teachers and student
alike; mixup included: the mixed batch reaches the teachers and the student
and its labels travel as `augment.MixedLabels`. `data.labeled_fraction`:
teachers train on the labeled examples only, the Distiller sees every
example. Reading stored output is `tests/components/data/test_stored_input.py`;
that evaluation data is never mixed, with a real Transform output, is
`test_training_augmentation.py`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from components.config import AugmentationConfig, ConfigError
from components.data import augment, codes, layout
from components.data import labels as label_lib
from components.distillation import model as distillation
from components.training import inputs
from pipelines.configs import load_config

BATCH, SIDE = 8, 28


def _config(translate=2, flip=True, mixup=0.0):
    """The shipped fashion_mnist config with augmentation as given (and no soft-target cache)."""
    config = load_config("fashion_mnist")
    return dataclasses.replace(
        config,
        train=dataclasses.replace(
            config.train,
            augmentation=AugmentationConfig(translate=translate, flip=flip, mixup=mixup),
        ),
        distillation=dataclasses.replace(config.distillation, cache_teacher_logits=False),
    )


def _batches(n=3, index_labels=False):
    """`n` batches of random images; labels random, or each example's index in its batch."""
    rng = np.random.default_rng(1)
    images = rng.uniform(0.1, 1.0, size=(n * BATCH, SIDE * SIDE)).astype("float32")
    labels = rng.integers(0, 10, size=(n * BATCH, 1))
    if index_labels:
        labels = np.tile(np.arange(BATCH), n)[:, None]
    return tf.data.Dataset.from_tensor_slices(({"image_xf": images}, labels)).batch(BATCH)


class _Record(keras.layers.Layer):
    """Passes its input through and keeps the last training-time input."""

    def build(self, input_shape):
        self.seen = self.add_weight(
            name="seen", shape=(BATCH, SIDE * SIDE), trainable=False, initializer="zeros"
        )

    def call(self, x, training=None):
        if training:
            self.seen.assign(x)
        return x


def _distil_one_batch(config) -> tuple[np.ndarray, np.ndarray]:
    """Distils one augmented batch; returns what the teacher and the student received."""
    return _distil(inputs.augmented(_batches(), config).take(1))


def _distil(batches: tf.data.Dataset, books=None) -> tuple[np.ndarray, np.ndarray]:
    """Distils `batches` (their train step decoding the codes of `books`, when given);
    returns what the teacher and the student received last."""
    inp = keras.Input(shape=(SIDE * SIDE,), name="image_xf")
    recorder = _Record()
    student = keras.Model({"image_xf": inp}, keras.layers.Dense(10)(recorder(inp)))
    teacher_seen = tf.Variable(tf.zeros((BATCH, SIDE * SIDE)))

    def teacher(features):
        teacher_seen.assign(features["image_xf"])
        return tf.zeros((tf.shape(features["image_xf"])[0], 10))

    distiller = distillation.Distiller(student, [teacher], alpha=0.5, temperature=2.0)
    distiller.compile(optimizer=keras.optimizers.SGD(0.1))
    if books is not None:
        distiller.train_step = codes.decoding_step(distiller.train_step, books)
    distiller.fit(batches, epochs=1, verbose=0)
    return teacher_seen.numpy(), recorder.seen.numpy()


def test_teacher_and_student_receive_the_same_augmented_batch():
    config = _config()
    plain = next(iter(_batches()))
    augmented = next(iter(inputs.augmented(_batches(), config)))
    # The view differs from the stored example: augmentation is on.
    assert not np.array_equal(augmented[0]["image_xf"].numpy(), plain[0]["image_xf"].numpy())

    teacher_seen, student_seen = _distil_one_batch(config)

    np.testing.assert_array_equal(teacher_seen, augmented[0]["image_xf"].numpy())
    np.testing.assert_array_equal(student_seen, augmented[0]["image_xf"].numpy())


def test_views_are_reproducible_and_change_from_batch_to_batch():
    config = _config()
    first = [b[0]["image_xf"].numpy() for b in inputs.augmented(_batches(), config)]
    again = [b[0]["image_xf"].numpy() for b in inputs.augmented(_batches(), config)]
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    # Labels are untouched, and different input pipelines draw different views.
    labels = [b[1].numpy() for b in inputs.augmented(_batches(), config)]
    np.testing.assert_array_equal(
        np.concatenate(labels), np.concatenate([b[1].numpy() for b in _batches()])
    )
    other = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
    elsewhere = [b[0]["image_xf"].numpy() for b in inputs.augmented(_batches(), config, other)]
    assert not np.array_equal(first[0], elsewhere[0])


def test_the_soft_target_cache_serves_only_unaugmented_input():
    # Every augmented view is a new example: a cache keyed by example would
    # grow without bound, so the combination is refused before training.
    config = _config()
    with pytest.raises(
        ConfigError, match=r"distillation\.cache_teacher_logits: .*train\.augmentation"
    ):
        dataclasses.replace(
            config, distillation=dataclasses.replace(config.distillation, cache_teacher_logits=True)
        )
    plain = _config(translate=0, flip=False)
    assert not plain.train.augmentation.enabled
    cached = dataclasses.replace(
        plain, distillation=dataclasses.replace(plain.distillation, cache_teacher_logits=True)
    )
    assert cached.distillation.cache_teacher_logits


def _numbered(n=512):
    """Batches of distinct examples whose label is their index."""
    x = np.arange(n, dtype="float32")[:, None] * np.ones((1, 4), "float32")
    return tf.data.Dataset.from_tensor_slices(({"x_xf": x}, np.arange(n)[:, None])).batch(BATCH)


def test_teachers_train_on_the_labeled_examples_only():
    fraction = 0.25
    keep = label_lib.labeled_mask(
        {
            "x_xf": tf.constant(
                np.arange(512, dtype="float32")[:, None] * np.ones((1, 4), "float32")
            )
        },
        fraction,
    ).numpy()
    batches = list(
        inputs.partially_labeled(
            _numbered().repeat(2), fraction, inputs.DROP_UNLABELED, BATCH
        ).take(5)
    )
    seen = np.concatenate([b[1].numpy().reshape(-1) for b in batches])
    assert all(b[1].shape[0] == BATCH for b in batches)
    assert set(seen) <= set(np.flatnonzero(keep))


def test_the_distiller_sees_every_example_and_the_labels_it_may_use():
    fraction = 0.25
    batches = list(inputs.partially_labeled(_numbered(), fraction, inputs.MASK_UNLABELED, BATCH))
    labels = np.concatenate([b[1].numpy().reshape(-1) for b in batches])
    features = np.concatenate([b[0]["x_xf"].numpy() for b in batches])
    keep = label_lib.labeled_mask({"x_xf": tf.constant(features)}, fraction).numpy()
    assert len(labels) == 512
    np.testing.assert_array_equal(labels[keep], np.flatnonzero(keep))
    assert (labels[~keep] == label_lib.UNLABELED).all()
    assert 0.15 < keep.mean() < 0.35


# --------------------------------------------------------------------------- #
# Mixup
# --------------------------------------------------------------------------- #


def test_mixup_off_leaves_the_batches_as_they_were():
    # What the input pipeline did before mixup existed: image views seeded by
    # (train.seed, batch index), labels untouched, no other op.
    config = _config(mixup=0.0)
    for index, ((views, label), (images, stored)) in enumerate(
        zip(inputs.augmented(_batches(), config), _batches(), strict=True)
    ):
        seed = tf.constant([config.train.seed, index], tf.int64)
        want = augment.augment_images(
            images, {"image_xf": (SIDE, SIDE, 1)}, translate=2, flip=True, seed=seed
        )
        assert isinstance(label, tf.Tensor)
        np.testing.assert_array_equal(label.numpy(), stored.numpy())
        assert views["image_xf"].numpy().tobytes() == want["image_xf"].numpy().tobytes()
    assert not _config(translate=0, flip=False, mixup=0.0).train.augmentation.enabled


def test_mixup_mixes_the_image_views_with_the_recorded_lam_and_partner():
    views = list(inputs.augmented(_batches(index_labels=True), _config(mixup=0.4)))
    plain_views = list(inputs.augmented(_batches(index_labels=True), _config(mixup=0.0)))
    for (mixed, labels), (viewed, own) in zip(views, plain_views, strict=True):
        assert isinstance(labels, augment.MixedLabels)
        np.testing.assert_array_equal(labels.label.numpy(), own.numpy())
        # Labels are the index in the batch: the partner labels are the permutation.
        perm, lam = labels.partner.numpy().reshape(-1), labels.lam.numpy()[:, None]
        x = viewed["image_xf"].numpy()
        np.testing.assert_allclose(
            mixed["image_xf"].numpy(), lam * x + (1 - lam) * x[perm], rtol=1e-6, atol=1e-6
        )
    assert not np.array_equal(views[0][1].lam.numpy(), views[1][1].lam.numpy())


def test_with_mixup_the_teacher_receives_exactly_the_batch_the_student_receives():
    config = _config(mixup=0.4)
    mixed, labels = next(iter(inputs.augmented(_batches(), config)))
    assert isinstance(labels, augment.MixedLabels)

    teacher_seen, student_seen = _distil_one_batch(config)

    np.testing.assert_array_equal(teacher_seen, mixed["image_xf"].numpy())
    np.testing.assert_array_equal(student_seen, mixed["image_xf"].numpy())


def test_the_distillers_teacher_and_student_receive_the_decoded_values_of_codes():
    """`codes.decoding_step` around the Distiller's own train_step (as `fit` installs it):
    codes in the batch, the codebook's values in both roles."""
    book = np.linspace(-1.0, 2.0, 256, dtype=np.float32)
    rng = np.random.default_rng(3)
    coded = rng.integers(0, 256, size=(BATCH, SIDE * SIDE)).astype(np.uint8)
    labels = rng.integers(0, 10, size=(BATCH, 1))
    batch = tf.data.Dataset.from_tensors(({"image_xf": coded}, labels))
    teacher_seen, student_seen = _distil(batch, {"image_xf": book})
    np.testing.assert_array_equal(teacher_seen, book[coded])
    np.testing.assert_array_equal(student_seen, book[coded])


@pytest.mark.parametrize(
    ("codes_setting", "accelerated", "sent"),
    [("auto", False, False), ("auto", True, True), ("on", False, True), ("off", True, False)],
)
def test_codes_are_sent_as_set_and_by_default_only_to_accelerators(
    codes_setting, accelerated, sent
):
    config = _config()
    record = layout.Layout("none", 1, None, {}, (), codebooks={"image_xf": (0.0, 1.0)})
    service = dataclasses.replace(
        config.ingestion.service, dispatcher="localhost:5000", codes=codes_setting
    )
    served = dataclasses.replace(
        config, ingestion=dataclasses.replace(config.ingestion, service=service)
    )
    books = inputs.service_codebooks(served, record, accelerated)
    assert books == ({"image_xf": (0.0, 1.0)} if sent else {})
    # No service, or no layout record (stock Transform output): values.
    assert inputs.service_codebooks(config, record, True) == {}
    assert inputs.service_codebooks(served, None, True) == {}


def _served(codes_setting: str, remote: str = "parse"):
    config = _config()
    service = dataclasses.replace(
        config.ingestion.service, dispatcher="localhost:5000", codes=codes_setting, remote=remote
    )
    return dataclasses.replace(
        config, ingestion=dataclasses.replace(config.ingestion, cache="none", service=service)
    )


def test_auto_sends_values_when_the_workers_make_views():
    record = layout.Layout("none", 1, None, {}, (), codebooks={"image_xf": (0.0, 1.0)})
    assert inputs.service_codebooks(_served("auto", "augment"), record, True) == {}
    assert inputs.service_codebooks(_served("on", "augment"), record, False) != {}


def test_codes_on_that_cannot_apply_says_why(caplog):
    with_books = layout.Layout("none", 1, None, {}, (), codebooks={"image_xf": (0.0, 1.0)})
    without = layout.Layout("none", 1, None, {}, ())
    with caplog.at_level("WARNING", logger="absl"):
        assert inputs.service_codebooks(_served("on"), without, True) == {}
        assert inputs.service_codebooks(_served("on"), with_books, True, "mixup here") == {}
        assert inputs.service_codebooks(_served("auto"), without, True) == {}
    messages = [r.getMessage() for r in caplog.records if "codes: 'on'" in r.getMessage()]
    assert len(messages) == 2  # auto says nothing
    assert "no codebook" in messages[0] and "re-run the Transform" in messages[0]
    assert messages[1].endswith("mixup here")
