"""One-byte codes of float features (`components.data.codes`): codebooks, encode, decode."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from components.data import codes

# Z-scored 8-bit pixels, computed as the Transform does (float32 throughout).
PIXELS = np.arange(256, dtype=np.float32) / np.float32(255.0)
ZSCORED = ((PIXELS - np.float32(0.2860)) / np.float32(0.3530)).astype(np.float32)


def test_add_collects_sorted_distinct_values_and_stops_past_the_limit():
    book = codes.add(np.empty(0, np.float32), np.array([3.0, 1.0, 3.0, 2.0]))
    np.testing.assert_array_equal(book, [1.0, 2.0, 3.0])
    assert codes.add(book, np.array([2.0, 1.0])) is book  # nothing new: no copy
    np.testing.assert_array_equal(codes.add(book, np.array([0.5])), [0.5, 1.0, 2.0, 3.0])
    full = codes.add(np.empty(0, np.float32), np.arange(256, dtype=np.float32))
    assert full.size == 256
    assert codes.add(full, np.array([1000.0])) is None
    assert codes.add(None, np.array([1.0])) is None
    assert codes.add(book, np.array([np.nan])) is None
    assert codes.add(book, np.array([np.inf])) is None


def test_merge_is_the_union_or_none():
    a = np.array([1.0, 2.0], np.float32)
    b = np.array([2.0, 5.0], np.float32)
    np.testing.assert_array_equal(codes.merge([a, b]), [1.0, 2.0, 5.0])
    assert codes.merge([a, None]) is None
    halves = [np.arange(0, 200, dtype=np.float32), np.arange(100, 300, dtype=np.float32)]
    assert codes.merge(halves) is None


@pytest.mark.parametrize(
    "values",
    [[], [2.0, 1.0], [1.0, 1.0], [0.0, float("nan")], [0.1], list(range(257))],
    ids=["empty", "unsorted", "repeated", "nan", "not-float32", "too-many"],
)
def test_check_book_refuses_what_is_not_a_codebook(values):
    with pytest.raises(ValueError, match="codebook of 'image'"):
        codes.check_book("image", values)


@pytest.mark.parametrize(
    "book",
    [
        ZSCORED,
        np.array([-1.5, 0.25, 7.0, 100.0], np.float32),  # not evenly spaced: binary search
        np.array([0.5], np.float32),
    ],
    ids=["zscored-pixels", "uneven", "one-value"],
)
def test_encode_then_decode_is_exact(book):
    rng = np.random.default_rng(0)
    x = book[rng.integers(0, book.size, size=(64, 28, 28, 1))]
    coded = codes.encoder("image", book)(tf.constant(x))
    assert coded.dtype == tf.uint8
    np.testing.assert_array_equal(coded.numpy(), np.searchsorted(book, x))
    decoded = codes.decode(coded, tf.constant(book)).numpy()
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded, x)


def test_zscored_pixels_take_the_multiply_add_path():
    assert codes._affine(ZSCORED) is not None
    assert codes._affine(np.array([-1.5, 0.25, 7.0, 100.0], np.float32)) is None


@pytest.mark.parametrize("book", [ZSCORED, np.array([-1.5, 0.25, 7.0], np.float32)])
def test_a_value_outside_the_codebook_fails_naming_the_feature(book):
    # A value between two entries: rounding would hide it.
    x = tf.constant([[book[0], (book[0] + book[1]) / 2]], tf.float32)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="feature `image` holds a value outside"
    ):
        codes.encoder("image", book)(x)


@pytest.mark.parametrize("value", [-100.0, 100.0, 1e30, float("nan")])
def test_a_value_past_the_codebooks_ends_fails_too(value):
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature `image`"):
        codes.encoder("image", ZSCORED)(tf.constant([ZSCORED[5], value], tf.float32))


def test_an_unchecked_encoder_skips_the_check():
    # What the workers run on values read from the recorded files.
    x = tf.constant([ZSCORED[7], ZSCORED[9]], tf.float32)
    np.testing.assert_array_equal(codes.encoder("image", ZSCORED, checked=False)(x), [7, 9])
    out = codes.encode_features({"image": x}, {"image": ZSCORED}, checked=False)
    np.testing.assert_array_equal(out["image"].numpy(), [7, 9])


def test_encoding_in_a_dataset_fails_the_read_on_an_unknown_value():
    book = np.array([0.0, 1.0], np.float32)
    ds = tf.data.Dataset.from_tensor_slices(np.array([[0.0, 1.0], [1.0, 0.5]], np.float32))
    ds = ds.map(codes.encoder("pixels", book))
    it = iter(ds)
    np.testing.assert_array_equal(next(it).numpy(), [0, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature `pixels`"):
        next(it)


def test_encode_features_codes_only_the_features_with_a_book():
    features = {"image": tf.constant([ZSCORED[:3]]), "other": tf.constant([[0.3]])}
    out = codes.encode_features(features, {"image": ZSCORED})
    np.testing.assert_array_equal(out["image"].numpy(), [[0, 1, 2]])
    assert out["other"] is features["other"]


def test_decoding_step_decodes_codes_and_passes_values_through():
    seen = []

    def step(data):
        seen.append(data)
        return {}

    train_step = codes.decoding_step(step, {"image": ZSCORED})
    label = tf.constant([1])
    train_step(({"image": tf.constant([[0, 255]], tf.uint8), "n": tf.constant([2])}, label))
    features, got_label = seen[-1]
    np.testing.assert_array_equal(features["image"].numpy(), [[ZSCORED[0], ZSCORED[255]]])
    assert features["n"].numpy().tolist() == [2]
    assert got_label is label
    values = ({"image": tf.constant([[ZSCORED[3]]])}, label, tf.constant([1.0]))
    train_step(values)
    assert seen[-1] is values


def test_zeros_of_both_signs_give_no_codebook_and_one_sign_keeps_its_bits():
    assert codes.add(np.array([0.0, 1.0], np.float32), np.array([-0.0], np.float32)) is None
    assert codes.add(np.empty(0, np.float32), np.array([-0.0, 0.0], np.float32)) is None
    book = codes.add(np.empty(0, np.float32), np.array([-0.0, 2.0], np.float32))
    assert np.signbit(book[0]) and book[0] == 0
    decoded = codes.decode(codes.encoder("x", book)(tf.constant([-0.0, 2.0])), tf.constant(book))
    assert np.signbit(decoded.numpy()[0])
