"""Stored Transform output, resolved once for every reader (no TFX types).

`resolve` turns a layout record, or stock TFX Transform output without one, and a split's
file patterns into a `StoredInput`: the checked files, the stored parse spec, packing,
compression (`detect_compression` for stock output), shard stats and `cache_path`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import tensorflow as tf

from components.data import layout
from components.data.layout import IngestionError

# Every gzip stream starts with these two bytes (RFC 1952).
GZIP_MAGIC = b"\x1f\x8b"
# An uncompressed TFRecord starts with its length (8 bytes, little-endian) and
# the masked CRC32C of those 8 bytes (4 bytes).
_TFRECORD_HEADER_BYTES = 12
_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected
_CRC_MASK_DELTA = 0xA282EAD8  # TFRecord's CRC masking constant


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (_CRC32C_POLY & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = _crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def _is_tfrecord_header(head: bytes) -> bool:
    """Whether `head` begins with a valid uncompressed TFRecord length and its CRC."""
    if len(head) < _TFRECORD_HEADER_BYTES:
        return False
    (crc,) = struct.unpack("<I", head[8:_TFRECORD_HEADER_BYTES])
    return crc == _masked_crc(head[:8])


def file_compression(path: str) -> str | None:
    """Reads the compression of one TFRecord file from its first bytes.

    A gzip file starts with the gzip magic bytes; an uncompressed TFRecord
    with a record length whose CRC follows it. The length of an uncompressed
    first record can begin with the magic bytes too (a record of 0x8b1f bytes,
    modulo 2**16), so a file starting with them is gzip unless its first 12
    bytes are a valid TFRecord header, which a gzip header matches with
    probability 2**-32.

    Args:
      path: The file.

    Returns:
      `gzip` or `none`, or None for an empty file (no records either way).
    """
    with tf.io.gfile.GFile(path, "rb") as f:
        head = f.read(_TFRECORD_HEADER_BYTES)
    if not head:
        return None
    if head.startswith(GZIP_MAGIC) and not _is_tfrecord_header(head):
        return "gzip"
    return "none"


def detect_compression(files: Iterable[str]) -> str:
    """The compression shared by `files`, read from their contents (`file_compression`).

    Args:
      files: TFRecord files of one read.

    Returns:
      `gzip` or `none` (`none` when every file is empty).

    Raises:
      IngestionError: naming a file of each kind when the files mix gzip
        and uncompressed records (one read has one compression).
    """
    seen: dict[str, str] = {}
    for path in files:
        kind = file_compression(path)
        if kind is not None:
            seen.setdefault(kind, path)
    if len(seen) > 1:
        raise IngestionError(
            f"ingestion: {seen['gzip']!r} is gzip-compressed but {seen['none']!r} is not; the files of one "
            "read must share a compression: re-write them alike"
        )
    return next(iter(seen), "none")


def list_files(patterns: str | Iterable[str], reader: str, what: str = "files") -> list[str]:
    """Expands file patterns to a sorted list of distinct files.

    Args:
      patterns: One glob pattern or several (TFX split file patterns).
      reader: Who reads, for the error (`Trainer`, `tf_dataset_factory`).
      what: What the files are, for the error.

    Raises:
      ValueError: when no file matches.
    """
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    files = sorted({f for p in patterns for f in tf.io.gfile.glob(p)})
    if not files:
        raise ValueError(f"{reader}: no {what} match {patterns}")
    return files


@dataclasses.dataclass(frozen=True)
class StoredInput:
    """What an input pipeline needs to read one split of Transform output.

    Attributes:
      files: The files to read, sorted, each once.
      feature_spec: Parse spec of the records as stored (the packed feature
        in place of its members when `packing` is set).
      packing: The packed feature vector, or None.
      compression: `gzip` or `none`.
      shard_stats: The record's stats of every shard the Transform wrote, by
        path; None for stock output (nothing was recorded).
    """

    files: tuple[str, ...]
    feature_spec: Mapping[str, Any]
    packing: layout.Packing | None
    compression: str
    shard_stats: Mapping[str, layout.ShardStats] | None

    @property
    def recorded(self) -> bool:
        """Whether a layout record describes these files."""
        return self.shard_stats is not None

    @property
    def produced(self) -> frozenset[str]:
        """The features a read yields: packed members unpacked, the packed vector gone."""
        return layout.produced_features(self.feature_spec, self.packing)

    def cache_path(self, scratch_dir: str) -> str:
        """Where a file cache of these files lives under `scratch_dir` (created).

        Keyed by the file list, so different reads never share a cache file.
        """
        cache_dir = os.path.join(scratch_dir, "ingestion_cache")
        tf.io.gfile.makedirs(cache_dir)
        return os.path.join(
            cache_dir, hashlib.sha256("\n".join(self.files).encode()).hexdigest()[:16]
        )


def resolve(
    patterns: str | Iterable[str],
    feature_spec: Mapping[str, Any],
    record: layout.Layout | None,
    *,
    reader: str,
    what: str = "files",
    accept_unrecorded: bool = False,
) -> StoredInput:
    """Resolves a split of Transform output into what its input pipeline reads.

    With a layout record the files must be the recorded shards, unchanged and
    complete (`Layout.check_listed`), and the record gives the parse spec,
    packing, compression and shard stats. Without one (stock TFX Transform
    output) the spec is `feature_spec` as given and the compression is read
    from the files (`detect_compression`).

    Args:
      patterns: The split's file patterns.
      feature_spec: The spec the reader was given (the transform graph's
        transformed feature spec, or a schema's); the record's spec replaces
        it, taking from it only the entries the record defers to it.
      record: The Transform's layout record (`layout.read_layout`), or None.
      reader: Who reads, for errors (`Trainer`, `tf_dataset_factory`).
      what: What the files are, for the error when none match.
      accept_unrecorded: What files the record does not list mean. False:
        they are refused (the Trainer is always fed the Transform's own
        output). True: unless every file is recorded, the files are not this
        Transform's output and are read as stock (a user's `run_fn` may read
        other examples).

    Returns:
      The resolved input.

    Raises:
      ValueError: when no file matches.
      LayoutError: naming the file when the files disagree with the record,
        or the record's spec cannot be rebuilt.
      IngestionError: when stock files mix gzip and uncompressed ones.
    """
    files = list_files(patterns, reader, what)
    if record is not None and (not accept_unrecorded or set(files) <= set(record.shard_stats())):
        record.check_listed(files)
        return StoredInput(
            files=tuple(files),
            feature_spec=record.feature_spec(feature_spec),
            packing=record.packing,
            compression=record.compression,
            shard_stats=record.shard_stats(),
        )
    return StoredInput(
        files=tuple(files),
        feature_spec=dict(feature_spec),
        packing=None,
        compression=detect_compression(files),
        shard_stats=None,
    )
