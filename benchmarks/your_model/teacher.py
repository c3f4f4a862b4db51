"""The convolutional teacher's module file (a stock-compatible Trainer's run_fn).

Two 3x3 convolutions per block, [32, 64, 128] filters, a 256-unit head:
about 585k parameters; translate / flip augmentation.
"""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def run_fn(fn_args):
    seed = int(fn_args.custom_config.get("seed", 0))
    tf.keras.utils.set_random_seed(seed)
    model = common.conv_net([32, 64, 128], 2, 256, "teacher")
    common.train_and_save(fn_args, model, augmented=True, seed=seed)
