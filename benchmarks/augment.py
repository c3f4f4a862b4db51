"""Training-batch augmentation on one CPU core: the image views against the projective warp
they replaced, mixup and input noise, on Fashion-MNIST batches.

One process pinned to one core (`--cpu`, default 0; TensorFlow's op pools at one thread),
the 60,000 Fashion-MNIST training images as flat float32 `[batch, 784]` batches, as the
Transform writes them. Sides, each a `tf.data` pipeline iterated for `--batches` batches
after `--warmup` (the map at `AUTOTUNE` parallelism, as `training.inputs.augmented` runs it):

- `plain`: the batches from memory, no augmentation (the pipeline's own limit);
- `views`: `augment.augment_images`, translate 2 + flip (the teachers' views,
  `pipelines/configs/fashion_mnist.yaml`): one-hot products, exact pixel moves;
- `warp`: the same draws through `ImageProjectiveTransformV3`, the op `views` replaced
  (`warp_views` below, as it was at 1f6bd4c's `components/data/augment.py`);
- `mixup`: `augment.mixup` at alpha 0.2 on the image feature;
- `noise`: `augment.input_noise` at stddev 0.1 on the image feature (the product puts
  noise on tabular features; 784 floats an example is the harder case), its draws from
  `augment.standard_normal`; `noise_old`: the same from `tf.random.stateless_normal`,
  which it used before;
- `reader_plain`, `reader_views`: the product's reader (`ingestion.make_dataset`, no
  cache: every epoch parsed) over the images written as the Transform writes them
  (`tfdata_service.write_data`), without and with the views.

Sides run in an order rotated every round over `--rounds` rounds; `views / warp` is a
per-round ratio, given as a geometric mean with a 95% t interval, and each side's rate as
a mean with its t interval. `path` lines time the two ways `random_views` computes a view
(one-hot products, gathers) at sides 28, 96, 192 and 256, which is where `MATMUL_MAX_SIDE` comes
from. The target: `views`, `mixup` and `noise` >= 200,000 images/s each (what a 61k conv
net consumes on an H100 at batch 2048). JSON lines; the headline last:
`augmented_images_per_s_one_core`, `plain_images_per_s_one_core`,
`augmented_over_old_op`; results in `benchmarks/results/augment.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

IMAGE = "image_xf"
SHAPE = (28, 28, 1)
TRANSLATE, FLIP = 2, True
MIXUP_ALPHA, NOISE_STDDEV = 0.2, 0.1
TARGET_IMAGES_PER_S = 200_000
SIDES = ("plain", "views", "warp", "mixup", "noise", "noise_old", "reader_plain", "reader_views")
PATH_SIDES = (28, 96, 192, 256)
HEADLINE_KEYS = (
    "augmented_images_per_s_one_core",
    "plain_images_per_s_one_core",
    "augmented_over_old_op",
)


def warp_views(images, max_pixels: int, translate_seed, flip_seed):
    """The views as they were before one-hot products: the same draws, one
    `ImageProjectiveTransformV3` per batch (background-shifted to fill), then a flip."""
    import tensorflow as tf

    batch = tf.shape(images)[0]
    shifts = tf.random.stateless_uniform(
        [batch, 2], translate_seed, minval=-max_pixels, maxval=max_pixels + 1, dtype=tf.int32
    )
    shifts = tf.cast(shifts, tf.float32)
    ones, zeros = tf.ones([batch], tf.float32), tf.zeros([batch], tf.float32)
    transforms = tf.stack(
        [ones, zeros, -shifts[:, 0], zeros, ones, -shifts[:, 1], zeros, zeros], axis=1
    )
    background = tf.reduce_min(images, axis=[1, 2, 3], keepdims=True)
    moved = tf.raw_ops.ImageProjectiveTransformV3(
        images=images - background,
        transforms=transforms,
        output_shape=tf.shape(images)[1:3],
        fill_value=0.0,
        interpolation="NEAREST",
        fill_mode="CONSTANT",
    )
    moved = moved + background
    flip = tf.random.stateless_uniform([batch], flip_seed) < 0.5
    return tf.where(flip[:, None, None, None], tf.reverse(moved, axis=[2]), moved)


def _augmentation(side: str):
    """The map `side` applies to `(index, features)`: as `training.inputs.augmented`."""
    import tensorflow as tf

    from components.data import augment

    def seed_of(index):
        return tf.stack([tf.constant(1, tf.int64), index])

    def views(index, features):
        return augment.augment_images(
            features, {IMAGE: SHAPE}, translate=TRANSLATE, flip=FLIP, seed=seed_of(index)
        )

    def warp(index, features):
        # The key's seeds as `augment_images` derives them for its first image feature.
        key_seed = tf.random.experimental.stateless_fold_in(seed_of(index), 0)
        images = tf.reshape(features[IMAGE], [-1, *SHAPE])
        moved = warp_views(
            images,
            TRANSLATE,
            tf.random.experimental.stateless_fold_in(key_seed, 0),
            tf.random.experimental.stateless_fold_in(key_seed, 1),
        )
        return {**features, IMAGE: tf.reshape(moved, tf.shape(features[IMAGE]))}

    def mixup(index, features):
        labels = tf.zeros([tf.shape(features[IMAGE])[0]], tf.int64)
        mixed, mixed_labels = augment.mixup(features, labels, [IMAGE], MIXUP_ALPHA, seed_of(index))
        return {**mixed, "lam": mixed_labels.lam}

    def noise(index, features):
        return augment.input_noise(features, [IMAGE], NOISE_STDDEV, seed_of(index))

    def noise_old(index, features):
        draws = tf.random.stateless_normal(tf.shape(features[IMAGE]), seed_of(index))
        return {**features, IMAGE: features[IMAGE] + NOISE_STDDEV * draws}

    sides = {"views": views, "warp": warp, "mixup": mixup, "noise": noise, "noise_old": noise_old}
    return sides.get(side)


def _in_memory(images, batch_size: int):
    import tensorflow as tf

    return (
        tf.data.Dataset.from_tensor_slices({IMAGE: images})
        .batch(batch_size, drop_remainder=True)
        .cache()
        .repeat()
    )


def _pipeline(side: str, images, reader, batch_size: int):
    import tensorflow as tf

    if side.startswith("reader_"):
        return reader(side == "reader_views")
    ds = _in_memory(images, batch_size)
    fn = _augmentation(side)
    if fn is None:
        return ds.prefetch(tf.data.AUTOTUNE)
    return ds.enumerate().map(fn, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def images_per_s(ds, batches: int, warmup: int) -> float:
    """Images a second over `batches` batches of `ds`, after `warmup` batches."""
    iterator = iter(ds)
    for _ in range(warmup):
        next(iterator)
    images = 0
    start = time.perf_counter()
    for _ in range(batches):
        batch = next(iterator)
        features = batch[0] if isinstance(batch, tuple) else batch
        images += int(features[IMAGE].shape[0])
    return images / (time.perf_counter() - start)


def path_rate(path: str, side: int, batch_size: int, batches: int, warmup: int) -> float:
    """`random_views` images/s on random `side x side` images by one path (`matmul`, `gather`)."""
    import numpy as np
    import tensorflow as tf

    from components.data import augment

    images = tf.constant(np.random.default_rng(0).random((batch_size, side, side, 1), np.float32))
    saved = augment.MATMUL_MAX_SIDE
    augment.MATMUL_MAX_SIDE = side if path == "matmul" else 0
    try:

        @tf.function
        def step(index):
            seed = tf.stack([tf.constant(1, tf.int64), index])
            return augment.random_views(
                images, max_pixels=TRANSLATE, flip=FLIP, translate_seed=seed, flip_seed=seed + 1
            )

        ds = tf.data.Dataset.range(batches + warmup).map(step)
        return images_per_s(ds.map(lambda v: {IMAGE: v}), batches, warmup)
    finally:
        augment.MATMUL_MAX_SIDE = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--shared-with", default=None,
                        help="what else ran on the cores (None: the machine was idle)")  # fmt: skip
    parser.add_argument("--no-results", action="store_true", help="print only")
    args = parser.parse_args()
    # One core, before TensorFlow starts its thread pools.
    os.sched_setaffinity(0, {args.cpu})

    import numpy as np
    import tensorflow as tf

    from benchmarks import tfdata_service
    from components.data import fashion_mnist
    from testkit import results
    from testkit.stats import ratio_interval, t_interval

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    lines: list[dict] = []

    def emit(line: dict) -> None:
        lines.append(line)
        print(json.dumps(line), flush=True)

    raw, _ = fashion_mnist.load_split("train")
    images = raw.reshape(len(raw), -1).astype(np.float32) / 255.0
    sides = [s for s in args.sides.split(",") if s]
    data = None
    if any(s.startswith("reader_") for s in sides):
        data = tfdata_service.write_data(tempfile.mkdtemp(prefix="augment_"))
    reader_args = argparse.Namespace(batch_size=args.batch_size)

    def reader(views: bool):
        return tfdata_service._dataset(data, reader_args, views=views, dispatcher="", remote="",
                                       training=True, job="")  # fmt: skip

    rates: dict[str, list[float]] = {s: [] for s in sides}
    ratios = []
    for round_ in range(args.rounds):
        shift = round_ % len(sides)
        order = sides[shift:] + sides[:shift]
        if round_ % 2:
            order = order[::-1]
        got = {}
        for side in order:
            ds = _pipeline(side, images, reader, args.batch_size)
            got[side] = images_per_s(ds, args.batches, args.warmup)
            rates[side].append(got[side])
        if "views" in got and "warp" in got:
            ratios.append(got["views"] / got["warp"])
        emit({"round": round_, "order": order, **{s: round(r) for s, r in got.items()}})

    summary: dict = {"batch_size": args.batch_size, "batches": args.batches, "cpu": args.cpu,
                     "target_images_per_s": TARGET_IMAGES_PER_S}  # fmt: skip
    for side, values in rates.items():
        mean, low, high = t_interval(values)
        summary[side] = {"images_per_s": round(mean), "ci95": [round(low), round(high)]}
        if side in ("views", "mixup", "noise"):
            summary[side]["meets_target"] = low >= TARGET_IMAGES_PER_S
    if ratios:
        mean, low, high = ratio_interval(ratios)
        summary["views_over_warp"] = {
            "ratio": round(mean, 3),
            "ci95": [round(low, 3), round(high, 3)],
        }
    if "reader_plain" in rates and "reader_views" in rates:
        mean, low, high = ratio_interval(
            [v / p for v, p in zip(rates["reader_views"], rates["reader_plain"], strict=True)]
        )
        summary["reader_views_over_plain"] = {
            "ratio": round(mean, 3),
            "ci95": [round(low, 3), round(high, 3)],
        }
    for side in PATH_SIDES:
        batch = max(8, args.batch_size * 28 * 28 // (side * side))
        for round_ in range(2):
            order = ("matmul", "gather") if round_ == 0 else ("gather", "matmul")
            got = {p: path_rate(p, side, batch, args.batches // 4, args.warmup // 4) for p in order}
            emit({"path": side, "batch_size": batch, "round": round_,
                  **{p: round(r) for p, r in got.items()}})  # fmt: skip
    emit({"summary": True, **summary})
    headline = {
        "augmented_images_per_s_one_core": summary.get("views", {}).get("images_per_s"),
        "plain_images_per_s_one_core": summary.get("plain", {}).get("images_per_s"),
        "augmented_over_old_op": summary.get("views_over_warp", {}).get("ratio"),
    }
    emit(headline)
    if not args.no_results:
        results.write("augment", lines, shared_with=args.shared_with, argv=sys.argv[1:])


if __name__ == "__main__":
    main()
