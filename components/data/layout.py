"""The Transform -> Trainer data contract: what the Transform writes, what the Trainer reads.

Pure (no TFX types): shard count and stats (`resolve_num_shards`, `ShardStats`,
`scan_shard`, `check_shards`), compression and suffixes, packing (`plan_packing`,
`pack_record_batch`, `Packing.unpack`), the stored parse spec (`file_spec`,
`produced_features`) and the layout record (`write_layout`, `read_layout`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import tensorflow as tf

from components.data import codes

LAYOUT_FILE = "tfxkit_layout.json"
LAYOUT_FORMAT = "tfxkit.transform_layout"
LAYOUT_VERSION = 1
PACKED_FEATURE = "packed_features"
# Parallel reads want several files per reader; 8 keeps a few cores busy
# without making tiny splits into many tiny files.
MIN_DEFAULT_SHARDS = 8
# Largest magnitude below which every integer is exactly a float32.
FLOAT32_EXACT_INT = 2**24
# A parse spec entry the record cannot describe: read it from the transform graph.
_FROM_TRANSFORM_GRAPH = "transform_graph"
# TFRecord framing around each record: length (8 bytes) + its CRC (4) + data CRC (4).
RECORD_OVERHEAD_BYTES = 16
# Records per batch when a shard is scanned (per-batch cost, bounded memory).
_SCAN_BATCH = 4096


class IngestionError(ValueError):
    """Transform output cannot be read as written or configured; names the file and feature.

    Defined with the contract (and raised by `components.data.ingestion` too) so a
    contract check fails with an error both the reader and its callers catch.
    """


class LayoutError(IngestionError):
    """The layout record is malformed or disagrees with the files; names the file."""


@dataclasses.dataclass(frozen=True)
class PackedMember:
    """One dense feature stored inside the packed float vector.

    Attributes:
      name: Feature name the model sees.
      dtype: `float32` or `int64` (ids are stored as exactly representable
        floats and cast back).
      shape: Shape of one example's value (`()` for a scalar, `(1,)`, `(64,)`).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def width(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class Packing:
    """Dense numeric features written as one fixed-length float32 vector.

    Members are stored float32 members first, then int64 members, each in
    order, so unpacking is one slice and one cast per dtype.

    Attributes:
      feature: Name of the packed feature in the files.
      members: The features it holds, in storage order.
    """

    feature: str
    members: tuple[PackedMember, ...]

    @property
    def width(self) -> int:
        return sum(m.width for m in self.members)

    def spec(self) -> tf.io.FixedLenFeature:
        """Parse spec of the packed feature."""
        return tf.io.FixedLenFeature([self.width], tf.float32)

    def unpack(self, packed: tf.Tensor) -> dict[str, tf.Tensor]:
        """Splits a `[batch, width]` packed tensor into the member features."""
        out: dict[str, tf.Tensor] = {}
        start = 0
        for dtype in ("float32", "int64"):
            members = [m for m in self.members if m.dtype == dtype]
            if not members:
                continue
            size = sum(m.width for m in members)
            block = packed[:, start : start + size]
            start += size
            if dtype == "int64":
                block = tf.cast(block, tf.int64)
            parts = (
                tf.split(block, [m.width for m in members], axis=1) if len(members) > 1 else [block]
            )
            for member, part in zip(members, parts, strict=True):
                if member.shape != (member.width,):
                    part = tf.reshape(part, [-1, *member.shape])
                out[member.name] = part
        return out


@dataclasses.dataclass(frozen=True)
class ShardStats:
    """What a writer recorded about one TFRecord shard.

    Attributes:
      records: Number of records.
      raw_bytes: Bytes of the uncompressed TFRecord stream (framing included).
      file_bytes: Size of the file on disk.
    """

    records: int
    raw_bytes: int
    file_bytes: int


def compression_type(compression: str) -> str:
    """Maps the config's `gzip` / `none` to a TFRecordDataset compression type."""
    if compression not in ("gzip", "none"):
        raise IngestionError(
            f"transform.compression: expected 'gzip' or 'none', got {compression!r}"
        )
    return "GZIP" if compression == "gzip" else ""


def shard_suffix(compression: str) -> str:
    """File name suffix of a shard written with `compression`."""
    # `.gz` is how stock TFX readers (tfx_bsl) detect GZIP; anything else reads uncompressed.
    return ".gz" if compression == "gzip" else ".tfrecord"


@tf.autograph.experimental.do_not_convert
def _batch_counts(batch: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.size(batch, out_type=tf.int64), tf.reduce_sum(
        tf.cast(tf.strings.length(batch), tf.int64)
    )


@tf.autograph.experimental.do_not_convert
def _add_counts(total, counts):
    return total[0] + counts[0], total[1] + counts[1]


def scan_shard(path: str, compression: str) -> ShardStats:
    """Reads a whole TFRecord shard and returns its record count and sizes.

    Raises:
      IngestionError: naming the file when it cannot be read to the end.
    """
    ds = tf.data.TFRecordDataset(path, compression_type=compression_type(compression)).batch(
        _SCAN_BATCH
    )
    try:
        records, data = ds.map(_batch_counts).reduce(
            (tf.constant(0, tf.int64), tf.constant(0, tf.int64)), _add_counts
        )
    except tf.errors.OpError as e:
        raise IngestionError(
            f"ingestion: TFRecord shard {path!r} is corrupt, truncated or unreadable: {e.message}"
        ) from e
    records = int(records)
    return ShardStats(
        records, int(data) + RECORD_OVERHEAD_BYTES * records, tf.io.gfile.stat(path).length
    )


def check_shards(files: Iterable[str], recorded: Mapping[str, ShardStats]) -> list[ShardStats]:
    """Checks that every file is a shard the Transform recorded, at its recorded size.

    A size check also catches a file truncated exactly at a record boundary,
    which a reader would take for a shorter, complete file.

    Args:
      files: Files about to be read.
      recorded: The shards the Transform recorded, by path.

    Returns:
      The recorded stats of `files`, in order.

    Raises:
      LayoutError: naming the first file that is not recorded or whose size
        differs from the recorded one.
    """
    stats = []
    for path in files:
        if path not in recorded:
            raise LayoutError(
                f"layout: {path!r} is not among the {len(recorded)} shards the Transform recorded; feed the Trainer "
                "the transformed examples of the same Transform run"
            )
        size = tf.io.gfile.stat(path).length
        if size != recorded[path].file_bytes:
            raise LayoutError(
                f"layout: TFRecord shard {path!r} has {size} bytes but the Transform wrote "
                f"{recorded[path].file_bytes}: it is truncated or was replaced; restore it or re-run the Transform"
            )
        stats.append(recorded[path])
    return stats


def default_num_shards(workers: int) -> int:
    """Shards per split when `transform.num_shards` is 0.

    At least `MIN_DEFAULT_SHARDS` (parallel reads) and at least two per worker,
    rounded up to a multiple of the worker count so that sharding by file
    gives every worker the same number of files.
    """
    workers = max(1, workers)
    return workers * math.ceil(max(MIN_DEFAULT_SHARDS, 2 * workers) / workers)


def resolve_num_shards(num_shards: int, workers: int) -> int:
    """The configured shard count, or the default for 0."""
    return num_shards if num_shards > 0 else default_num_shards(workers)


def plan_packing(feature_spec: Mapping[str, Any], feature: str = PACKED_FEATURE) -> Packing | None:
    """Chooses the features to pack: every dense float32 / int64 feature.

    Args:
      feature_spec: The transformed feature spec.
      feature: Name of the packed feature.

    Returns:
      The packing (float members first, then ints, each sorted by name), or
      None when there is nothing dense and numeric to pack.

    Raises:
      LayoutError: if a transformed feature already uses the packed name.
    """
    if feature in feature_spec:
        raise LayoutError(
            f"transform.pack_features: a transformed feature is already named {feature!r}; rename it or "
            "set transform.pack_features: false"
        )
    members = []
    for name, spec in feature_spec.items():
        if (
            isinstance(spec, tf.io.FixedLenFeature)
            and spec.dtype in (tf.float32, tf.int64)
            and spec.default_value is None
            and all(isinstance(d, int) and d >= 1 for d in spec.shape)
        ):
            members.append(PackedMember(name, spec.dtype.name, tuple(int(d) for d in spec.shape)))
    if not members:
        return None
    members.sort(key=lambda m: (m.dtype != "float32", m.name))
    return Packing(feature, tuple(members))


def pack_record_batch(record_batch: pa.RecordBatch, packing: Packing) -> pa.RecordBatch:
    """Replaces the member columns of a transformed RecordBatch by one packed column.

    Raises:
      ValueError: naming the feature when a member does not have exactly its
        width of values in every row, or an integer float32 cannot hold exactly.
    """
    n = record_batch.num_rows
    names = record_batch.schema.names
    blocks = []
    for member in packing.members:
        if member.name not in names:
            raise ValueError(
                f"transform.pack_features: feature {member.name!r} is not in the transformed data"
            )
        column = record_batch.column(names.index(member.name))
        values = column.flatten()
        if column.null_count or len(values) != n * member.width:
            raise ValueError(
                f"transform.pack_features: feature {member.name!r} does not have exactly {member.width} value(s) "
                "in every example, so it cannot be packed; make it dense or set transform.pack_features: false"
            )
        block = values.to_numpy(zero_copy_only=False).reshape(n, member.width)
        if member.dtype == "int64" and block.size and np.abs(block).max() > FLOAT32_EXACT_INT:
            raise ValueError(
                f"transform.pack_features: feature {member.name!r} has integer values beyond "
                f"{FLOAT32_EXACT_INT}, which float32 cannot hold exactly; set "
                "transform.pack_features: false"
            )
        blocks.append(block.astype(np.float32, copy=False))
    width = packing.width
    packed = np.concatenate(blocks, axis=1).reshape(-1)
    offsets = pa.array(np.arange(0, n * width + 1, width, dtype=np.int64))
    packed_column = pa.LargeListArray.from_arrays(offsets, pa.array(packed, pa.float32()))
    members = {m.name for m in packing.members}
    keep = [i for i, name in enumerate(names) if name not in members]
    return pa.RecordBatch.from_arrays(
        [record_batch.column(i) for i in keep] + [packed_column],
        [names[i] for i in keep] + [packing.feature],
    )


def file_spec(feature_spec: Mapping[str, Any], packing: Packing | None) -> dict[str, Any]:
    """The parse spec of the records as stored: members replaced by the packed feature."""
    if packing is None:
        return dict(feature_spec)
    members = {m.name for m in packing.members}
    spec = {k: v for k, v in feature_spec.items() if k not in members}
    spec[packing.feature] = packing.spec()
    return spec


def produced_features(spec: Mapping[str, Any], packing: Packing | None) -> frozenset[str]:
    """The features a read of records stored with `spec` yields: packed members unpacked."""
    if packing is None:
        return frozenset(spec)
    return frozenset(spec) - {packing.feature} | {m.name for m in packing.members}


def _json_default(value: Any) -> Any:
    """A FixedLenFeature default as JSON, or raises TypeError when it has none."""
    if isinstance(value, bytes):
        raise TypeError("bytes default")
    json.dumps(value)
    return value


def spec_to_json(spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Serialises a parse spec; kinds it cannot describe point at the transform graph."""
    out: dict[str, dict[str, Any]] = {}
    for name, s in sorted(spec.items()):
        if isinstance(s, tf.io.FixedLenFeature):
            try:
                default = None if s.default_value is None else _json_default(s.default_value)
            except TypeError:
                out[name] = {"kind": _FROM_TRANSFORM_GRAPH}
                continue
            out[name] = {
                "kind": "fixed_len",
                "dtype": s.dtype.name,
                "shape": [int(d) for d in s.shape],
                "default": default,
            }
        elif isinstance(s, tf.io.VarLenFeature):
            out[name] = {"kind": "var_len", "dtype": s.dtype.name}
        else:
            out[name] = {"kind": _FROM_TRANSFORM_GRAPH}
    return out


def spec_from_json(
    data: Mapping[str, Mapping[str, Any]], transform_graph_spec: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Rebuilds a parse spec; `transform_graph` entries come from `transform_graph_spec`.

    Raises:
      LayoutError: on an unknown kind, or a `transform_graph` entry without
        a transform graph spec that holds it.
    """
    spec: dict[str, Any] = {}
    for name, entry in data.items():
        kind = entry.get("kind")
        if kind == "fixed_len":
            spec[name] = tf.io.FixedLenFeature(
                entry["shape"], tf.as_dtype(entry["dtype"]), entry.get("default")
            )
        elif kind == "var_len":
            spec[name] = tf.io.VarLenFeature(tf.as_dtype(entry["dtype"]))
        elif kind == _FROM_TRANSFORM_GRAPH:
            if transform_graph_spec is None or name not in transform_graph_spec:
                raise LayoutError(
                    f"layout: feature {name!r} is described by the transform graph, which lacks it"
                )
            spec[name] = transform_graph_spec[name]
        else:
            raise LayoutError(f"layout: feature {name!r} has an unknown parse spec kind {kind!r}")
    return spec


@dataclasses.dataclass(frozen=True)
class ShardFile:
    """One written shard.

    Attributes:
      path: Full path (URI) of the file.
      split: The split it belongs to (`train`, `eval`, ...).
      stats: Record count and sizes, read back after writing.
    """

    path: str
    split: str
    stats: ShardStats


@dataclasses.dataclass(frozen=True)
class Layout:
    """What the Transform wrote.

    Attributes:
      compression: `gzip` or `none`.
      num_shards: Shards per split.
      packing: The packed feature, or None.
      parse_spec: Parse spec of the records as stored, in JSON form (see
        `spec_to_json`); `feature_spec()` turns it into tf.io specs.
      files: Every shard of every split.
      codebooks: Feature -> its distinct values over every split, sorted, for
        every dense float32 feature with at most 256 of them (see
        `components.data.codes`); absent from records written before them.
    """

    compression: str
    num_shards: int
    packing: Packing | None
    parse_spec: dict[str, dict[str, Any]]
    files: tuple[ShardFile, ...]
    codebooks: Mapping[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)

    def feature_spec(self, transform_graph_spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return spec_from_json(self.parse_spec, transform_graph_spec)

    def shard_stats(self) -> dict[str, ShardStats]:
        return {f.path: f.stats for f in self.files}

    def split_files(self, split: str) -> list[str]:
        return sorted(f.path for f in self.files if f.split == split)

    def check_listed(self, files: Iterable[str]) -> None:
        """Checks that listed files are recorded, unchanged shards and that none is missing.

        Raises:
          LayoutError: naming an unrecorded or resized file (`check_shards`),
            or a recorded shard of a listed directory that is absent from
            `files`.
        """
        listed = set(files)
        check_shards(sorted(listed), self.shard_stats())
        directories = {os.path.dirname(p) for p in listed}
        for f in sorted(self.files, key=lambda f: f.path):
            if os.path.dirname(f.path) in directories and f.path not in listed:
                raise LayoutError(
                    f"layout: shard {f.path!r} ({f.stats.records} records of split {f.split!r}) is missing; "
                    "restore it or re-run the Transform"
                )

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": LAYOUT_FORMAT,
                "version": LAYOUT_VERSION,
                "compression": self.compression,
                "num_shards": self.num_shards,
                "packing": packing_to_json(self.packing),
                "parse_spec": self.parse_spec,
                "files": [
                    {"path": f.path, "split": f.split, **dataclasses.asdict(f.stats)}
                    for f in sorted(self.files, key=lambda f: f.path)
                ],
                "codebooks": {name: list(book) for name, book in self.codebooks.items()},
            },
            indent=1,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, source: str = "layout") -> Layout:
        try:
            data = json.loads(text)
            if data.get("format") != LAYOUT_FORMAT or data.get("version") != LAYOUT_VERSION:
                raise LayoutError(
                    f"layout: {source} is format {data.get('format')!r} version {data.get('version')!r}, "
                    f"expected {LAYOUT_FORMAT!r} version {LAYOUT_VERSION}; re-run the Transform"
                )
            return cls(
                compression=data["compression"],
                num_shards=int(data["num_shards"]),
                packing=packing_from_json(data["packing"]),
                parse_spec=dict(data["parse_spec"]),
                files=tuple(
                    ShardFile(
                        f["path"],
                        f["split"],
                        ShardStats(int(f["records"]), int(f["raw_bytes"]), int(f["file_bytes"])),
                    )
                    for f in data["files"]
                ),
                codebooks=_codebooks_from_json(data.get("codebooks", {}), source),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, LayoutError):
                raise
            raise LayoutError(f"layout: {source} is malformed ({e!r}); re-run the Transform") from e


def _codebooks_from_json(data: Mapping[str, Any], source: str) -> dict[str, tuple[float, ...]]:
    out = {}
    for name, values in dict(data).items():
        try:
            out[name] = tuple(codes.check_book(name, values).tolist())
        except ValueError as e:
            raise LayoutError(f"layout: {source}: {e}; re-run the Transform") from e
    return out


def packing_to_json(packing: Packing | None) -> dict[str, Any] | None:
    if packing is None:
        return None
    return {
        "feature": packing.feature,
        "width": packing.width,
        "members": [
            {"name": m.name, "dtype": m.dtype, "shape": list(m.shape)} for m in packing.members
        ],
    }


def packing_from_json(data: Mapping[str, Any] | None) -> Packing | None:
    if data is None:
        return None
    packing = Packing(
        data["feature"],
        tuple(PackedMember(m["name"], m["dtype"], tuple(m["shape"])) for m in data["members"]),
    )
    if packing.width != data["width"]:
        raise LayoutError(
            f"layout: packed width {data['width']} disagrees with its members ({packing.width})"
        )
    return packing


def write_layout(directory: str, layout: Layout) -> str:
    """Writes the record into `directory` (atomically) and returns its path."""
    path = os.path.join(directory, LAYOUT_FILE)
    tmp = path + ".tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(layout.to_json())
    tf.io.gfile.rename(tmp, path, overwrite=True)
    return path


def read_layout(directory: str) -> Layout | None:
    """Reads the record from `directory`; None when there is none (stock TFX Transform output)."""
    path = os.path.join(directory, LAYOUT_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "r") as f:
        return Layout.from_json(f.read(), source=path)
