"""The tfxkit Transform's Beam writer: ingestion-ready shards and their layout record.

`WriteIngestionReady` writes one split as the `transform` section says (shard count,
compression, packing) through `WriteShards`, reads every shard back and stages its stats;
`write_layout_record` merges the staged stats of every split into `tfxkit_layout.json`,
whose format is `components.data.layout`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import uuid
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import tensorflow as tf
import tensorflow_transform as tft
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import WindowedValue
from tensorflow_metadata.proto.v0 import schema_pb2
from tensorflow_transform.tf_metadata import schema_utils
from tfx_bsl.coders import example_coder

from components.compat import tfx_transform as tfx_compat
from components.config import PipelineConfig
from components.data import codes, layout

# Directory (in the transform graph) where each split's shard record is staged.
STAGING_DIR = "tfxkit_shard_records"


@dataclasses.dataclass(frozen=True)
class OutputSettings:
    """How the transformed examples are written.

    Attributes:
      num_shards: Files per split (resolved, > 0).
      compression: `gzip` or `none`.
      pack_features: Pack dense numeric features into one float vector.
      staging_dir: Where each split's shard record is staged until the
        layout record is written.
    """

    num_shards: int
    compression: str
    pack_features: bool
    staging_dir: str

    @classmethod
    def from_config(cls, config: PipelineConfig, staging_dir: str) -> OutputSettings:
        return cls(
            num_shards=layout.resolve_num_shards(
                config.transform.num_shards, config.strategy.workers
            ),
            compression=config.transform.compression,
            pack_features=config.transform.pack_features,
            staging_dir=staging_dir,
        )

    @property
    def suffix(self) -> str:
        return layout.shard_suffix(self.compression)


def plan_packing(schema: schema_pb2.Schema, settings: OutputSettings) -> layout.Packing | None:
    """The packing of a transformed schema, or None when packing is off."""
    if not settings.pack_features:
        return None
    return layout.plan_packing(schema_utils.schema_as_feature_spec(schema).feature_spec)


def packed_schema(schema: schema_pb2.Schema, packing: layout.Packing | None) -> schema_pb2.Schema:
    """The schema of the records as stored (members replaced by the packed feature)."""
    if packing is None:
        return schema
    members = {m.name for m in packing.members}
    out = schema_pb2.Schema()
    out.CopyFrom(schema)
    del out.feature[:]
    out.feature.extend(f for f in schema.feature if f.name not in members)
    packed = out.feature.add(name=packing.feature, type=schema_pb2.FLOAT)
    packed.shape.dim.add(size=packing.width)
    packed.presence.min_fraction = 1.0
    return out


class EncodeExamplesFn(beam.DoFn):
    """Transformed `(RecordBatch, passthrough)` -> serialized tf.Examples, packed if asked."""

    def __init__(self, schema: schema_pb2.Schema, packing: layout.Packing | None):
        self._schema = packed_schema(schema, packing)
        self._packing = packing
        # Resolved here, where the pipeline is built, not on the workers.
        self._internal_key = tfx_compat.internal_key_feature()
        self._encoder = None

    def setup(self):
        self._encoder = example_coder.RecordBatchToExamplesEncoder(self._schema)

    def encode(self, record_batch: pa.RecordBatch) -> list[bytes]:
        if self._internal_key in record_batch.schema.names:
            # TFT's pass-through key column is bookkeeping, never a feature.
            record_batch = record_batch.drop_columns([self._internal_key])
        if self._packing is not None:
            record_batch = layout.pack_record_batch(record_batch, self._packing)
        if self._encoder is None:
            self.setup()
        return self._encoder.encode(record_batch)

    def process(self, element):
        record_batch, _ = element
        yield from self.encode(record_batch)


def coded_features(schema: schema_pb2.Schema) -> list[str]:
    """The features a codebook is kept for: every dense float32 feature of fixed shape."""
    spec = schema_utils.schema_as_feature_spec(schema).feature_spec
    return sorted(
        name
        for name, s in spec.items()
        if isinstance(s, tf.io.FixedLenFeature)
        and s.dtype == tf.float32
        and all(isinstance(d, int) and d >= 1 for d in s.shape)
    )


class CodebooksFn(beam.CombineFn):
    """Transformed `(RecordBatch, passthrough)` -> each feature's codebook (`components.data.codes`).

    A feature's accumulator is None once it has more than `codes.MAX_CODES`
    distinct values, so a continuous feature costs one batch's search.
    """

    def __init__(self, names: list[str]):
        self._names = tuple(names)

    def create_accumulator(self):
        return {name: np.empty(0, np.float32) for name in self._names}

    def add_input(self, accumulator, element):
        record_batch, _ = element
        columns = record_batch.schema.names
        for name in self._names:
            if name not in columns:
                accumulator[name] = None
            elif accumulator[name] is not None:
                values = record_batch.column(columns.index(name)).flatten()
                accumulator[name] = codes.add(
                    accumulator[name], values.to_numpy(zero_copy_only=False)
                )
        return accumulator

    def merge_accumulators(self, accumulators):
        accumulators = list(accumulators)
        return {name: codes.merge([a[name] for a in accumulators]) for name in self._names}

    def extract_output(self, accumulator):
        # An empty book (a split without examples) stays: it adds nothing to the union.
        return {
            name: book.tolist() for name, book in sorted(accumulator.items()) if book is not None
        }


def describe_shard(path: str, compression: str) -> dict[str, Any]:
    """A written shard's path, record count and sizes, read back from the file."""
    stats = layout.scan_shard(path, compression)
    return {"path": path, **dataclasses.asdict(stats)}


def _stage_shard_record(
    shards, output_path: str, settings: OutputSettings, packing, codebooks: dict[str, list[float]]
) -> None:
    """Writes one split's shard list and codebooks for `write_layout_record` to merge into
    the layout record."""
    tf.io.gfile.makedirs(settings.staging_dir)
    name = hashlib.sha256(output_path.encode()).hexdigest()[:16] + ".json"
    record = {
        "output_path": output_path,
        "packing": layout.packing_to_json(packing),
        "shards": sorted(shards, key=lambda s: s["path"]),
        "codebooks": codebooks,
    }
    with tf.io.gfile.GFile(os.path.join(settings.staging_dir, name), "w") as f:
        f.write(json.dumps(record))


# Bytes copied at a time when a shard's parts are joined.
_COPY_CHUNK = 8 << 20


def shard_path(prefix: str, index: int, num_shards: int, suffix: str) -> str:
    """Shard `index`'s file, named as Beam's `WriteToTFRecord` names it."""
    return f"{prefix}-{index:05d}-of-{num_shards:05d}{suffix}"


class WriteBundleParts(beam.DoFn):
    """Deals a bundle's records round-robin over the shards, one uncompressed part file each.

    Yields `(shard, part path)` for every part the bundle wrote, when the bundle
    ends. Nothing is held in memory: the records go to disk as they come, and
    only the part names travel on.
    """

    def __init__(self, temp_dir: str, num_shards: int):
        self._temp_dir = temp_dir
        self._num_shards = num_shards
        self._parts: dict[int, tuple[str, Any]] = {}
        self._next = 0

    def start_bundle(self):
        self._parts = {}
        # A random first shard, so that many small bundles do not all fill shard 0.
        self._next = random.randrange(self._num_shards)

    def process(self, record: bytes):
        shard = self._next
        self._next = (shard + 1) % self._num_shards
        part = self._parts.get(shard)
        if part is None:
            path = os.path.join(self._temp_dir, f"{shard:05d}-{uuid.uuid4().hex}.tfrecord")
            part = self._parts[shard] = (path, tf.io.TFRecordWriter(path))
        part[1].write(record)

    def finish_bundle(self):
        for shard, (path, writer) in sorted(self._parts.items()):
            writer.close()
            yield WindowedValue(
                (shard, path), window.GlobalWindow().max_timestamp(), [window.GlobalWindow()]
            )
        self._parts = {}


class JoinShard(beam.DoFn):
    """`(shard, part paths)` -> the shard's file: the parts' bytes, compressed once.

    Uncompressed TFRecord files join by concatenation (each record carries its
    own framing), so the join copies bytes and never parses a record. A shard
    no bundle reached is written empty, so a split always has `num_shards` files.
    """

    def __init__(self, prefix: str, settings: OutputSettings):
        self._prefix = prefix
        self._settings = settings

    def process(self, element):
        shard, parts = element
        parts = sorted(p for p in parts if p)
        settings = self._settings
        path = shard_path(self._prefix, shard, settings.num_shards, settings.suffix)
        compression = (
            CompressionTypes.GZIP
            if settings.compression == "gzip"
            else CompressionTypes.UNCOMPRESSED
        )
        out = FileSystems.create(path, compression_type=compression)
        try:
            for part in parts:
                with tf.io.gfile.GFile(part, "rb") as f:
                    while chunk := f.read(_COPY_CHUNK):
                        out.write(chunk)
        finally:
            out.close()
        for part in parts:
            tf.io.gfile.remove(part)
        yield path


class WriteShards(beam.PTransform):
    """Serialized records -> exactly `num_shards` TFRecord files at `prefix`; yields their paths.

    The records are not grouped: Beam's `WriteToTFRecord(num_shards=N)` groups
    every record by shard, and a runner that keeps a grouping in memory (the
    in-process one) holds the whole split, so memory grew with rows (491 MB more
    than stock TFX's Transform at 10^6 rows, `benchmarks/results/scale.json` at
    a932575). Here each bundle writes its records to part files as they come,
    only the part names are grouped by shard, and each shard's parts are joined
    into its file, compressed once.
    """

    def __init__(self, prefix: str, settings: OutputSettings):
        super().__init__()
        self._prefix = prefix
        self._settings = settings

    def expand(self, records):
        num_shards = self._settings.num_shards
        # Fixed when the pipeline is built, so every worker writes under the same directory.
        temp_dir = temp_dir_for(self._prefix)
        tf.io.gfile.makedirs(temp_dir)
        parts = records | "WriteParts" >> beam.ParDo(
            WriteBundleParts(temp_dir, num_shards)
        ).with_output_types(tuple[int, str])
        # Every shard gets a file, the ones no bundle reached too.
        every_shard = records.pipeline | "ShardIndices" >> beam.Create(
            [(shard, "") for shard in range(num_shards)]
        ).with_output_types(tuple[int, str])
        return (
            (parts, every_shard)
            | "PartsAndShards" >> beam.Flatten()
            | "GroupPartsByShard" >> beam.GroupByKey()
            | "JoinShards" >> beam.ParDo(JoinShard(self._prefix, self._settings))
            | "CollectPaths" >> beam.combiners.ToList()
            # Also removes parts a retried bundle left behind.
            | "RemovePartsDir" >> beam.FlatMap(_remove_dir_then, temp_dir)
        )


def _remove_dir_then(paths: list[str], directory: str) -> list[str]:
    if tf.io.gfile.isdir(directory):
        tf.io.gfile.rmtree(directory)
    return sorted(paths)


class WriteIngestionReady(beam.PTransform):
    """Encodes, packs and writes one split as configured, then records its shards."""

    def __init__(self, settings: OutputSettings, schema: schema_pb2.Schema, output_path: str):
        super().__init__()
        self._settings = settings
        self._schema = schema
        self._output_path = output_path

    def expand(self, pcoll):
        settings = self._settings
        packing = plan_packing(self._schema, settings)
        codebooks = pcoll | "Codebooks" >> beam.CombineGlobally(
            CodebooksFn(coded_features(self._schema))
        )
        return (
            pcoll
            | "EncodeAndSerialize" >> beam.ParDo(EncodeExamplesFn(self._schema, packing))
            | "WriteShards" >> WriteShards(self._output_path, settings)
            | "DescribeShards" >> beam.Map(describe_shard, settings.compression)
            | "CollectShards" >> beam.combiners.ToList()
            | "StageShardRecord"
            >> beam.Map(
                _stage_shard_record,
                self._output_path,
                settings,
                packing,
                beam.pvalue.AsSingleton(codebooks),
            )
        )


def temp_dir_for(output_path: str) -> str:
    """A new directory, beside a split's shards, for its part files while they are written."""
    head, name = os.path.split(output_path)
    return os.path.join(head, f".tfxkit-parts-{name}-{uuid.uuid4().hex}")


def clear_staged_records(settings: OutputSettings) -> None:
    """Removes shard records a failed earlier run left behind."""
    if tf.io.gfile.isdir(settings.staging_dir):
        tf.io.gfile.rmtree(settings.staging_dir)


def read_staged_records(settings: OutputSettings) -> dict[str, dict[str, Any]]:
    """The shard records the writer staged, keyed by output path prefix; removes them."""
    staged = {}
    if tf.io.gfile.isdir(settings.staging_dir):
        for name in tf.io.gfile.listdir(settings.staging_dir):
            with tf.io.gfile.GFile(os.path.join(settings.staging_dir, name)) as f:
                record = json.load(f)
            staged[record["output_path"]] = record
        tf.io.gfile.rmtree(settings.staging_dir)
    return staged


def build_layout(
    staged: dict[str, dict[str, Any]],
    prefixes: dict[str, str],
    graph_spec: dict[str, Any],
    settings: OutputSettings,
) -> layout.Layout:
    """The layout record of the splits written under `prefixes` (prefix -> split).

    Raises:
      ValueError: if a split's shard record is missing or splits were packed
        differently.
    """
    files, packings, books = [], set(), []
    for prefix, split in sorted(prefixes.items()):
        if prefix not in staged:
            raise ValueError(
                f"Transform: no shard record was written for split {split!r} ({prefix})"
            )
        record = staged[prefix]
        packings.add(json.dumps(record["packing"], sort_keys=True))
        books.append(record.get("codebooks", {}))
        for shard in record["shards"]:
            stats = layout.ShardStats(shard["records"], shard["raw_bytes"], shard["file_bytes"])
            files.append(layout.ShardFile(shard["path"], split, stats))
    if len(packings) != 1:
        raise ValueError(f"Transform: splits were packed differently: {sorted(packings)}")
    packing = layout.packing_from_json(json.loads(packings.pop()))
    return layout.Layout(
        compression=settings.compression,
        num_shards=settings.num_shards,
        packing=packing,
        parse_spec=layout.spec_to_json(layout.file_spec(graph_spec, packing)),
        files=tuple(files),
        codebooks=_merge_codebooks(books),
    )


def _merge_codebooks(books: list[dict[str, list[float]]]) -> dict[str, tuple[float, ...]]:
    """Each feature's codebook over every split (none where a split has none or the
    union is past `codes.MAX_CODES`)."""
    out = {}
    for name in sorted(set.intersection(*(set(b) for b in books)) if books else ()):
        merged = codes.merge([np.asarray(b[name], np.float32) for b in books])
        if merged is not None and merged.size:
            out[name] = tuple(merged.tolist())
    return out


def write_layout_record(
    transform_graph_uri: str, prefixes: dict[str, str], settings: OutputSettings
) -> str | None:
    """Writes the layout record of this run into the transform graph; returns its path.

    Args:
      transform_graph_uri: The transform graph directory of the run.
      prefixes: Output path prefix -> split name of every transformed split.
      settings: How the run wrote its output.

    Returns:
      The record's path, or None when the tfxkit writer wrote nothing (no
      transformed examples, or Parquet ones).
    """
    staged = read_staged_records(settings)
    if not prefixes or not staged:
        # Nothing materialized, or not as TFRecords (Parquet output stays stock).
        return None
    graph_spec = tft.TFTransformOutput(transform_graph_uri).transformed_feature_spec()
    record = build_layout(staged, prefixes, graph_spec, settings)
    return layout.write_layout(transform_graph_uri, record)
