"""Every reach of the tfxkit Transform into TFX and TFT internals, in one place.

`tfrecord_writer` swaps a `TransformProcessor` subclass in for one run,
`without_deep_copy` turns TFT's deep-copy optimisation off, and `internal_key_feature`
names TFX's pass-through key column. `check` refuses a TFX / TFT other than those in
`EXPECTED_TFX` / `EXPECTED_TFT`, or a name gone, with a `TfxCompatError` saying what to do.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import apache_beam as beam
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from tensorflow_metadata.proto.v0 import schema_pb2
from tfx import version as tfx_version
from tfx.components.transform import executor as tfx_transform_executor
from tfx.components.transform import labels

# The major.minor versions whose internals this module was written against: the
# two stacks (every name below is the same in TFX / TFT 1.16 and 1.21).
EXPECTED_TFX = ("1.16", "1.21")
EXPECTED_TFT = ("1.16", "1.21")
# What `check` compares against them (module attributes so tests can fake them).
TFX_VERSION: str = tfx_version.__version__
TFT_VERSION: str = tft.__version__

_THIS_MODULE = "components/compat/tfx_transform.py"
# Taken at import, before any swap, so a run always restores TFX's own class
# (None when TFX no longer has it: `check` then says so).
STOCK_PROCESSOR = getattr(tfx_transform_executor, "TransformProcessor", None)
# The processor class is swapped module-wide for the duration of one run.
_PROCESSOR_LOCK = threading.Lock()


class TfxCompatError(RuntimeError):
    """The installed TFX / TFT are not the ones this module's patches were written for."""


def _check_version(package: str, pin: str, found: str, expected: tuple[str, ...]) -> None:
    if ".".join(found.split(".")[:2]) not in expected:
        releases = " or ".join(f"{version}.x" for version in expected)
        pins = " or ".join(f"{pin}=={version}.*" for version in expected)
        raise TfxCompatError(
            f"tfxkit Transform: found {package} {found} but expected {package} {releases}: {_THIS_MODULE} "
            f"patches {package} internals as they are in those; pin {pins} or update "
            f"{_THIS_MODULE} (and its EXPECTED_{package}) for {package} {found}"
        )


def _internals() -> list[tuple[str, object, str]]:
    """(qualified owner, owner, name) of every internal name patched or read here."""
    return [
        ("tfx.components.transform.executor", tfx_transform_executor, "TransformProcessor"),
        (
            "tfx.components.transform.executor",
            tfx_transform_executor,
            "_TRANSFORM_INTERNAL_FEATURE_FOR_KEY",
        ),
        (
            "tfx.components.transform.executor.TransformProcessor",
            STOCK_PROCESSOR,
            "_EncodeAndWrite",
        ),
        ("tensorflow_transform.beam.Context", tft_beam.Context, "get_use_deep_copy_optimization"),
    ]


def check() -> None:
    """Checks the TFX and TFT versions and every internal name used here.

    Raises:
      TfxCompatError: naming the found and expected versions, or the missing
        name, and what to do about it.
    """
    _check_version("TFX", "tfx", TFX_VERSION, EXPECTED_TFX)
    _check_version("TFT", "tensorflow-transform", TFT_VERSION, EXPECTED_TFT)
    for qualifier, owner, name in _internals():
        # Own attributes only: an inherited one would be patched on the wrong class.
        if owner is None or name not in vars(owner):
            raise TfxCompatError(
                f"tfxkit Transform: {qualifier}.{name} no longer exists (TFX {TFX_VERSION}, TFT {TFT_VERSION}), "
                f"but {_THIS_MODULE} patches or reads it; update {_THIS_MODULE} for this TFX/TFT or pin "
                f"tfx=={EXPECTED_TFX[0]}.* and tensorflow-transform=={EXPECTED_TFT[0]}.* "
                f"(or {EXPECTED_TFX[-1]}.*)"
            )


def internal_key_feature() -> str:
    """Name of TFT's pass-through key column (bookkeeping, never a feature)."""
    check()
    return tfx_transform_executor._TRANSFORM_INTERNAL_FEATURE_FOR_KEY


@contextlib.contextmanager
def without_deep_copy() -> Iterator[None]:
    """Turns off TFT's deep-copy optimisation for the duration of a run.

    TFX's executor always enables it, and TFT 1.16's `deep_copy` builds Beam
    `AppliedPTransform`s with a constructor signature Beam 2.72 no longer has,
    so any multi-phase `preprocessing_fn` (an analyzer over another analyzer's
    output, e.g. z-scoring after mean imputation) fails. The optimisation only
    avoids re-reading the input for later phases; without it results are equal.
    """
    check()
    original = vars(tft_beam.Context)["get_use_deep_copy_optimization"]
    tft_beam.Context.get_use_deep_copy_optimization = classmethod(lambda cls: False)
    try:
        yield
    finally:
        tft_beam.Context.get_use_deep_copy_optimization = original


WriterFactory = Callable[[schema_pb2.Schema, str], beam.PTransform]


@contextlib.contextmanager
def tfrecord_writer(make_writer: WriterFactory) -> Iterator[None]:
    """Makes TFX's executor write TFRecord output with `make_writer` for one run.

    Args:
      make_writer: `(transformed schema, output path prefix)` -> the
        PTransform that writes one split's transformed `(RecordBatch,
        passthrough)` pairs. Other formats (Parquet) stay stock.
    """
    check()

    def encode_and_write(self, schema, file_format, output_path):
        if file_format != labels.FORMAT_TFRECORD:
            # Parquet output stays stock; the Trainer then has no layout record.
            return STOCK_PROCESSOR._EncodeAndWrite(
                schema=schema, file_format=file_format, output_path=output_path
            )
        return make_writer(schema, output_path)

    processor = type(
        "IngestionReadyProcessor", (STOCK_PROCESSOR,), {"_EncodeAndWrite": encode_and_write}
    )
    # Under a lock, so two runs in one process never see each other's writer.
    with _PROCESSOR_LOCK:
        tfx_transform_executor.TransformProcessor = processor
        try:
            yield
        finally:
            tfx_transform_executor.TransformProcessor = STOCK_PROCESSOR
