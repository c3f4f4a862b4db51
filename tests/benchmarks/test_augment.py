"""`benchmarks/augment.py`: its reference op makes the same views as the product's, so the
side-by-side ratio compares equal work, and each side is the pipeline it names."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks import augment as bench
from components.data import augment


def _images(n=64):
    rng = np.random.default_rng(0)
    return rng.uniform(0.1, 1.0, size=(n, *bench.SHAPE)).astype("float32")


def test_the_old_warp_makes_the_views_the_product_makes_seed_for_seed():
    images = tf.constant(_images())
    for index in range(3):
        seed = tf.constant([1, index], tf.int64)
        flat = {bench.IMAGE: tf.reshape(images, [64, -1])}
        product = bench._augmentation("views")(tf.constant(index, tf.int64), flat)
        warp = bench._augmentation("warp")(tf.constant(index, tf.int64), flat)
        # The warp shifts every pixel by the background and back: within rounding.
        np.testing.assert_allclose(warp[bench.IMAGE], product[bench.IMAGE], atol=1e-6, rtol=0)
        direct = augment.augment_images(
            flat, {bench.IMAGE: bench.SHAPE}, translate=bench.TRANSLATE, flip=bench.FLIP, seed=seed
        )
        np.testing.assert_array_equal(product[bench.IMAGE], direct[bench.IMAGE])


def test_each_side_delivers_whole_batches_of_its_own_kind():
    images = _images(512).reshape(512, -1)
    for side in ("plain", "views", "warp", "mixup", "noise", "noise_old"):
        ds = bench._pipeline(side, images, reader=None, batch_size=128)
        batch = next(iter(ds))
        assert batch[bench.IMAGE].shape == (128, 784), side
        same = np.array_equal(batch[bench.IMAGE].numpy(), images[:128])
        assert same == (side == "plain"), side
    assert bench.images_per_s(bench._pipeline("plain", images, None, 128), 3, 1) > 0


def test_both_paths_of_random_views_run_and_the_product_setting_is_restored():
    saved = augment.MATMUL_MAX_SIDE
    for path in ("matmul", "gather"):
        assert bench.path_rate(path, 40, batch_size=4, batches=2, warmup=1) > 0
        assert augment.MATMUL_MAX_SIDE == saved
