"""Data checks that stop a run before Transform (pure: TFDV protos in, messages out).

`gate_messages` collects one line per problem, naming split, feature and fix, from
ExampleValidator's anomalies (`anomaly_messages`), drift against the last gated schema
(`drift_messages`, after `relaxed`) and the config's promises (`config_messages`).
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow_data_validation as tfdv
from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2, statistics_pb2

from components.config import DataConfig, FeatureConfig, LabelConfig

_NUMERIC = {statistics_pb2.FeatureNameStatistics.INT, statistics_pb2.FeatureNameStatistics.FLOAT}
_TYPE_NAME = statistics_pb2.FeatureNameStatistics.Type.Name


def anomaly_messages(split: str, anomalies: anomalies_pb2.Anomalies, source: str) -> list[str]:
    """One line per anomalous feature (and dataset-level anomaly)."""
    messages = []
    for feature, info in sorted(anomalies.anomaly_info.items()):
        messages.append(
            f"split '{split}', feature '{feature}': {info.short_description} ({info.description}) [{source}]"
        )
    if anomalies.HasField("dataset_anomaly_info"):
        info = anomalies.dataset_anomaly_info
        messages.append(
            f"split '{split}': {info.short_description} ({info.description}) [{source}]"
        )
    return messages


def relaxed(schema: schema_pb2.Schema) -> schema_pb2.Schema:
    """A copy of `schema` that checks presence and type only."""
    out = schema_pb2.Schema()
    out.CopyFrom(schema)
    del out.string_domain[:]
    for feature in out.feature:
        for field in (
            "domain",
            "string_domain",
            "int_domain",
            "float_domain",
            "shape",
            "value_count",
            "distribution_constraints",
        ):
            feature.ClearField(field)
        feature.presence.ClearField("min_fraction")
    return out


def drift_messages(
    split: str,
    stats: statistics_pb2.DatasetFeatureStatisticsList,
    baseline: schema_pb2.Schema,
    exclude: tuple[str, ...] = (),
) -> list[str]:
    """Drift of `stats` against `baseline`, ignoring the `exclude`d columns.

    Runs since ExampleGen drops `data.exclude` have no excluded column in
    their schema; an older baseline may still hold one, and its absence now
    is not drift.
    """
    schema = relaxed(baseline)
    kept = [f for f in schema.feature if f.name not in exclude]
    del schema.feature[:]
    schema.feature.extend(kept)
    anomalies = tfdv.validate_statistics(stats, schema)
    return anomaly_messages(split, anomalies, "schema drift against the last validated run")


def _features(
    stats: statistics_pb2.DatasetFeatureStatisticsList,
) -> dict[str, statistics_pb2.FeatureNameStatistics]:
    dataset = stats.datasets[0]
    return {(f.path.step[0] if f.path.step else f.name): f for f in dataset.features}


def _num_present(stat: statistics_pb2.FeatureNameStatistics) -> int:
    kind = stat.WhichOneof("stats")
    return getattr(stat, kind).common_stats.num_non_missing if kind else 0


def _named(field: FeatureConfig | LabelConfig) -> str:
    """`'fare'`, or `'fare' (column 'fare/usd')` for one read from another column:
    the statistics know the name, the user's data the column."""
    return f"'{field.name}'" + (f" (column {field.column!r})" if field.column else "")


def config_messages(
    split: str, stats: statistics_pb2.DatasetFeatureStatisticsList, data: DataConfig
) -> list[str]:
    """Checks the data against what the config promises."""
    if not stats.datasets or stats.datasets[0].num_examples == 0:
        return [f"split '{split}' has no examples; check data.path and the train/eval buckets"]
    features = _features(stats)
    messages = []
    label = features.get(data.label.name)
    label_fix = f"labels must be integer class ids in [0, {data.label.num_classes})"
    if label is None:
        messages.append(
            f"data.label.name: split '{split}' has no column for label {_named(data.label)}"
        )
    elif label.type not in _NUMERIC:
        messages.append(
            f"data.label.name: label {_named(data.label)} has {_TYPE_NAME(label.type)} values in split '{split}'; "
            f"{label_fix}: map the class names to ids 0, 1, ... in the data, or point data.label.name at the class-id column"
        )
    else:
        if label.type == statistics_pb2.FeatureNameStatistics.FLOAT:
            # A cast would truncate 0.7 to 0 and train on wrong classes. A column of
            # whole-number floats (1.0) reaches here as int64 ids (`components.example_gen`).
            messages.append(
                f"data.label.name: label {_named(data.label)} has FLOAT values (between {label.num_stats.min:g} and "
                f"{label.num_stats.max:g}) in split '{split}'; {label_fix}: fractional labels are refused, "
                "not truncated (a column of whole-number floats such as 1.0 is read as the ids it holds)"
            )
        common = label.num_stats.common_stats
        # A CSV cell left empty is an empty value list (present, no value);
        # a tf.Example without the key is missing.
        if common.num_missing or common.min_num_values < 1:
            count = f"{common.num_missing} examples" if common.num_missing else "some examples"
            messages.append(
                f"data.label.name: label {_named(data.label)} is empty or missing in {count} of split '{split}'; "
                "every example needs a class id: fill in or drop those rows"
            )
        lo, hi = label.num_stats.min, label.num_stats.max
        if lo < 0 or hi > data.label.num_classes - 1:
            messages.append(
                f"data.label.num_classes: label {_named(data.label)} takes values in [{lo:g}, {hi:g}] in split '{split}', "
                f"outside the configured classes [0, {data.label.num_classes - 1}]; fix the data or data.label.num_classes"
            )
    for i, feature in enumerate(data.features):
        stat = features.get(feature.name)
        if stat is None:
            messages.append(
                f"data.features[{i}]: feature {_named(feature)} is absent from split '{split}'"
            )
            continue
        if _num_present(stat) == 0:
            continue  # an all-empty column has no type to check; it is imputed
        wrong = (feature.kind == "float" and stat.type not in _NUMERIC) or (
            feature.kind == "int_categorical"
            and stat.type != statistics_pb2.FeatureNameStatistics.INT
        )
        if wrong:
            messages.append(
                f"data.features[{i}]: {_named(feature)} is configured as {feature.kind} but split '{split}' has "
                f"{_TYPE_NAME(stat.type)} values (a non-numeric cell makes the whole CSV column a string); fix the data or the kind"
            )
        elif feature.kind == "int_categorical" and feature.effective_transform == "identity":
            # Ids outside [0, num_buckets) would all share the one extra bucket: refused, so the
            # configured range is never silently wrong.
            lo, hi = stat.num_stats.min, stat.num_stats.max
            if lo < 0 or hi >= feature.num_buckets:
                messages.append(
                    f"data.features[{i}].num_buckets: {_named(feature)} (transform 'identity') takes values in "
                    f"[{lo:g}, {hi:g}] in split '{split}', outside its ids [0, {feature.num_buckets}); "
                    f"set num_buckets: {int(hi) + 1} or more, or use transform: vocabulary"
                )
    return messages


def gate_messages(
    stats_by_split: Mapping[str, statistics_pb2.DatasetFeatureStatisticsList],
    anomalies_by_split: Mapping[str, anomalies_pb2.Anomalies],
    data: DataConfig,
    baseline: schema_pb2.Schema | None,
) -> list[str]:
    """All problems that must stop the run, in a stable order."""
    messages: list[str] = []
    for split in sorted(stats_by_split):
        stats = stats_by_split[split]
        messages += config_messages(split, stats, data)
        if split in anomalies_by_split:
            messages += anomaly_messages(split, anomalies_by_split[split], "ExampleValidator")
        if baseline is not None and stats.datasets and stats.datasets[0].num_examples:
            # Only configured columns reach the statistics (`components.example_gen`);
            # a baseline from before may hold others, whose absence now is not drift.
            kept = {data.label.name, *(f.name for f in data.features), *_features(stats)}
            gone = tuple(f.name for f in baseline.feature if f.name not in kept)
            messages += drift_messages(split, stats, baseline, tuple(data.exclude) + gone)
    return messages
