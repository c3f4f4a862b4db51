"""What a pipeline run's Beam stages wrote, in a form that does not depend on the runner.

A runner decides which worker writes which record into which shard, and in what order; it
does not decide what is written. `beam_stage_outputs` reads a run's pipeline root into
digests that keep the content and drop the placement: every split's records as a sorted
multiset of hashes, statistics, schema, the transform graph's files (its SavedModel's
serialized bytes excepted: they hold generated names), the layout record without its
per-shard placement; the transformed examples as per-feature value multisets, and
statistics as numbers, both compared within a float tolerance (`differences`): a sum's
last bits follow the order a runner adds in, and what TFDV's quantiles sketch gives (a
median, histograms) follows the order it merges in, within the sketch's epsilon. Two runs of one config on two runners are
equal on what their Beam stages wrote when `differences` finds nothing.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
from typing import Any

# The Beam stages whose outputs are compared, by their artifact directories.
EXAMPLES = "CsvExampleGen/examples"
STATISTICS = "StatisticsGen/statistics"
SCHEMA = "SchemaGen/schema"
TRANSFORM_GRAPH = "Transform/transform_graph"
TRANSFORMED = "Transform/transformed_examples"
LAYOUT_RECORD = "tfxkit_layout.json"


def _one(pipeline_root: str, artifact: str) -> str:
    """The artifact's one directory (a run writes each once)."""
    found = sorted(glob.glob(os.path.join(pipeline_root, artifact, "*")))
    if len(found) != 1:
        raise AssertionError(f"{artifact}: expected one output of the run, found {found}")
    return found[0]


def _records(path: str) -> list[bytes]:
    """The records of a TFRecord file, GZIP or not (read without TensorFlow's reader)."""
    opener = gzip.open if path.endswith(".gz") else open
    out = []
    with opener(path, "rb") as f:
        data = f.read()
    offset = 0
    while offset < len(data):
        length = int.from_bytes(data[offset : offset + 8], "little")
        start = offset + 12
        out.append(data[start : start + length])
        offset = start + length + 4
    return out


def _canonical_example(record: bytes) -> bytes:
    """A tf.Example's bytes with its features in name order: the encoder writes them in
    the schema's order, which follows the order statistics came in."""
    from tensorflow.core.example import example_pb2

    example = example_pb2.Example()
    example.ParseFromString(record)
    return example.SerializeToString(deterministic=True)


def record_multisets(directory: str) -> dict[str, dict[str, Any]]:
    """Split -> record count and the digest of its tf.Examples' sorted hashes."""
    out = {}
    for split_dir in sorted(glob.glob(os.path.join(directory, "Split-*"))):
        hashes = sorted(
            hashlib.sha256(_canonical_example(record)).hexdigest()
            for path in sorted(glob.glob(os.path.join(split_dir, "*")))
            for record in _records(path)
        )
        out[os.path.basename(split_dir)] = {
            "records": len(hashes),
            "digest": hashlib.sha256("".join(hashes).encode()).hexdigest(),
        }
    return out


def _statistics(directory: str) -> dict[str, Any]:
    from google.protobuf import json_format
    from tensorflow_metadata.proto.v0 import statistics_pb2

    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "Split-*", "FeatureStats.pb"))):
        stats = statistics_pb2.DatasetFeatureStatisticsList()
        with open(path, "rb") as f:
            stats.ParseFromString(f.read())
        for dataset in stats.datasets:
            features = sorted(dataset.features, key=lambda f: str(f.path) or f.name)
            del dataset.features[:]
            dataset.features.extend(features)
        out[os.path.basename(os.path.dirname(path))] = json_format.MessageToDict(stats)
    return out


def _schema(path: str) -> str:
    """A schema in text form, its features and domains in name order (a runner's order of
    statistics sets theirs)."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    schema = schema_pb2.Schema()
    with open(path) as f:
        text_format.Parse(f.read(), schema)
    for field in ("feature", "string_domain"):
        items = sorted(getattr(schema, field), key=lambda item: item.name)
        del getattr(schema, field)[:]
        getattr(schema, field).extend(items)
    return text_format.MessageToString(schema)


def _files(directory: str, skip: tuple[str, ...]) -> dict[str, str]:
    """Relative path -> content digest of the files under `directory`; schemas by `_schema`."""
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "**", "*"), recursive=True)):
        name = os.path.relpath(path, directory)
        if not os.path.isfile(path) or name.endswith(skip):
            continue
        if name.endswith("schema.pbtxt"):
            out[name] = hashlib.sha256(_schema(path).encode()).hexdigest()
            continue
        with open(path, "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def _layout(graph: str) -> dict[str, Any]:
    """The layout record without where each record landed: the files' count and their
    records per split, the encoding, packing and parse spec."""
    with open(os.path.join(graph, LAYOUT_RECORD)) as f:
        record = json.load(f)
    files = record.pop("files")
    per_split: dict[str, dict[str, int]] = {}
    for shard in files:
        split = per_split.setdefault(shard["split"], {"files": 0, "records": 0})
        split["files"] += 1
        split["records"] += shard["records"]
    return {**record, "splits": per_split}


def example_columns(directory: str) -> dict[str, dict[str, Any]]:
    """Split -> record count and, per feature, the sorted multiset of its values: a float
    computed from a sum (a mean, a variance) may differ in its last bits with the order a
    runner added in, which moves every value it transforms; columns compare within a
    tolerance where record hashes could not."""
    from tensorflow.core.example import example_pb2

    out = {}
    for split_dir in sorted(glob.glob(os.path.join(directory, "Split-*"))):
        columns: dict[str, list] = {}
        count = 0
        for path in sorted(glob.glob(os.path.join(split_dir, "*"))):
            for record in _records(path):
                example = example_pb2.Example()
                example.ParseFromString(record)
                count += 1
                for name, feature in example.features.feature.items():
                    kind = feature.WhichOneof("kind")
                    values = list(getattr(feature, kind).value) if kind else []
                    columns.setdefault(name, []).append(values)
        out[os.path.basename(split_dir)] = {
            "records": count,
            "columns": {name: sorted(values) for name, values in sorted(columns.items())},
        }
    return out


# TFDV's quantiles sketch answers within this fraction of the count in rank (its
# `StatsOptions.epsilon` default). The sketch merges partial sketches in the order the
# runner combines them, so a numeric feature's median and histograms, which it derives
# from the sketch, move between runners: compared within this much in rank.
SKETCH_EPSILON = 0.01
_SKETCHED = ("median", "histograms")


def _rank_span(value: float, stats: dict, ranks: float) -> float:
    """The values `ranks` ranks cover around `value`, from the local density its
    QUANTILES histogram gives (a bucket holds its count of values between its bounds);
    0 where the value sits only in buckets of one value (ties: the sketch gives it
    exactly)."""
    per_rank = [
        (bucket.get("highValue", 0.0) - bucket.get("lowValue", 0.0)) / bucket["sampleCount"]
        for histogram in stats.get("histograms", [])
        if histogram.get("type") == "QUANTILES"
        for bucket in histogram.get("buckets", [])
        if bucket.get("sampleCount", 0.0) > 0
        and bucket.get("lowValue", 0.0) <= value <= bucket.get("highValue", 0.0)
    ]
    return ranks * max(per_rank, default=0.0)


def _num_stats_differences(a: dict, b: dict, rel: float, path: str) -> list[str]:
    """A feature's `numStats` compared: what is counted or summed within `rel`; what the
    quantiles sketch gives within `SKETCH_EPSILON` of the count in rank: a bucket's count
    within that many values, a quantile (the median, a QUANTILES bucket's bounds) within
    the values that many ranks span there, read from either side's quantiles (a
    STANDARD histogram's bounds split min..max evenly: they keep `rel`)."""
    ranks = SKETCH_EPSILON * max(float(a.get("commonStats", {}).get("numNonMissing", 0)), 1.0)
    out = _dict_differences(a, b, rel, path, skip=_SKETCHED)

    def near(x: Any, y: Any, tolerance: float, where: str) -> list[str]:
        return [] if abs(float(x) - float(y)) <= tolerance else [f"{where}: {x!r} against {y!r}"]

    def quantile(x: Any, y: Any, where: str) -> list[str]:
        x, y = float(x), float(y)
        span = max(_rank_span(v, side, ranks) for v in (x, y) for side in (a, b))
        return near(x, y, max(span, rel * max(1.0, abs(x), abs(y))), where)

    out += quantile(a.get("median", 0.0), b.get("median", 0.0), f"{path}.median")
    ours, theirs = a.get("histograms", []), b.get("histograms", [])
    if len(ours) != len(theirs):
        return out + [f"{path}.histograms: {len(ours)} against {len(theirs)} items"]
    for i, (x, y) in enumerate(zip(ours, theirs, strict=True)):
        where = f"{path}.histograms[{i}]"
        out += _dict_differences(x, y, rel, where, skip=("buckets",))
        xb, yb = x.get("buckets", []), y.get("buckets", [])
        if len(xb) != len(yb):
            out.append(f"{where}.buckets: {len(xb)} against {len(yb)} items")
            continue
        for j, (p, q) in enumerate(zip(xb, yb, strict=True)):
            at = f"{where}.buckets[{j}]"
            out += near(
                p.get("sampleCount", 0.0), q.get("sampleCount", 0.0), ranks, f"{at}.sampleCount"
            )
            for key in ("lowValue", "highValue"):
                if x.get("type") == "QUANTILES":
                    out += quantile(p.get(key, 0.0), q.get(key, 0.0), f"{at}.{key}")
                else:
                    out += differences(p.get(key, 0.0), q.get(key, 0.0), rel, f"{at}.{key}")
    return out


def _dict_differences(a: dict, b: dict, rel: float, path: str, skip: tuple = ()) -> list[str]:
    """`differences` key by key, leaving out the keys in `skip`."""
    keys = (set(a) | set(b)) - set(skip)
    out = [f"{path}.{k}: only in one" for k in sorted(keys - (set(a) & set(b)), key=str)]
    for key in sorted(keys & set(a) & set(b), key=str):
        out += differences(a[key], b[key], rel, f"{path}.{key}")
    return out


def differences(a: Any, b: Any, rel: float = 1e-5, path: str = "") -> list[str]:
    """Where `a` and `b` differ (JSON-like values): floats within `rel` (relative, or
    absolute below 1) count as equal, everything else must be equal; a feature's
    `numStats` (statistics) as `_num_stats_differences` says."""
    if path.endswith(".numStats") and isinstance(a, dict) and isinstance(b, dict):
        return _num_stats_differences(a, b, rel, path)
    if isinstance(a, dict) and isinstance(b, dict):
        return _dict_differences(a, b, rel, path)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} against {len(b)} items"]
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += differences(x, y, rel, f"{path}[{i}]")
            if len(out) > 20:
                break
        return out
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            if abs(a - b) <= rel * max(1.0, abs(a), abs(b)):
                return []
    elif a == b:
        return []
    return [f"{path}: {a!r} against {b!r}"]


def beam_stage_outputs(pipeline_root: str) -> dict[str, Any]:
    """The runner-independent content of what a run's Beam stages wrote under `pipeline_root`."""
    graph = _one(pipeline_root, TRANSFORM_GRAPH)
    return {
        "examples": record_multisets(_one(pipeline_root, EXAMPLES)),
        "statistics": _statistics(_one(pipeline_root, STATISTICS)),
        "schema": _files(_one(pipeline_root, SCHEMA), ()),
        # saved_model.pb and fingerprint.pb carry names TF generates per trace.
        "transform_graph": _files(graph, ("saved_model.pb", "fingerprint.pb", LAYOUT_RECORD)),
        "transformed_examples": example_columns(_one(pipeline_root, TRANSFORMED)),
        "layout_record": _layout(graph),
    }


def rerun_evaluator(metadata_path: str, pipeline_name: str, out_dir: str, beam_args: list[str]):
    """Runs the Evaluator executor again on what a run's Evaluator read (its input artifacts
    and properties, from the run's ML Metadata), on `beam_args`' runner.

    Returns:
      `(metrics, blessed)`: the overall-slice metrics it wrote and whether it blessed.
    """
    from ml_metadata.proto import metadata_store_pb2
    from tfx.components.evaluator import executor as evaluator_executor
    from tfx.dsl.components.base import base_beam_executor
    from tfx.types import artifact_utils, standard_artifacts

    from pipelines.summary import latest_run_executions, open_store, read_metrics

    store = open_store(metadata_path)
    execution = latest_run_executions(store, pipeline_name)["Evaluator"]
    inputs: dict[str, list] = {}
    for event in store.get_events_by_execution_ids([execution.id]):
        if event.type != metadata_store_pb2.Event.INPUT:
            continue
        (artifact,) = store.get_artifacts_by_id([event.artifact_id])
        (kind,) = store.get_artifact_types_by_id([artifact.type_id])
        key = event.path.steps[0].key
        inputs.setdefault(key, []).append(artifact_utils.deserialize_artifact(kind, artifact))
    properties = {k: v.string_value for k, v in execution.custom_properties.items()}
    outputs = {}
    for key, cls in (("evaluation", standard_artifacts.ModelEvaluation),
                     ("blessing", standard_artifacts.ModelBlessing)):  # fmt: skip
        artifact = cls()
        artifact.uri = os.path.join(out_dir, key)
        os.makedirs(artifact.uri)
        outputs[key] = [artifact]
    context = base_beam_executor.BaseBeamExecutor.Context(
        beam_pipeline_args=beam_args, tmp_dir=os.path.join(out_dir, "tmp")
    )
    evaluator_executor.Executor(context).Do(inputs, outputs, properties)
    blessing = outputs["blessing"][0].uri
    return read_metrics(outputs["evaluation"][0].uri), os.path.exists(
        os.path.join(blessing, "BLESSED")
    )
