"""Fashion-MNIST from local IDX files (no network, no TFX types).

`load_split` reads the four gzip IDX files (`read_idx`) from the first directory that
holds them (`find_dir`: `$TFXKIT_FASHION_MNIST_DIR`, the Debian package's, Keras' cache);
`FashionMnistMissing` says where they were looked for.
"""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np

ENV_DIR = "TFXKIT_FASHION_MNIST_DIR"
DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "eval": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
SPLIT_SIZES = {"train": 60000, "eval": 10000}
IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10
CLASS_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
# IDX type byte -> numpy dtype (big-endian where it matters).
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class FashionMnistMissing(FileNotFoundError):
    """The IDX files are in none of the places searched; says how to get them."""


def candidate_dirs(environ=None) -> list[str]:
    """Directories searched for the IDX files, in order."""
    environ = os.environ if environ is None else environ
    keras_home = environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    dirs = [environ[ENV_DIR]] if environ.get(ENV_DIR) else []
    return [*dirs, DEBIAN_DIR, os.path.join(keras_home, "datasets", "fashion-mnist")]


def find_dir(environ=None) -> str:
    """The first directory holding all four IDX files.

    Raises:
      FashionMnistMissing: naming the places searched and both ways to get them.
    """
    searched = candidate_dirs(environ)
    names = [n for pair in FILES.values() for n in pair]
    for directory in searched:
        if all(os.path.isfile(os.path.join(directory, n)) for n in names):
            return directory
    raise FashionMnistMissing(
        "data.builtin: Fashion-MNIST's IDX files ("
        + ", ".join(names)
        + ") are in none of "
        + ", ".join(searched)
        + ". Get them with `apt-get install -y dataset-fashion-mnist` (Debian/Ubuntu, as root; "
        "`make fashion-mnist` does it), or, without root, with "
        "`python -c 'import tf_keras; tf_keras.datasets.fashion_mnist.load_data()'` (downloads into "
        f"Keras' cache), or copy the four files into a directory and set {ENV_DIR} to it."
    )


def read_idx(path: str) -> np.ndarray:
    """Reads one (optionally gzip-compressed) IDX file into an array.

    Raises:
      ValueError: naming the file when its header or size is inconsistent.
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic number {data[:4].hex()})")
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(data)} bytes, {header} expected)")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(data) - header != expected:
        raise ValueError(
            f"{path}: header says shape {shape} ({expected} bytes), file has {len(data) - header}"
        )
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)


def load_split(split: str, directory: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`(images uint8 [n, 28, 28], labels int64 [n])` of `train` or `eval` (the official test set).

    Raises:
      FashionMnistMissing: when no directory holds the files.
      ValueError: when images and labels disagree.
    """
    directory = directory or find_dir()
    images_name, labels_name = FILES[split]
    images = read_idx(os.path.join(directory, images_name))
    labels = read_idx(os.path.join(directory, labels_name)).astype(np.int64)
    if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE:
        raise ValueError(f"{images_name}: expected images of shape [n, 28, 28], got {images.shape}")
    if labels.shape != (images.shape[0],):
        raise ValueError(f"{labels_name}: {labels.shape[0]} labels for {images.shape[0]} images")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ValueError(f"{labels_name}: labels outside [0, {NUM_CLASSES})")
    return images, labels
