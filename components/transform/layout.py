"""The Transform's layout record: what it wrote, so the Trainer never guesses.

Pure (no TFX types). The Transform executor writes one JSON record,
`tfxkit_layout.json`, into its transform graph directory after the
transformed examples are written: compression, shard count, the packed
feature layout, the parse spec of the records as stored, and every shard with
its split, record count and sizes. The Trainer reads it back
(`read_layout`) and builds its input pipeline from it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import tensorflow as tf

from components.ingestion import PackedMember, Packing, ShardStats

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


class LayoutError(ValueError):
    """The layout record is malformed or disagrees with the files; names the file."""


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


def file_spec(feature_spec: Mapping[str, Any], packing: Packing | None) -> dict[str, Any]:
    """The parse spec of the records as stored: members replaced by the packed feature."""
    if packing is None:
        return dict(feature_spec)
    members = {m.name for m in packing.members}
    spec = {k: v for k, v in feature_spec.items() if k not in members}
    spec[packing.feature] = packing.spec()
    return spec


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
            out[name] = {"kind": "fixed_len", "dtype": s.dtype.name, "shape": [int(d) for d in s.shape], "default": default}
        elif isinstance(s, tf.io.VarLenFeature):
            out[name] = {"kind": "var_len", "dtype": s.dtype.name}
        else:
            out[name] = {"kind": _FROM_TRANSFORM_GRAPH}
    return out


def spec_from_json(data: Mapping[str, Mapping[str, Any]], transform_graph_spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Rebuilds a parse spec; `transform_graph` entries come from `transform_graph_spec`.

    Raises:
      LayoutError: on an unknown kind, or a `transform_graph` entry without
        a transform graph spec that holds it.
    """
    spec: dict[str, Any] = {}
    for name, entry in data.items():
        kind = entry.get("kind")
        if kind == "fixed_len":
            spec[name] = tf.io.FixedLenFeature(entry["shape"], tf.as_dtype(entry["dtype"]), entry.get("default"))
        elif kind == "var_len":
            spec[name] = tf.io.VarLenFeature(tf.as_dtype(entry["dtype"]))
        elif kind == _FROM_TRANSFORM_GRAPH:
            if transform_graph_spec is None or name not in transform_graph_spec:
                raise LayoutError(f"layout: feature {name!r} is described by the transform graph, which lacks it")
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
    """

    compression: str
    num_shards: int
    packing: Packing | None
    parse_spec: dict[str, dict[str, Any]]
    files: tuple[ShardFile, ...]

    def feature_spec(self, transform_graph_spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return spec_from_json(self.parse_spec, transform_graph_spec)

    def shard_stats(self) -> dict[str, ShardStats]:
        return {f.path: f.stats for f in self.files}

    def split_files(self, split: str) -> list[str]:
        return sorted(f.path for f in self.files if f.split == split)

    def check_listed(self, files: Iterable[str]) -> None:
        """Checks that listed files are recorded shards and that none is missing.

        Raises:
          LayoutError: naming an unrecorded file, or a recorded shard of a
            listed directory that is absent from `files`.
        """
        listed = set(files)
        recorded = {f.path for f in self.files}
        for path in sorted(listed - recorded):
            raise LayoutError(
                f"layout: {path!r} is not among the {len(recorded)} shards the Transform recorded; feed the Trainer "
                "the transformed examples of the same Transform run"
            )
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
                    ShardFile(f["path"], f["split"], ShardStats(int(f["records"]), int(f["raw_bytes"]), int(f["file_bytes"])))
                    for f in data["files"]
                ),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, LayoutError):
                raise
            raise LayoutError(f"layout: {source} is malformed ({e!r}); re-run the Transform") from e


def packing_to_json(packing: Packing | None) -> dict[str, Any] | None:
    if packing is None:
        return None
    return {
        "feature": packing.feature,
        "width": packing.width,
        "members": [{"name": m.name, "dtype": m.dtype, "shape": list(m.shape)} for m in packing.members],
    }


def packing_from_json(data: Mapping[str, Any] | None) -> Packing | None:
    if data is None:
        return None
    packing = Packing(
        data["feature"], tuple(PackedMember(m["name"], m["dtype"], tuple(m["shape"])) for m in data["members"])
    )
    if packing.width != data["width"]:
        raise LayoutError(f"layout: packed width {data['width']} disagrees with its members ({packing.width})")
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
