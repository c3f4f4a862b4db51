"""The distillation loss and the Distiller's roles, checked against NumPy by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from components.config import ConfigError, from_dict, to_dict
from components.data import labels as label_lib
from components.data.augment import MixedLabels
from components.distillation import losses
from components.distillation import model as distillation
from components.distillation.losses import distillation_losses, soft_targets
from components.distillation.model import Distiller
from components.training import fit as training
from components.training import models
from pipelines.configs import load_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# float32 softmax / log-softmax against float64 NumPy.
RTOL, ATOL = 1e-5, 1e-5


def _np_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _np_losses(labels, student, teacher, alpha, t):
    """The loss written out by hand: cross-entropy at T=1, T^2-scaled KL at T."""
    student, teacher = student.astype(np.float64), teacher.astype(np.float64)
    hard = -np.log(_np_softmax(student)[np.arange(len(labels)), labels])
    p, q = _np_softmax(teacher / t), _np_softmax(student / t)
    soft = t * t * np.sum(p * (np.log(p) - np.log(q)), axis=-1)
    return (1 - alpha) * hard + alpha * soft, hard, soft


def _losses(labels, student, teacher, alpha, t):
    targets = soft_targets([tf.constant(teacher)], t)
    out = distillation_losses(tf.constant(labels), tf.constant(student), targets, alpha, t)
    return out.total.numpy(), out.hard.numpy(), out.soft.numpy()


@pytest.fixture(scope="module")
def logits():
    rng = np.random.default_rng(0)
    return (
        rng.integers(0, 5, size=8),
        rng.normal(0, 2, size=(8, 5)).astype(np.float32),
        rng.normal(0, 3, size=(8, 5)).astype(np.float32),
    )


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.5, 10.0])
def test_multiclass_loss_matches_hand_computation(logits, alpha, temperature):
    labels, student, teacher = logits
    got = _losses(labels, student, teacher, alpha, temperature)
    want = _np_losses(labels, student, teacher, alpha, temperature)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_alpha_edges_select_one_loss(logits):
    labels, student, teacher = logits
    total0, hard0, _ = _losses(labels, student, teacher, 0.0, 4.0)
    total1, _, soft1 = _losses(labels, student, teacher, 1.0, 4.0)
    np.testing.assert_array_equal(total0, hard0)
    np.testing.assert_array_equal(total1, soft1)
    # alpha = 0 ignores the teacher entirely.
    other_teacher = -teacher
    np.testing.assert_array_equal(_losses(labels, student, other_teacher, 0.0, 4.0)[0], total0)


def test_hard_loss_is_at_temperature_one(logits):
    labels, student, teacher = logits
    hard_hot = _losses(labels, student, teacher, 0.5, 20.0)[1]
    hard_one = _losses(labels, student, teacher, 0.5, 1.0)[1]
    np.testing.assert_allclose(hard_hot, hard_one, rtol=RTOL)


def test_temperature_one_soft_loss_is_plain_kl(logits):
    labels, student, teacher = logits
    p, q = _np_softmax(teacher.astype(np.float64)), _np_softmax(student.astype(np.float64))
    kl = np.sum(p * np.log(p / q), axis=-1)
    np.testing.assert_allclose(
        _losses(labels, student, teacher, 1.0, 1.0)[2], kl, rtol=RTOL, atol=ATOL
    )


@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_binary_loss_matches_bernoulli_form(temperature):
    """Two-logit softmax equals the sigmoid of the logit difference."""
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, size=16)
    student = rng.normal(0, 2, size=(16, 2)).astype(np.float32)
    teacher = rng.normal(0, 2, size=(16, 2)).astype(np.float32)
    alpha = 0.7

    def sigmoid(x):
        return 1.0 / (1.0 + np.exp(-x))

    ds, dt = (
        (student[:, 1] - student[:, 0]).astype(np.float64),
        (teacher[:, 1] - teacher[:, 0]).astype(np.float64),
    )
    hard = -np.log(np.where(labels == 1, sigmoid(ds), 1 - sigmoid(ds)))
    p, q = sigmoid(dt / temperature), sigmoid(ds / temperature)
    soft = temperature**2 * (p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q)))
    total, got_hard, got_soft = _losses(labels, student, teacher, alpha, temperature)
    np.testing.assert_allclose(got_hard, hard, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got_soft, soft, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(total, (1 - alpha) * hard + alpha * soft, rtol=RTOL, atol=ATOL)


def test_certain_teacher_gives_finite_loss_and_matching_student_gives_zero_kl():
    labels = np.array([0, 1])
    certain = np.array([[0.0, -1e4, -1e4], [-1e4, 0.0, -1e4]], np.float32)
    student = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], np.float32)
    total, _, soft = _losses(labels, student, certain, 0.5, 2.0)
    assert np.all(np.isfinite(total))
    np.testing.assert_allclose(_losses(labels, student, student, 1.0, 3.0)[2], 0.0, atol=1e-6)
    assert np.all(soft > 0)


def test_multi_teacher_targets_are_weighted_average_of_softened_probabilities():
    rng = np.random.default_rng(2)
    teachers = [rng.normal(0, 2, size=(6, 4)).astype(np.float32) for _ in range(3)]
    t = 3.0
    probs = [_np_softmax(z.astype(np.float64) / t) for z in teachers]
    got = soft_targets([tf.constant(z) for z in teachers], t).numpy()
    np.testing.assert_allclose(got, np.mean(probs, axis=0), rtol=RTOL, atol=1e-6)
    weights = [1.0, 2.0, 1.0]
    got = soft_targets([tf.constant(z) for z in teachers], t, weights).numpy()
    np.testing.assert_allclose(got, (probs[0] + 2 * probs[1] + probs[2]) / 4, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-6)


def _mlp(name, hidden, dropout=0.0, seed=0, features=6, classes=3):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((features,), name="x")
    x = keras.layers.Dense(hidden, activation="relu")(inp)
    if dropout:
        x = keras.layers.Dropout(dropout)(x)
    return keras.Model({"x": inp}, keras.layers.Dense(classes)(x), name=name)


def _data(n=64, features=6, classes=3, seed=3):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, features)).astype(np.float32)}, rng.integers(
        0, classes, size=n
    )


def test_distiller_teacher_targets_average_keras_teachers_in_inference_mode():
    teachers = [_mlp(f"t{i}", 32, dropout=0.5, seed=i) for i in range(2)]
    student = _mlp("s", 4, seed=9)
    distiller = Distiller(student, teachers, alpha=0.5, temperature=2.0, teacher_weights=[3.0, 1.0])
    x, _ = _data()
    got = distiller.teacher_targets(x).numpy()
    # Dropout is active only with training=True: inference is deterministic.
    np.testing.assert_array_equal(got, distiller.teacher_targets(x).numpy())
    probs = [_np_softmax(t(x, training=False).numpy().astype(np.float64) / 2.0) for t in teachers]
    np.testing.assert_allclose(got, 0.75 * probs[0] + 0.25 * probs[1], rtol=RTOL, atol=1e-6)


def test_training_step_changes_student_only():
    teacher = _mlp("teacher", 32, dropout=0.5, seed=1)
    student = _mlp("student", 4, seed=2)
    teacher_before = [w.copy() for w in teacher.get_weights()]
    student_before = [w.copy() for w in student.get_weights()]
    distiller = Distiller(student, [teacher], alpha=0.5, temperature=4.0)
    distiller.compile(optimizer=keras.optimizers.Adam(0.1))
    x, y = _data()
    history = distiller.fit(x, y, batch_size=16, epochs=1, verbose=0)
    for before, after in zip(teacher_before, teacher.get_weights(), strict=True):
        np.testing.assert_array_equal(before, after)
    assert all(
        not np.array_equal(b, a) for b, a in zip(student_before, student.get_weights(), strict=True)
    )
    # The optimizer keeps state for the student's variables only.
    assert {id(v) for v in distiller.trainable_variables} == {
        id(v) for v in student.trainable_variables
    }
    assert len(distiller.optimizer.variables) == 1 + 2 * len(student.trainable_variables)
    assert {"loss", "hard_loss", "soft_loss", "accuracy"} <= set(history.history)


def test_no_gradient_reaches_the_teacher():
    teacher = _mlp("teacher", 16, seed=1)
    student = _mlp("student", 4, seed=2)
    distiller = Distiller(student, [teacher], alpha=0.9, temperature=2.0)
    x, y = _data(n=8)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(teacher.trainable_variables)
        targets = distiller.teacher_targets(x)
        losses = distiller.compute_distillation_losses(y, student(x, training=True), targets)
        loss = tf.reduce_mean(losses.total)
    assert all(g is None for g in tape.gradient(loss, teacher.trainable_variables))
    assert all(g is not None for g in tape.gradient(loss, student.trainable_variables))
    assert not teacher.trainable


def test_reported_losses_are_the_batch_means():
    teacher, student = _mlp("teacher", 16, seed=1), _mlp("student", 4, seed=2)
    distiller = Distiller(student, [teacher], alpha=0.25, temperature=3.0)
    distiller.compile(optimizer=keras.optimizers.SGD(0.0))
    x, y = _data(n=32)
    result = distiller.evaluate(x, y, batch_size=32, return_dict=True, verbose=0)
    want_total, want_hard, want_soft = _np_losses(
        y, student(x).numpy(), teacher(x).numpy(), 0.25, 3.0
    )
    assert result["loss"] == pytest.approx(want_total.mean(), rel=1e-5)
    assert result["hard_loss"] == pytest.approx(want_hard.mean(), rel=1e-5)
    assert result["soft_loss"] == pytest.approx(want_soft.mean(), rel=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"alpha": 1.5, "temperature": 2.0}, r"distillation\.alpha: expected a number in \[0, 1\]"),
        (
            {"alpha": 0.5, "temperature": 2.0, "teacher_weights": [1.0, 2.0]},
            r"distillation\.teacher_weights: expected 1 weights",
        ),
    ],
)
def test_distiller_applies_the_config_rules(kwargs, match):
    # The rules themselves are tested once, through the config, below; this
    # checks a Distiller built in code applies them, counting the teachers it
    # is given.
    with pytest.raises(ValueError, match=match):
        Distiller(_mlp("s", 4), [_mlp("t", 8)], **kwargs)


def test_no_teacher_and_self_teaching_are_rejected():
    student = _mlp("s", 4)
    with pytest.raises(ValueError, match=r"no teacher"):
        Distiller(student, [], alpha=0.5, temperature=2.0)
    with pytest.raises(ValueError, match=r"student cannot be one of its own teachers"):
        Distiller(student, [student], alpha=0.5, temperature=2.0)


@pytest.mark.parametrize(
    "values, match",
    [
        ({"alpha": 1.01}, r"^distillation\.alpha: expected a number in \[0, 1\], got 1\.01"),
        ({"alpha": -0.1}, r"distillation\.alpha"),
        ({"temperature": 0}, r"^distillation\.temperature: expected a number > 0, got 0"),
        ({"temperature": -1.0}, r"distillation\.temperature"),
        ({"num_teachers": 0}, r"^distillation\.num_teachers: expected an integer in \[1, 8\]"),
        ({"num_teachers": 9}, r"^distillation\.num_teachers: expected an integer in \[1, 8\]"),
        (
            {"num_teachers": 1, "teacher_weights": [1.0, 2.0]},
            r"^distillation\.teacher_weights: expected 1 weights \(one per teacher\), got 2",
        ),
        (
            {"num_teachers": 2, "teacher_weights": [1.0, -1.0]},
            r"^distillation\.teacher_weights: expected non-negative weights with a positive sum",
        ),
    ],
)
def test_config_rejects_bad_distillation_values(values, match):
    data = to_dict(load_config("digits"))
    data["distillation"].update(values)
    with pytest.raises(ConfigError, match=match):
        from_dict(data)


@pytest.mark.parametrize("name", ["digits", "fashion_mnist"])
def test_shipped_students_are_at_most_a_tenth_of_their_teachers(name):
    """Counted on the real classifier builder with the configs' own shapes."""
    from components.training import models

    config = load_config(name)
    # Vocabulary sizes are only known after Transform; 200 ids per vocabulary
    # feature is above what the shipped taxi data produces.
    cards = {
        f.name: (f.num_buckets + 1 if f.effective_transform == "identity" else f.num_buckets or 200)
        for f in config.data.features
        if f.is_categorical
    }
    teacher = models.build_classifier(config.data, config.teacher, cards, "teacher")
    student = models.build_classifier(config.data, config.student, cards, "student")
    assert distillation.count_params(student.trainable_weights) * 10 <= distillation.count_params(
        teacher.trainable_weights
    )


_MIRRORED_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    import tf_keras as keras
    from components.distillation.model import Distiller

    def mlp(name, hidden, seed):
        keras.utils.set_random_seed(seed)
        inp = keras.Input((6,), name="x")
        h = keras.layers.Dense(hidden, activation="relu")(inp)
        return keras.Model({"x": inp}, keras.layers.Dense(3)(h), name=name)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 6)).astype("float32")
    y = rng.integers(0, 3, size=96)
    results = {}
    for kind, strategy in [("one", tf.distribute.OneDeviceStrategy("/cpu:0")),
                           ("mirrored", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))]:
        with strategy.scope():
            distiller = Distiller(mlp("student", 8, 2), [mlp("teacher", 32, 1)], alpha=0.7, temperature=3.0)
            distiller.compile(optimizer=keras.optimizers.SGD(0.5))
        ds = tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(32)
        history = distiller.fit(ds, epochs=2, verbose=0, shuffle=False)
        results[kind] = {
            "replicas": strategy.num_replicas_in_sync,
            "weights": [w.tolist() for w in distiller.student.get_weights()],
            "loss": history.history["loss"],
            "soft_loss": history.history["soft_loss"],
        }
    print(json.dumps(results))
    """
)


@pytest.mark.multiprocess
def test_mirrored_two_replicas_match_one_device_at_same_global_batch():
    """Losses are averaged over the global batch, so 2 replicas take the same steps."""
    proc = subprocess.run(
        [sys.executable, "-c", _MIRRORED_SCRIPT],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["mirrored"]["replicas"] == 2
    for one, mirrored in zip(
        results["one"]["weights"], results["mirrored"]["weights"], strict=True
    ):
        np.testing.assert_allclose(np.array(mirrored), np.array(one), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(results["mirrored"]["loss"], results["one"]["loss"], rtol=1e-5)
    np.testing.assert_allclose(
        results["mirrored"]["soft_loss"], results["one"]["soft_loss"], rtol=1e-5
    )


def _fit_weights(grad_accum_steps, cache=False, epochs=1):
    teacher, student = _mlp("teacher", 16, seed=1), _mlp("student", 4, seed=2)
    distiller = Distiller(student, [teacher], alpha=0.6, temperature=2.0, cache_targets=cache)
    distiller.compile(optimizer=keras.optimizers.SGD(0.5))
    distiller.grad_accum_steps = grad_accum_steps
    x, y = _data(n=64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32 // grad_accum_steps)
    if grad_accum_steps > 1:
        ds = ds.batch(grad_accum_steps)
    history = distiller.fit(ds, epochs=epochs, verbose=0)
    return student.get_weights(), history.history


def test_gradient_accumulation_matches_one_large_batch():
    """2 micro-batches of 16 make the same update as one batch of 32."""
    one, one_history = _fit_weights(1)
    accumulated, accumulated_history = _fit_weights(2)
    for a, b in zip(one, accumulated, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        accumulated_history["soft_loss"], one_history["soft_loss"], rtol=1e-5
    )


class _CountingTeacher:
    """A teacher callable that counts how many examples it was run on (eager)."""

    def __init__(self, model):
        self.model, self.examples = model, 0

    def __call__(self, features):
        self.examples += int(features["x"].shape[0])
        return self.model(features, training=False)


def test_cached_targets_skip_teachers_for_seen_examples_only():
    teacher = _CountingTeacher(_mlp("teacher", 16, seed=1))
    distiller = Distiller(
        _mlp("student", 4, seed=2), [teacher], alpha=0.5, temperature=2.0, cache_targets=True
    )
    x, _ = _data(n=16)
    first = distiller.teacher_targets(x).numpy()
    assert teacher.examples == 16
    np.testing.assert_array_equal(distiller.teacher_targets(x).numpy(), first)
    assert teacher.examples == 16
    # An unseen (e.g. augmented) example misses and is computed, never served stale.
    shifted = {"x": x["x"] + np.float32(0.5)}
    got = distiller.teacher_targets(shifted).numpy()
    assert teacher.examples == 32
    want = _np_softmax(teacher.model(shifted, training=False).numpy().astype(np.float64) / 2.0)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-6)


def test_cached_targets_train_exactly_like_uncached():
    plain, _ = _fit_weights(1, cache=False, epochs=3)
    cached, _ = _fit_weights(1, cache=True, epochs=3)
    for a, b in zip(plain, cached, strict=True):
        np.testing.assert_array_equal(a, b)
    accumulated, _ = _fit_weights(2, cache=True, epochs=3)
    for a, b in zip(plain, accumulated, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_feature_fingerprints_depend_on_every_feature():
    features = {
        "a": tf.constant([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]]),
        "b": tf.constant([[3], [3], [4]], tf.int64),
    }
    keys = label_lib.feature_fingerprints(features).numpy()
    assert keys.dtype == np.int64 and keys.shape == (3,)
    assert keys[0] == keys[1] != keys[2]


def test_unlabeled_examples_contribute_only_the_soft_term():
    """A mixed batch (one labeled, one from the unlabeled transfer set) against a hand computation."""
    alpha, temperature = 0.7, 2.0
    logits = np.array([[2.0, 0.5, -1.0], [0.3, 1.2, 0.1]], np.float32)
    teacher = np.array([[1.5, 0.2, -0.5], [0.0, 2.0, 0.4]], np.float32)
    labels = np.array([[0], [label_lib.UNLABELED]], np.int64)

    def softmax(z):
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    targets = softmax(teacher / temperature)
    soft = temperature**2 * np.sum(
        targets * (np.log(targets) - np.log(softmax(logits / temperature))), axis=-1
    )
    hard = np.array([-np.log(softmax(logits)[0, 0]), 0.0])
    expected = (1 - alpha) * hard + alpha * soft

    got = losses.distillation_losses(labels, logits, tf.constant(targets), alpha, temperature)
    np.testing.assert_allclose(got.hard.numpy(), hard, rtol=1e-5)
    np.testing.assert_allclose(got.soft.numpy(), soft, rtol=1e-5)
    np.testing.assert_allclose(got.total.numpy(), expected, rtol=1e-5)
    # The unlabeled example's total is its soft term alone (weighted by alpha).
    assert got.total.numpy()[1] == pytest.approx(alpha * soft[1], rel=1e-5)


def test_mixup_loss_with_an_unlabeled_example_matches_hand_computation():
    """A mixup batch (partners `perm = [2, 0, 1, 3]`, one example and one partner
    unlabeled) against NumPy: the Distiller's loss parts and the Trainer's hard loss."""
    alpha, temperature = 0.6, 2.0
    unlabeled = label_lib.UNLABELED
    own = np.array([0, unlabeled, 2, 1])
    perm = np.array([2, 0, 1, 3])
    lam = np.array([0.7, 0.4, 0.9, 0.5], np.float32)
    labels = MixedLabels(
        label=tf.constant(own[:, None]),
        partner=tf.constant(own[perm][:, None]),
        lam=tf.constant(lam),
    )
    # The (already mixed) inputs: the loss depends on the model's outputs only.
    x, _ = _data(n=4)
    teacher, student = _mlp("teacher", 16, seed=1), _mlp("student", 4, seed=2)
    logits = student(x).numpy().astype(np.float64)

    ce = -np.log(_np_softmax(logits))
    # Each part weighted by its share, 0 where its label is missing (not renormalised).
    hard = np.array(
        [
            0.7 * ce[0, 0] + 0.3 * ce[0, 2],  # own 0, partner 2
            0.6 * ce[1, 0],  # own unlabeled, partner 0
            0.9 * ce[2, 2],  # own 2, partner unlabeled
            0.5 * ce[3, 1] + 0.5 * ce[3, 1],  # own 1, partner 1
        ]
    )
    label_weight = np.array([1.0, 0.6, 0.9, 1.0])
    p = _np_softmax(teacher(x).numpy().astype(np.float64) / temperature)
    q = _np_softmax(logits / temperature)
    soft = temperature**2 * np.sum(p * (np.log(p) - np.log(q)), axis=-1)
    total = (1 - alpha) * hard + alpha * soft

    losses = distillation_losses(
        labels,
        tf.constant(logits, tf.float32),
        soft_targets([teacher(x)], temperature),
        alpha,
        temperature,
    )
    np.testing.assert_allclose(losses.hard.numpy(), hard, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(losses.total.numpy(), total, rtol=RTOL, atol=ATOL)

    batch = tf.data.Dataset.from_tensors((x, labels))
    distiller = Distiller(student, [teacher], alpha=alpha, temperature=temperature)
    distiller.compile(optimizer=keras.optimizers.SGD(0.0))
    reported = {k: v[0] for k, v in distiller.fit(batch, verbose=0).history.items()}
    assert reported["loss"] == pytest.approx(total.mean(), rel=RTOL)
    assert reported["soft_loss"] == pytest.approx(soft.mean(), rel=RTOL)
    # Reported per unit of label weight; accuracy on the example's own label.
    assert reported["hard_loss"] == pytest.approx(hard.sum() / label_weight.sum(), rel=RTOL)
    known = own >= 0
    assert reported["accuracy"] == pytest.approx(
        np.mean(np.argmax(logits, axis=1)[known] == own[known])
    )

    # The Trainer's model on the same network: its compiled hard loss, mean over the batch.
    classifier = models.Classifier(inputs=student.input, outputs=student.output)
    training.compile_classifier(classifier, load_config("digits"))
    trained = classifier.fit(batch, verbose=0).history
    assert trained["loss"][0] == pytest.approx(hard.mean(), rel=RTOL)
    assert trained["accuracy"][0] == pytest.approx(np.mean(np.argmax(logits, axis=1) == own))


def test_labeled_mask_keeps_about_the_fraction_and_is_a_function_of_the_example():
    rng = np.random.default_rng(0)
    features = {"x": tf.constant(rng.normal(size=(4000, 3)).astype("float32"))}
    mask = label_lib.labeled_mask(features, 0.1).numpy()
    assert 0.08 < mask.mean() < 0.12
    # The same example gets the same decision in another batch (another order).
    reversed_mask = label_lib.labeled_mask({"x": features["x"][::-1]}, 0.1).numpy()
    np.testing.assert_array_equal(mask, reversed_mask[::-1])
    assert label_lib.labeled_mask(features, 1.0).numpy().all()
