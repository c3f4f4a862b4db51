"""Atomic model copy (no TFX types): stage in a hidden directory, then rename.

A model server polling `<base>` loads numeric version directories only, so a
staging directory named `.incoming-<version>-<pid>` is invisible to it; the
final rename makes the complete model appear in one step. A push killed
mid-copy leaves only a hidden staging directory, which the next push removes.
"""

from __future__ import annotations

import os

import tensorflow as tf
from absl import logging

STAGING_PREFIX = ".incoming-"


def copy_tree(src: str, dst: str) -> None:
    """Recursively copies `src` to `dst` with `tf.io.gfile` (GCS-safe)."""
    for root, _, files in tf.io.gfile.walk(src):
        rel = os.path.relpath(root, src)
        target = dst if rel == "." else os.path.join(dst, rel)
        tf.io.gfile.makedirs(target)
        for name in files:
            tf.io.gfile.copy(os.path.join(root, name), os.path.join(target, name), overwrite=True)


def atomic_copy_model(model_path: str, base_directory: str, version: str) -> str:
    """Copies a SavedModel directory to `<base_directory>/<version>` atomically.

    Returns:
      The final serving path.

    Raises:
      FileExistsError: if that version already exists (nothing is overwritten).
    """
    tf.io.gfile.makedirs(base_directory)
    for name in tf.io.gfile.listdir(base_directory):
        if name.startswith(STAGING_PREFIX):
            logging.warning("Pusher: removing %s left by an interrupted push", name)
            tf.io.gfile.rmtree(os.path.join(base_directory, name.rstrip("/")))
    serving_path = os.path.join(base_directory, version)
    if tf.io.gfile.exists(serving_path):
        raise FileExistsError(
            f"Pusher: {serving_path} already exists; refusing to overwrite a pushed model"
        )
    staging = os.path.join(base_directory, f"{STAGING_PREFIX}{version}-{os.getpid()}")
    copy_tree(model_path, staging)
    # A directory rename is atomic on POSIX filesystems; object stores (gs://)
    # emulate it, which is why the staging name is hidden from servers too.
    tf.io.gfile.rename(staging, serving_path)
    return serving_path
