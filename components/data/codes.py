"""Exact one-byte codes for float features of at most 256 distinct values.

A z-scored 8-bit pixel takes one of 256 float32 values, yet it is stored and sent
as four bytes. The tfxkit Transform's writer records every dense float feature's
distinct values while there are at most `MAX_CODES` of them (`add`: the feature's
codebook, sorted, in the layout record). The tf.data service's workers can then
send each value as its index in the codebook (`encoder`: one byte instead of
four, checked against the codebook so that a value outside it fails naming the
feature instead of being rounded), and the training step turns the indices
back into the values (`decode`: a gather, on the accelerator where there is
one). Exact: `decode(encode(x)) == x` for every value the codebook holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

# Codes are uint8.
MAX_CODES = 256


def add(book: np.ndarray | None, values: np.ndarray) -> np.ndarray | None:
    """`book` (sorted distinct float32 values) with `values` added; None past `MAX_CODES`.

    None (a feature already past the limit) stays None; a non-finite value makes
    it None too (NaN has no index), and so do zeros of both signs (one entry
    could not give back both bit patterns). Values are compared bit for bit.
    """
    if book is None:
        return None
    values = np.asarray(values, np.float32).reshape(-1)
    if not values.size:
        return book
    if book.size:
        found = book[_indices(book, values)]
        values = values[found.view(np.uint32) != values.view(np.uint32)]
        if not values.size:
            return book
    if not np.isfinite(values).all():
        return None
    zeros = np.concatenate([book[book == 0], values[values == 0]])
    if np.signbit(zeros).any() and not np.signbit(zeros).all():
        return None
    merged = np.union1d(book, np.unique(values)).astype(np.float32)
    return merged if merged.size <= MAX_CODES else None


def _indices(book: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Where each of `values` is in `book` if it is there (some index otherwise): a
    multiply-add where the book is evenly spaced (as `encoder`), else a binary search."""
    affine = _affine(book)
    if affine is None:
        return np.minimum(np.searchsorted(book, values), book.size - 1)
    found = np.rint(values * np.float32(affine[0]) + np.float32(affine[1]))
    return np.clip(np.nan_to_num(found), 0, book.size - 1).astype(np.intp)


def merge(books: Sequence[np.ndarray | None]) -> np.ndarray | None:
    """The union of several codebooks (None when any is None or the union is past the limit)."""
    out: np.ndarray | None = np.empty(0, np.float32)
    for book in books:
        out = None if book is None else add(out, book)
    return out


def check_book(name: str, values: Sequence[float]) -> np.ndarray:
    """`values` as a codebook, or ValueError naming the feature when they are not one."""
    book = np.asarray(values, np.float32)
    if (
        book.ndim != 1
        or not 1 <= book.size <= MAX_CODES
        or not np.isfinite(book).all()
        or np.any(np.diff(book) <= 0)
        or not np.array_equal(book.astype(np.float64), np.asarray(values, np.float64))
    ):
        raise ValueError(
            f"codebook of {name!r}: expected 1 to {MAX_CODES} increasing finite float32 values"
        )
    return book


def _affine(book: np.ndarray) -> tuple[float, float] | None:
    """`(scale, offset)` with `round(book * scale + offset) == index` for every entry
    (an evenly spaced codebook: a multiply-add finds the code), else None."""
    if book.size == 1:
        return 0.0, 0.0
    scale = np.float32((book.size - 1) / (float(book[-1]) - float(book[0])))
    offset = np.float32(-float(book[0]) * float(scale))
    found = np.round(book * scale + offset)
    return (float(scale), float(offset)) if np.array_equal(found, np.arange(book.size)) else None


def encoder(name: str, book: np.ndarray, checked: bool = True) -> Callable[[tf.Tensor], tf.Tensor]:
    """A function from float32 values of feature `name` to their uint8 codes in `book`.

    A multiply-add and a round where the codebook is evenly spaced (z-scored
    pixels), a binary search otherwise. `checked`: every code is decoded again
    and compared, so a value the codebook does not hold (a view that made a new
    value) fails the read with an error naming the feature, never a rounded
    value. The check is a gather, which costs a CPU more than the encode
    (`benchmarks/results/service_codes.json`); values read from the files the
    codebook was recorded from need none (`ingestion` checks the files against
    the layout record, and each record against its CRC).
    """
    table = tf.constant(book)
    affine = _affine(book)

    def encode(x: tf.Tensor) -> tf.Tensor:
        if affine is not None:
            # Unclipped: a value past either end casts to some code whose entry is not
            # that value, which the check below refuses.
            index = tf.round(x * affine[0] + affine[1])
        else:
            flat = tf.searchsorted(table, tf.reshape(x, [-1]), out_type=tf.int32)
            index = tf.reshape(tf.minimum(flat, book.size - 1), tf.shape(x))
        codes = tf.cast(index, tf.uint8)
        if not checked:
            return codes
        exact = tf.debugging.assert_equal(
            decode(codes, table),
            x,
            message=(
                f"ingestion.service.codes: feature `{name}` holds a value outside the codebook "
                "the Transform recorded (re-run the Transform, or set ingestion.service.codes: off)"
            ),
            summarize=4,
        )
        with tf.control_dependencies([exact]):
            return tf.identity(codes)

    return encode


def decode(codes: tf.Tensor, table: tf.Tensor) -> tf.Tensor:
    """The float32 values of uint8 `codes` in `table` (a codebook as a tensor)."""
    return tf.gather(table, tf.cast(codes, tf.int32))


def encode_features(
    features: Mapping[str, tf.Tensor], books: Mapping[str, np.ndarray], checked: bool = True
) -> dict[str, tf.Tensor]:
    """`features` with every feature of `books` replaced by its codes (see `encoder`)."""
    out = dict(features)
    for name, book in books.items():
        out[name] = encoder(name, book, checked)(out[name])
    return out


def decoding_step(step: Callable, books: Mapping[str, np.ndarray]) -> Callable:
    """A Keras `train_step` that decodes the coded features of `books`, then runs `step`.

    `data` is `(features, label[, weights])` as the dataset yields it; a feature
    is decoded where it arrives as codes (uint8; the step is traced per input
    signature) and left as it is otherwise. The decode runs inside the
    replicated step, so on the device that trains.
    """
    names = sorted(books)

    def train_step(data):
        features, *rest = data
        if not isinstance(features, Mapping):
            return step(data)
        coded = [n for n in names if n in features and features[n].dtype == tf.uint8]
        if not coded:
            return step(data)
        features = dict(features)
        for name in coded:
            features[name] = decode(features[name], tf.constant(books[name]))
        return step((features, *rest))

    return train_step
