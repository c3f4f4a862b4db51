"""Batch augmentation: random views of images, and mixup (no TFX types).

`augment_images` (`random_views`: shifts and flips) and `mixup` transform whole training
batches, vectorised; a mixed batch carries `MixedLabels` instead of a label tensor, and
the losses read its two labels and their weights from `label_terms`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import tensorflow as tf

# Images at most this many pixels high and wide take their views as two one-hot matrix
# products per image (a batched matmul); larger ones, or integer images, as two gathers.
# On one core the products were faster up to side 192 (2.3x at 28, 1.2x at 192) and slower
# at 256, where their cost, which grows with the side, passes the gathers'
# (`benchmarks/augment.py`, its `path` lines).
MATMUL_MAX_SIDE = 192


def random_translate(images: tf.Tensor, max_pixels: int, seed: tf.Tensor) -> tf.Tensor:
    """Shifts each image by up to `max_pixels` in each direction (`random_views` without flip).

    Args:
      images: `[batch, height, width, channels]`.
      max_pixels: Largest shift per axis (0 returns `images`).
      seed: A stateless-random seed, shape `[2]` int.
    """
    if max_pixels == 0:
        return images
    return random_views(images, max_pixels=max_pixels, flip=False, translate_seed=seed)


def random_flip(images: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Mirrors each image left-right with probability 1/2 (`random_views` without shifts)."""
    return random_views(images, max_pixels=0, flip=True, flip_seed=seed)


def random_views(
    images: tf.Tensor,
    *,
    max_pixels: int,
    flip: bool,
    translate_seed: tf.Tensor | None = None,
    flip_seed: tf.Tensor | None = None,
) -> tf.Tensor:
    """Shifts each image by up to `max_pixels` per axis, then mirrors it left-right with
    probability 1/2: every output pixel is one input pixel, or the image's background.

    A shift and a flip only move pixels, so the view is a permutation (with fill): output
    pixel `(y, x)` reads input pixel `(rows[y], cols[x])`, where `rows = y - dy` and `cols =
    x - dx`, reversed when flipped. It is computed as two exact one-hot matrix products per
    image (`R @ image @ C^T`; see `MATMUL_MAX_SIDE`) or two gathers, never a projective warp.

    Pixels shifted in take the image's darkest value, its background: after
    z-scoring, 0 is the mean grey, not the background, and a fill that eval
    images never show would shift the training distribution.

    The draws are those of the projective-warp version this replaced, seed for seed (the
    shifts uniform in `[-max_pixels, max_pixels]^2`, the flips Bernoulli(1/2)), so a seeded
    run sees the same views. In the matmul form a non-finite pixel spreads along its row and
    column (`0 * inf` is NaN); transformed features are finite.

    Args:
      images: `[batch, height, width, channels]`.
      max_pixels: Largest shift per axis (0: none).
      flip: Random left-right mirroring.
      translate_seed: Stateless seed `[2]` of the shifts (needed when `max_pixels > 0`).
      flip_seed: Stateless seed `[2]` of the flips (needed with `flip`).

    Returns:
      The views, same shape and dtype.
    """
    if max_pixels == 0 and not flip:
        return images
    batch = tf.shape(images)[0]
    height, width = tf.shape(images)[1], tf.shape(images)[2]
    rows = tf.broadcast_to(tf.range(height)[None, :], [batch, height])
    cols = tf.broadcast_to(tf.range(width)[None, :], [batch, width])
    if max_pixels:
        shifts = tf.random.stateless_uniform(
            [batch, 2], translate_seed, minval=-max_pixels, maxval=max_pixels + 1, dtype=tf.int32
        )
        # Output pixel (x, y) reads input pixel (x - dx, y - dy).
        cols, rows = cols - shifts[:, 0:1], rows - shifts[:, 1:2]
    if flip:
        flipped = tf.random.stateless_uniform([batch], flip_seed) < 0.5
        cols = tf.where(flipped[:, None], tf.reverse(cols, axis=[1]), cols)
    rows_inside = (rows >= 0) & (rows < height)
    cols_inside = (cols >= 0) & (cols < width)
    inside = rows_inside[:, :, None, None] & cols_inside[:, None, :, None]
    background = tf.reduce_min(images, axis=[1, 2, 3], keepdims=True)
    return tf.where(inside, _permuted(images, rows, cols), background)


def _permuted(images: tf.Tensor, rows: tf.Tensor, cols: tf.Tensor) -> tf.Tensor:
    """`images[b, rows[b, y], cols[b, x], :]` where the indices are in range; out-of-range
    reads are left to the caller's fill (0 from a product, a border pixel from a gather)."""
    height, width = images.shape[1], images.shape[2]
    small = height is not None and width is not None and max(height, width) <= MATMUL_MAX_SIDE
    if small and images.dtype.is_floating:
        # On the CPU, where a product with a one-hot matrix is exact: a GPU multiplies
        # float32 matrices in TF32 by default (a 10-bit mantissa), which would round every
        # pixel. The input pipeline runs on the CPU anyway; this holds for eager calls too.
        with tf.device("/CPU:0"):
            # One-hot rows of an out-of-range index are all zero: its pixels come out 0.
            row_matrix = tf.one_hot(rows, height, dtype=images.dtype)  # [b, h, h]
            col_matrix = tf.one_hot(cols, width, dtype=images.dtype)  # [b, w, w]
            channels_first = tf.transpose(images, [0, 3, 1, 2])  # [b, c, h, w]
            moved = tf.matmul(
                tf.matmul(row_matrix[:, None], channels_first),
                col_matrix[:, None],
                transpose_b=True,
            )
            return tf.transpose(moved, [0, 2, 3, 1])
    last_row, last_col = tf.shape(images)[1] - 1, tf.shape(images)[2] - 1
    moved = tf.gather(images, tf.clip_by_value(rows, 0, last_row), axis=1, batch_dims=1)
    return tf.gather(moved, tf.clip_by_value(cols, 0, last_col), axis=2, batch_dims=1)


def augment_images(
    features: Mapping[str, tf.Tensor],
    shapes: Mapping[str, Sequence[int]],
    *,
    translate: int,
    flip: bool,
    seed: tf.Tensor,
) -> dict[str, tf.Tensor]:
    """Augments the image-shaped features of one batch; other features pass through.

    Args:
      features: Transformed features of a batch; image features are flat
        `[batch, prod(shape)]`, as Transform writes them.
      shapes: Transformed feature name -> image shape `[height, width, channels]`.
      translate: Largest random shift in pixels (0: none).
      flip: Random left-right mirroring.
      seed: Stateless seed `[2]` for this batch.

    Returns:
      A new dict with the same keys, shapes and dtypes.
    """
    out = dict(features)
    for i, (key, shape) in enumerate(sorted(shapes.items())):
        flat = features[key]
        images = tf.reshape(flat, [-1, *shape])
        key_seed = tf.random.experimental.stateless_fold_in(seed, i)
        images = random_views(
            images,
            max_pixels=translate,
            flip=flip,
            translate_seed=tf.random.experimental.stateless_fold_in(key_seed, 0),
            flip_seed=tf.random.experimental.stateless_fold_in(key_seed, 1),
        )
        out[key] = tf.reshape(images, tf.shape(flat))
    return out


def input_noise(
    features: Mapping[str, tf.Tensor], keys: Sequence[str], stddev: float, seed: tf.Tensor
) -> dict[str, tf.Tensor]:
    """Adds Gaussian noise of `stddev` to the float features `keys` of one batch.

    Args:
      features: Transformed features of a batch.
      keys: The tabular float features to perturb (others pass through).
      stddev: Standard deviation, in the features' transformed units.
      seed: Stateless seed `[2]` for this batch.
    """
    out = dict(features)
    for i, key in enumerate(sorted(keys)):
        x = features[key]
        noise = standard_normal(tf.shape(x), tf.random.experimental.stateless_fold_in(seed, i))
        out[key] = x + tf.cast(stddev * noise, x.dtype)
    return out


def standard_normal(shape: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Stateless N(0, 1) float32 draws at about 3x `tf.random.stateless_normal`'s rate on a CPU.

    Box-Muller on raw Philox bits, two draws from each pair: the radius from 24 random bits
    (`u = (k + 1/2) / 2^24`, so `|z| <= sqrt(2 ln 2^25)`, about 5.9: the normal's mass beyond
    is 4e-9), the angle from 16 (`2^16` directions). `stateless_normal` spends a Philox word
    on each uniform and its transform is generic; this spends 3 words on 4 draws.

    Args:
      shape: Shape of the result.
      seed: Stateless seed `[2]`.
    """
    count = tf.reduce_prod(shape)
    pairs = (count + 1) // 2
    radius_seed, angle_seed = (tf.random.experimental.stateless_fold_in(seed, i) for i in (0, 1))
    radius_bits = tf.random.stateless_uniform(
        [pairs], radius_seed, minval=None, maxval=None, dtype=tf.uint32
    )
    angle_bits = tf.random.stateless_uniform(
        [(pairs + 1) // 2], angle_seed, minval=None, maxval=None, dtype=tf.uint32
    )
    angle_halves = tf.concat(
        [tf.bitwise.bitwise_and(angle_bits, 0xFFFF), tf.bitwise.right_shift(angle_bits, 16)], 0
    )[:pairs]
    uniform = (tf.cast(tf.bitwise.right_shift(radius_bits, 8), tf.float32) + 0.5) * 2.0**-24
    radius = tf.sqrt(-2.0 * tf.math.log(uniform))
    angle = tf.cast(angle_halves, tf.float32) * (2.0 * math.pi / 2.0**16)
    draws = tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], 0)[:count]
    return tf.reshape(draws, shape)


class MixedLabels(NamedTuple):
    """The labels of a mixed batch (see `mixup`), in place of its label tensor.

    Attributes:
      label: The example's own labels, as without mixup (integer class ids,
        `[batch]` or `[batch, 1]`; negative for an example without a label).
      partner: The partner's labels, `label[perm]`, same shape and dtype.
      lam: float32 `[batch]`, the weight of the example's own features and label.
    """

    label: tf.Tensor
    partner: tf.Tensor
    lam: tf.Tensor


class SoftLabels(NamedTuple):
    """Target class distributions in place of a label tensor (Noisy Student's soft
    pseudo-labels): the loss is the cross-entropy against `targets`.

    Attributes:
      label: Integer class ids, `[batch]` or `[batch, 1]`: the true label of
        a labeled example, the most likely class of a pseudo-labeled one
        (what training accuracy scores).
      targets: float32 `[batch, classes]`, rows summing to 1 (one-hot for a
        labeled example).
    """

    label: tf.Tensor
    targets: tf.Tensor


def sample_beta(alpha: float, shape: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Stateless draws from Beta(alpha, alpha), float32 in [0, 1].

    `G1 / (G1 + G2)` for `G ~ Gamma(alpha)`, computed from log-gammas:
    below alpha of about 0.1 a float Gamma(alpha) draw often underflows to 0
    (and 0 / 0 is NaN), so `log G = log G' + log(U) / alpha` with
    `G' ~ Gamma(alpha + 1)` and `U ~ Uniform(0, 1]` (Marsaglia & Tsang 2000)
    keeps every draw finite; then `lam = sigmoid(log G1 - log G2)`.

    Args:
      alpha: Concentration > 0.
      shape: Shape of the result.
      seed: Stateless seed `[2]`.
    """
    seeds = [tf.random.experimental.stateless_fold_in(seed, i) for i in range(4)]
    log_gammas = []
    for boosted, uniform in ((seeds[0], seeds[1]), (seeds[2], seeds[3])):
        gamma = tf.random.stateless_gamma(shape, boosted, alpha=alpha + 1.0, dtype=tf.float64)
        # stateless_uniform is in [0, 1): 1 - u is in (0, 1], whose log is finite.
        u = 1.0 - tf.random.stateless_uniform(shape, uniform, dtype=tf.float64)
        log_gammas.append(tf.math.log(gamma) + tf.math.log(u) / alpha)
    return tf.cast(tf.sigmoid(log_gammas[0] - log_gammas[1]), tf.float32)


def mixup(
    features: Mapping[str, tf.Tensor],
    labels: tf.Tensor,
    dense: Sequence[str],
    alpha: float,
    seed: tf.Tensor,
) -> tuple[dict[str, tf.Tensor], MixedLabels]:
    """Mixes one batch with a permutation of itself.

    Args:
      features: Transformed features of a batch (leading batch dimension).
      labels: Integer class ids of the batch (negative: no label).
      dense: Keys of the float features to mix; every other feature (the
        integer ids of categoricals, which have no meaningful average) keeps
        the example's own value.
      alpha: Concentration of Beta(alpha, alpha), > 0.
      seed: Stateless seed `[2]` for this batch.

    Returns:
      `(mixed features, MixedLabels)`: features with the same keys, shapes
      and dtypes, `x[k][i] = lam[i] * x[k][i] + (1 - lam[i]) * x[k][perm[i]]`
      for every key in `dense`, and the labels of both parts with `lam`.
    """
    batch = tf.shape(labels)[0]
    lam = sample_beta(alpha, [batch], tf.random.experimental.stateless_fold_in(seed, 0))
    perm = tf.random.experimental.stateless_shuffle(
        tf.range(batch), tf.random.experimental.stateless_fold_in(seed, 1)
    )
    out = dict(features)
    for key in dense:
        x = features[key]
        weight = tf.reshape(tf.cast(lam, x.dtype), [-1] + [1] * (x.shape.rank - 1))
        out[key] = weight * x + (1 - weight) * tf.gather(x, perm)
    return out, MixedLabels(label=labels, partner=tf.gather(labels, perm), lam=lam)


def label_terms(
    labels: tf.Tensor | MixedLabels | SoftLabels,
) -> list[tuple[tf.Tensor, tf.Tensor]]:
    """The hard-label loss as weighted terms: `loss_i = sum_t w_t[i] * CE(ids_t[i], logits_i)`.

    A plain label tensor is one term of weight 1 (0 for a negative,
    unlabeled, example); `MixedLabels` are two: the example's own label with
    weight `lam`, its partner's with `1 - lam`, each 0 where that label is
    missing. A missing label's share is dropped, not given to the other
    label: that label describes only its own share of the mixed input.
    `SoftLabels` are one term per class c, of weight `targets[:, c]`: the
    sum is the cross-entropy against the target distribution.

    Args:
      labels: Integer class ids (`[batch]` or `[batch, 1]`), `MixedLabels` or
        `SoftLabels`.

    Returns:
      `(class ids, weights)` pairs: int64 `[batch]` ids (missing labels as 0,
      a valid id, so the cross-entropy stays finite) and float32 `[batch]`
      weights.
    """
    if isinstance(labels, SoftLabels):
        batch = tf.shape(labels.targets)[0]
        return [
            (tf.fill([batch], tf.constant(c, tf.int64)), labels.targets[:, c])
            for c in range(int(labels.targets.shape[-1]))
        ]
    if isinstance(labels, MixedLabels):
        parts = ((labels.label, labels.lam), (labels.partner, 1.0 - labels.lam))
    else:
        parts = ((labels, 1.0),)
    terms = []
    for ids, weight in parts:
        ids = tf.reshape(tf.cast(ids, tf.int64), [-1])
        known = tf.cast(ids >= 0, tf.float32)
        terms.append((tf.maximum(ids, 0), known * weight))
    return terms


def own_labels(labels: tf.Tensor | MixedLabels | SoftLabels) -> tf.Tensor:
    """The example's own labels (what training accuracy scores), mixed or soft or not."""
    return labels.label if isinstance(labels, (MixedLabels, SoftLabels)) else labels
