"""Batch augmentation of image-shaped features (no TFX types).

Applied to the transformed training batches in the input pipeline, before
they reach the model, so that in distillation the frozen teachers and the
student see exactly the same augmented view of every example ("function
matching", Beyer et al. 2022, "Knowledge distillation: A good teacher is
patient and consistent"). Evaluation data is never augmented.

Every op is vectorised over the batch (one projective transform for all
images, one `tf.where` for flips), so augmentation costs a few ops per
batch, not a `map_fn` per image.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf


def random_translate(images: tf.Tensor, max_pixels: int, seed: tf.Tensor) -> tf.Tensor:
    """Shifts each image by up to `max_pixels` in each direction.

    Pixels shifted in take the image's darkest value, its background: after
    z-scoring, 0 is the mean grey, not the background, and a fill that eval
    images never show would shift the training distribution.

    Args:
      images: `[batch, height, width, channels]` floats.
      max_pixels: Largest shift per axis (0 returns `images`).
      seed: A stateless-random seed, shape `[2]` int.

    Returns:
      The shifted images, same shape and dtype.
    """
    if max_pixels == 0:
        return images
    batch = tf.shape(images)[0]
    shifts = tf.random.stateless_uniform(
        [batch, 2], seed, minval=-max_pixels, maxval=max_pixels + 1, dtype=tf.int32
    )
    shifts = tf.cast(shifts, tf.float32)
    ones, zeros = tf.ones([batch], tf.float32), tf.zeros([batch], tf.float32)
    # Output pixel (x, y) reads input pixel (x - dx, y - dy).
    transforms = tf.stack(
        [ones, zeros, -shifts[:, 0], zeros, ones, -shifts[:, 1], zeros, zeros], axis=1
    )
    shape = tf.shape(images)[1:3]
    # The op fills with one constant for the whole batch: shift every image
    # so that its own background is 0, transform, and shift back.
    background = tf.reduce_min(images, axis=[1, 2, 3], keepdims=True)
    moved = tf.raw_ops.ImageProjectiveTransformV3(
        images=images - background,
        transforms=transforms,
        output_shape=shape,
        fill_value=0.0,
        interpolation="NEAREST",
        fill_mode="CONSTANT",
    )
    return moved + background


def random_flip(images: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Mirrors each image left-right with probability 1/2."""
    batch = tf.shape(images)[0]
    flip = tf.random.stateless_uniform([batch], seed) < 0.5
    return tf.where(flip[:, None, None, None], tf.reverse(images, axis=[2]), images)


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
        images = random_translate(
            images, translate, tf.random.experimental.stateless_fold_in(key_seed, 0)
        )
        if flip:
            images = random_flip(images, tf.random.experimental.stateless_fold_in(key_seed, 1))
        out[key] = tf.reshape(images, tf.shape(flat))
    return out
