"""The small convolutional student's module file.

One 3x3 convolution per block, [16, 32, 64] filters, a 56-unit head: 56,178
parameters (0.096 of the teacher's 584,170). `student_fn` is what the Distiller
trains; `run_fn` trains the same model alone through a stock-compatible
Trainer (`custom_config`: `seed`, `augment`).
"""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def student_fn(fn_args):
    del fn_args
    return common.conv_net([16, 32, 64], 1, 56, "student")


def run_fn(fn_args):
    seed = int(fn_args.custom_config.get("seed", 0))
    tf.keras.utils.set_random_seed(seed)
    model = student_fn(fn_args)
    common.train_and_save(
        fn_args, model, augmented=bool(fn_args.custom_config.get("augment")), seed=seed
    )
