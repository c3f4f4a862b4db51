"""The catalogue of bad inputs (`CASES`) and how to run one (`run_case`).

Each `Case` breaks one thing in a copy of a run that already pushed a model, runs the
real pipeline again and checks the documented outcome. Shared by
tests/pipelines/test_reliability*.py and benchmarks/reliability.py.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
from ml_metadata.proto import metadata_store_pb2

from components.config import ConfigError, PipelineConfig, from_dict, to_dict
from components.data.sources import DataError, taxi_csv_path
from pipelines import local_runner
from pipelines.configs import load_config
from pipelines.rundir import OutputDirError
from pipelines.summary import latest_run_executions, open_store
from testkit.full_disk import FullDiskUnavailable, full_disk

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Bounds on waits for a run in a child process (a tiny run takes a few
# minutes on two busy cores); they only stop a hung run.
CHILD_RUN_TIMEOUT_SECONDS = 900
CHILD_POLL_SECONDS = 0.2

# Small enough for a fast run, large enough for every split and vocabulary.
BASE_ROWS = 2000
# The catalogue runs the shipped taxi pipeline on 8 of its 16 features: one of
# each kind and transform (z-scored floats, a bucketized float, an identity and
# a vocabulary integer, two strings, one with OOV buckets), which include every
# feature a case or a reliability test reads (trip_seconds: a float column whose
# cells are whole numbers); the other feature columns are excluded. Transform
# traces every feature several times, and the catalogue runs the whole pipeline
# a dozen times, so fewer features shorten every case.
CATALOGUE_FEATURES = (
    "fare",
    "trip_miles",
    "trip_seconds",
    "pickup_latitude",
    "trip_start_hour",
    "pickup_community_area",
    "payment_type",
    "company",
)
# Free space Transform's output root keeps on the full disk: room for the
# launcher's bookkeeping, less than one Transform writes (about 250 KiB for
# the catalogue's tiny run), so Transform's own executor hits the full disk.
FULL_DISK_MARGIN_KIB = 128


class CaseUnavailable(Exception):
    """This host cannot set up the case (the message says what failed); reported as skipped."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One bad input.

    Attributes:
      name: Identifier (test id).
      what: The bad input, in words (README table).
      outcome: `rejected` (before any component runs), `fails` (a component
        fails and the run stops), `proceeds` (documented tolerance) or
        `killed` (the case kills the run part-way).
      message: Regex the error (or, for `proceeds`, nothing) must match.
      sees: What the user sees, in words (README table).
      make: Writes the bad input under a work dir and returns the config.
      output: Given the copied output directory, the `--output` the run
        gets (default: that directory).
      execute: Runs the config into an output directory in its own way
        (a child process, a full disk) and returns `(outcome, detail)`, or
        raises `CaseUnavailable` when this host cannot set the case up (the
        case is then skipped); default: in this process.
      check: Given `(output dir, baseline dir)` after the run, what is
        wrong with the output directory ('' when the promise holds).
      failed_at: For `fails`: the component that must fail; the run's
        summary must show it failed and no component after it ran.
    """

    name: str
    what: str
    outcome: str
    message: str
    sees: str
    make: Callable[[str, PipelineConfig], PipelineConfig]
    output: Callable[[str], str] | None = None
    execute: Callable[[PipelineConfig, str], tuple[str, str]] | None = None
    check: Callable[[str, str], str] | None = None
    failed_at: str = ""


@dataclasses.dataclass
class Result:
    case: str
    as_documented: bool
    wrongly_pushed: int
    lost_models: int
    detail: str
    # Why the case could not run on this host ('' when it ran).
    skipped: str = ""


def read_taxi_rows(n: int | None = BASE_ROWS) -> tuple[list[str], list[dict[str, str]]]:
    """The first `n` rows of the taxi CSV (all of them with `n=None`)."""
    with open(taxi_csv_path()) as f:
        reader = csv.DictReader(f)
        rows = (
            list(reader) if n is None else [row for _, row in zip(range(n), reader, strict=False)]
        )
        return list(reader.fieldnames), rows


def write_csv(path: str, fields: list[str], rows: list[dict[str, str]]) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def with_data(config: PipelineConfig, path: str, fmt: str = "csv") -> PipelineConfig:
    return dataclasses.replace(
        config, data=dataclasses.replace(config.data, builtin="", path=path, format=fmt)
    )


Rows = tuple[list[str], list[dict[str, str]]]


@dataclasses.dataclass(frozen=True)
class CsvRows:
    """A case's `make` that writes the taxi rows, changed by `mutate(fields, rows)`,
    as the run's CSV; `together` chains the mutations of several cases."""

    mutate: Callable[[list[str], list[dict[str, str]]], Rows]

    def __call__(self, work: str, base: PipelineConfig) -> PipelineConfig:
        fields, rows = read_taxi_rows()
        fields, rows = self.mutate(fields, [dict(r) for r in rows])
        return with_data(base, write_csv(os.path.join(work, "data", "taxi.csv"), fields, rows))


def _every(rows, step, **values):
    for i, row in enumerate(rows):
        if i % step == 0:
            row.update(values)
    return rows


def _malformed_row(work: str, base: PipelineConfig) -> PipelineConfig:
    fields, rows = read_taxi_rows()
    path = write_csv(os.path.join(work, "data", "taxi.csv"), fields, rows)
    with open(path, "a") as f:
        f.write("1,2,3\n")  # three cells where the header has nineteen
    return with_data(base, path)


def _example(row: dict[str, str], config: PipelineConfig) -> bytes:
    feature = {}
    kinds = {f.name: f.kind for f in config.data.features}
    for key, value in row.items():
        if value == "" or (key not in kinds and key != config.data.label.name):
            continue
        kind = kinds.get(key, "int_categorical")
        if kind == "float":
            feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
        elif kind == "int_categorical":
            feature[key] = tf.train.Feature(
                int64_list=tf.train.Int64List(value=[int(float(value))])
            )
        else:
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _corrupt_shard(work: str, base: PipelineConfig) -> PipelineConfig:
    # Every configured column filled in, so each feature is in the first
    # records of each shard (tf.Examples omit missing values, and some taxi
    # columns are almost always empty); this case is about corruption.
    _, rows = read_taxi_rows()
    kinds = {f.name: f.kind for f in base.data.features}
    for row in rows:
        for name, kind in kinds.items():
            if row[name] == "":
                row[name] = "unknown" if kind == "string_categorical" else "0"
    directory = os.path.join(work, "data", "tfrecords")
    os.makedirs(directory, exist_ok=True)
    half = len(rows) // 2
    for shard, part in (("part-0.tfrecord", rows[:half]), ("part-1.tfrecord", rows[half:])):
        with tf.io.TFRecordWriter(os.path.join(directory, shard)) as writer:
            for row in part:
                writer.write(_example(row, base))
    broken = os.path.join(directory, "part-1.tfrecord")
    size = os.path.getsize(broken)
    with open(broken, "r+b") as f:
        f.truncate(size // 2)  # cut mid-record, as an interrupted upload would
    return with_data(base, directory, fmt="tfrecord")


def _config_case(path: str, value):
    def make(work: str, base: PipelineConfig) -> PipelineConfig:
        data = to_dict(base)
        node = data
        keys = path.split(".")
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
        return from_dict(data)

    return make


def _spreadsheet_export_dir(work: str, base: PipelineConfig) -> PipelineConfig:
    # One run for two things a spreadsheet user's data directory holds.
    fields, rows = read_taxi_rows()
    directory = os.path.join(work, "data")
    path = write_csv(os.path.join(directory, "taxi.csv"), fields, rows)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write("\ufeff" + text)  # as spreadsheet programs save "CSV UTF-8"
    with open(os.path.join(directory, "README.txt"), "w") as f:
        f.write("Chicago taxi trips, 2000 rows.\nSource: the tfx examples.\n")
    return with_data(base, directory)


def _semicolon_csv(work: str, base: PipelineConfig) -> PipelineConfig:
    fields, rows = read_taxi_rows()
    path = os.path.join(work, "data", "taxi.csv")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, delimiter=";")
        writer.writeheader()
        writer.writerows(rows)
    return with_data(base, path)


def _edit_config(edit: Callable[[dict], None]):
    def make(work: str, base: PipelineConfig) -> PipelineConfig:
        data = to_dict(base)
        edit(data)
        return from_dict(data)

    return make


def _duplicate_feature(data: dict) -> None:
    data["data"]["features"].append(dict(data["data"]["features"][0]))


def _vector_size(data: dict) -> None:
    data["data"]["features"][0]["size"] = 100000


def _large_student(data: dict) -> None:
    data["distillation"]["enabled"] = True
    data["student"] = {
        **data["teacher"],
        "hidden_units": [4 * w for w in data["teacher"]["hidden_units"]],
    }


def _eval_split(example: bytes, base: PipelineConfig) -> bool:
    """Whether ExampleGen's hash split puts this serialized tf.Example in eval
    (the bucket rule of TFX's ExampleGen: sha256 of the deterministic
    serialization, train buckets first)."""
    key = tf.train.Example.FromString(example).SerializeToString(deterministic=True)
    total = base.data.train_buckets + base.data.eval_buckets
    return int(hashlib.sha256(key).hexdigest(), 16) % total >= base.data.train_buckets


def _kind_contradicted_on_eval(work: str, base: PipelineConfig) -> PipelineConfig:
    # tf.Examples carry a type per record, so (unlike a CSV column) the eval
    # split alone can disagree with the config: there, trip_start_hour holds
    # fractional hours in a column configured int_categorical.
    _, rows = read_taxi_rows()
    kinds = {f.name: f.kind for f in base.data.features}
    path = os.path.join(work, "data", "tfrecords", "part-0.tfrecord")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for row in rows:
            for name, kind in kinds.items():
                if row[name] == "":
                    row[name] = "unknown" if kind == "string_categorical" else "0"
            record = tf.train.Example.FromString(_example(row, base))
            hour = record.features.feature["trip_start_hour"]
            hour.float_list.value.append(float(row["trip_start_hour"]) + 0.5)  # replaces int64_list
            fractional, whole = record.SerializeToString(), _example(row, base)
            # The split is a hash of the record itself: the fractional version
            # is written where it lands in eval, the whole one where it lands
            # in train (else the row is left out), so each split has one type.
            if _eval_split(fractional, base):
                writer.write(fractional)
            elif not _eval_split(whole, base):
                writer.write(whole)
    return with_data(base, os.path.dirname(path), fmt="tfrecord")


def _summary(out: str) -> dict:
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def _own_failed_summary(message: str) -> Callable[[str, str], str]:
    """The rejected run wrote its own summary.json: failed, nothing pushed, the cause named."""

    def check(out: str, baseline_dir: str) -> str:
        summary = _summary(out)
        if summary["status"] != "failed" or summary["pushed_model"] is not None:
            return f"summary.json still reads {summary['status']!r}, {summary['pushed_model']!r}"
        if not re.search(message, summary.get("error", "")):
            return f"summary.json error {summary.get('error')!r} does not match {message!r}"
        if not os.path.isfile(summary.get("log", "")):
            return f"summary.json names no log file: {summary.get('log')!r}"
        return ""

    return check


def _untouched_summary(out: str, baseline_dir: str) -> str:
    if _summary(out) != _summary(baseline_dir):
        return "the previous run's summary.json was modified"
    return ""


def _not_succeeded(out: str, baseline_dir: str) -> str:
    summary = _summary(out)
    if summary["status"] == "succeeded" or summary["pushed_model"] is not None:
        return f"summary.json claims {summary['status']!r} with {summary['pushed_model']!r}"
    return ""


def run_in_child(
    config: PipelineConfig,
    out: str,
    *,
    kill_in: tuple[str, str],
) -> tuple[str, str]:
    """Runs `config` into `out` in a child process and kills it part-way.

    Args:
      config: The config.
      out: The output directory.
      kill_in: `(node, output key)`: SIGKILL the child once `node` has
        started and created its `output key` directory, i.e. while its
        executor runs.

    Returns:
      `(outcome, detail)`: `killed`, or `proceeds` / `fails` when the run
      ended before `node` started.
    """
    script = textwrap.dedent(
        f"""
        import sys
        from components.config import PipelineConfig
        from pipelines import local_runner
        try:
            local_runner.run(PipelineConfig.from_json({config.to_json()!r}), {out!r})
        except Exception as e:
            print(f"RUN FAILED {{type(e).__name__}}: {{e}}", flush=True)
            sys.exit(1)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    try:
        node, key = kill_in
        outputs = os.path.join(out, "pipeline_root", node, key)
        existing = set(os.listdir(outputs)) if os.path.isdir(outputs) else set()
        deadline = time.monotonic() + CHILD_RUN_TIMEOUT_SECONDS
        # The progress line comes first, then the launcher creates the
        # execution's output directory and starts the executor.
        for line in proc.stdout:
            lines.append(line.rstrip())
            if f"> {node} started" in line or time.monotonic() > deadline:
                break
        while proc.poll() is None and time.monotonic() < deadline:
            if os.path.isdir(outputs) and set(os.listdir(outputs)) - existing:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=CHILD_RUN_TIMEOUT_SECONDS)
                return "killed", f"killed while {node} ran (after: {lines[-1] if lines else ''})"
            time.sleep(CHILD_POLL_SECONDS)
        return "proceeds" if proc.returncode == 0 else "fails", (
            f"{node} never started; exit {proc.returncode}; last: {lines[-3:]}"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=CHILD_RUN_TIMEOUT_SECONDS)
        if proc.stdout:
            proc.stdout.close()


def _transform_reruns(work: str, base: PipelineConfig) -> PipelineConfig:
    # The baseline's own data (same input path), with another compression so
    # Transform really executes (no cache hit): ExampleGen, StatisticsGen,
    # SchemaGen and ExampleValidator stay cached (DataGate is never cached).
    return dataclasses.replace(
        base, transform=dataclasses.replace(base.transform, compression="none")
    )


def transform_output_root(config: PipelineConfig, out: str) -> str:
    return os.path.join(local_runner.paths_for(config, out).pipeline_root, "Transform")


def run_on_full_disk(config: PipelineConfig, out: str) -> tuple[str, str]:
    """Runs `config` into `out` (in this process) with Transform's output root
    on a file system that has `FULL_DISK_MARGIN_KIB` KiB left.

    Raises:
      CaseUnavailable: this host cannot make the file system.
    """
    try:
        with full_disk(
            transform_output_root(config, out), FULL_DISK_MARGIN_KIB, os.path.dirname(out)
        ):
            try:
                summary = local_runner.run(config, out, stream=io.StringIO())
            except RuntimeError as e:
                return "fails", str(e)
    except FullDiskUnavailable as e:
        raise CaseUnavailable(f"needs a size-limited file system: {e}") from None
    return "proceeds", f"status={summary['status']} pushed={summary['pushed_model']}"


def _failed_at_transform_for_space(out: str, baseline_dir: str) -> str:
    summary = _summary(out)
    if summary["status"] != "failed" or summary["pushed_model"] is not None:
        return f"summary.json reads {summary['status']!r}, {summary['pushed_model']!r}"
    # That Transform failed and nothing after it ran: `failed_at` (run_case).
    if not re.search(r"Transform ran out of disk space", summary.get("error", "")):
        return f"summary.json error {summary.get('error')!r} does not name the full disk"
    if "No space left on device" not in summary.get("cause", ""):
        return f"summary.json cause {summary.get('cause')!r} is not the library's error"
    # The failed execution published no artifact (a re-run resolves its inputs
    # through OUTPUT events, so it can never read this one's), and TFX's
    # launcher removed the output directories it had started (what else it
    # left on the full disk was copied back to the host's disk).
    store = open_store(os.path.join(out, "metadata.sqlite"))
    (pipeline,) = store.get_contexts_by_type("pipeline")
    failed = latest_run_executions(store, pipeline.name)["Transform"]
    if failed.last_known_state != metadata_store_pb2.Execution.FAILED:
        return f"Transform's execution is {failed.last_known_state}, not FAILED"
    events = store.get_events_by_execution_ids([failed.id])
    if any(e.type == metadata_store_pb2.Event.OUTPUT for e in events):
        return "the failed Transform execution published an artifact"
    for key in ("transform_graph", "transformed_examples"):
        if str(failed.id) in os.listdir(os.path.join(out, "pipeline_root", "Transform", key)):
            return f"the failed Transform execution left its {key} directory"
    return ""


def _without_label(fields, rows):
    return [c for c in fields if c != "big_tipper"], rows


def _evaluator_reruns(work: str, base: PipelineConfig) -> PipelineConfig:
    # Another threshold, so the Evaluator really executes (no cache hit); the
    # same data, so the components before the Trainer come from the cache.
    return dataclasses.replace(
        base, evaluation=dataclasses.replace(base.evaluation, max_accuracy_drop=0.9)
    )


# Columns a wide CSV carries beside the configured ones: an id and a date.
UNUSED_COLUMNS = ("trip_id", "pickup_date")


def _with_unused_columns(fields, rows):
    for i, row in enumerate(rows):
        row.update(trip_id=f"t-{i:05d}", pickup_date=f"2024-01-{i % 28 + 1:02d}")
    return [*UNUSED_COLUMNS, *fields], rows


def _newest_model(out: str) -> str:
    serving = os.path.join(out, "serving", "taxi")
    return os.path.join(serving, max((v for v in os.listdir(serving) if v.isdigit()), key=int))


def _serves_without_unused_columns(out: str, baseline_dir: str) -> str:
    """The pushed model answers a raw tf.Example holding only the configured
    features, and the run named the columns it dropped."""
    with open(os.path.join(out, "tfxkit.log")) as f:
        log = f.read()
    named = ", ".join(repr(c) for c in sorted(UNUSED_COLUMNS))
    if f"data: column(s) {named} in" not in log:
        return f"no warning naming {named} in tfxkit.log"
    problem = _serves_configured_names(out)
    return problem and f"the pushed model refused an example without {named}: {problem}"


def taxi_serving_example(config: PipelineConfig) -> tf.train.Example:
    """The first taxi CSV row as the raw tf.Example a client sends the pushed
    model: each configured feature under its name, typed by its configured kind
    (an empty cell as 0), and nothing else."""
    _, rows = read_taxi_rows(1)
    example = tf.train.Example()
    for feature in config.data.features:
        value = rows[0][feature.raw_column] or "0"
        slot = example.features.feature[feature.name]
        if feature.kind == "float":
            slot.float_list.value.append(float(value))
        elif feature.kind == "int_categorical":
            slot.int64_list.value.append(int(value))
        else:
            slot.bytes_list.value.append(value.encode())
    return example


def _serves_configured_names(out: str) -> str:
    """What is wrong when the pushed model is sent a raw tf.Example holding each
    configured feature under its name ('' when it answers)."""
    config = shipped_catalogue_pipeline()
    example = taxi_serving_example(config)
    serve = tf.saved_model.load(_newest_model(out)).signatures["serving_default"]
    try:
        probabilities = serve(examples=tf.constant([example.SerializeToString()]))["probabilities"]
    except (tf.errors.InvalidArgumentError, ValueError) as e:
        return str(e)[:300]
    if probabilities.shape != (1, config.data.label.num_classes):
        return f"the pushed model returned probabilities of shape {probabilities.shape}"
    return ""


def _cli_run_with_invalid_config(config: PipelineConfig, out: str) -> tuple[str, str]:
    """`tfxkit run` (a child process, as a user runs it) with the config saved
    as YAML and one value out of range (distillation.temperature = 0)."""
    data = to_dict(config)
    data["distillation"]["temperature"] = 0
    path = os.path.join(os.path.dirname(out), "invalid.yaml")
    with open(path, "w") as f:
        json.dump(data, f)  # JSON is YAML
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "--config", path, "--output", out],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=CHILD_RUN_TIMEOUT_SECONDS,
    )
    outcome = {0: "proceeds", 2: "rejected"}.get(result.returncode, "fails")
    return outcome, f"exit {result.returncode}: {result.stderr.strip()}"


def _gzip_csv(work: str, base: PipelineConfig) -> PipelineConfig:
    fields, rows = read_taxi_rows()
    path = write_csv(os.path.join(work, "data", "taxi.csv"), fields, rows)
    with open(path, "rb") as f:
        packed = gzip.compress(f.read())
    with open(path, "wb") as f:
        f.write(packed)  # compressed, yet named .csv (as a download often is)
    return with_data(base, path)


def _headers_in_another_order(work: str, base: PipelineConfig) -> PipelineConfig:
    fields, rows = read_taxi_rows()
    directory = os.path.join(work, "data")
    half = len(rows) // 2
    write_csv(os.path.join(directory, "part-0.csv"), fields, rows[:half])
    write_csv(os.path.join(directory, "part-1.csv"), fields[::-1], rows[half:])
    return with_data(base, directory)


def _csv_as_tfrecord(work: str, base: PipelineConfig) -> PipelineConfig:
    fields, rows = read_taxi_rows()
    return with_data(
        base, write_csv(os.path.join(work, "data", "taxi.csv"), fields, rows), "tfrecord"
    )


# Headers as a spreadsheet export has them (feature name -> header), the label's too.
HEADERS = {"trip_miles": "trip miles", "fare": "fare/usd", "big_tipper": "big tipper?"}


def _headers_that_are_not_identifiers(work: str, base: PipelineConfig) -> PipelineConfig:
    fields, rows = read_taxi_rows()
    rows = [{HEADERS.get(k, k): v for k, v in row.items()} for row in rows]
    path = write_csv(
        os.path.join(work, "data", "taxi.csv"), [HEADERS.get(c, c) for c in fields], rows
    )
    data = to_dict(with_data(base, path))["data"]
    for section in (*data["features"], data["label"]):
        section["column"] = HEADERS.get(section["name"], "")
    return from_dict({**to_dict(base), "data": data})


def _serves_under_names(out: str, baseline_dir: str) -> str:
    """The run's Transform (whose raw feature spec is the pushed model's
    serving parse spec) saw only the names, and the model answers them."""
    import tensorflow_transform as tft

    config = shipped_catalogue_pipeline()
    graphs = os.path.join(out, "pipeline_root", "Transform", "transform_graph")
    newest = max((d for d in os.listdir(graphs) if d.isdigit()), key=int)
    raw_keys = set(tft.TFTransformOutput(os.path.join(graphs, newest)).raw_feature_spec())
    names = {config.data.label.name, *(f.name for f in config.data.features)}
    if raw_keys != names:
        return (
            f"Transform's raw features are not the configured names: also "
            f"{sorted(raw_keys - names)}, without {sorted(names - raw_keys)}"
        )
    problem = _serves_configured_names(out)
    return problem and f"the pushed model refused features sent under their names: {problem}"


def _non_finite_imputed_with_the_mean(out: str, baseline_dir: str) -> str:
    """NaN in `fare` and Inf in `trip_miles` are imputed with the train mean: the run's
    transform graph z-scores them to 0, and the pushed model answers them as it answers
    each feature at its mean (read back from the graph), with finite probabilities."""
    import tensorflow_transform as tft

    graphs = os.path.join(out, "pipeline_root", "Transform", "transform_graph")
    newest = max((d for d in os.listdir(graphs) if d.isdigit()), key=int)
    tft_output = tft.TFTransformOutput(os.path.join(graphs, newest))
    config = shipped_catalogue_pipeline()
    # What the serving signature parses: every raw feature but the label.
    raw = {k: v for k, v in tft_output.raw_feature_spec().items() if k != config.data.label.name}
    names = ("fare", "trip_miles")

    def with_values(**values) -> tf.train.Example:
        example = tf.train.Example()
        example.CopyFrom(taxi_serving_example(config))
        for name, value in values.items():
            example.features.feature[name].float_list.value[:] = [value]
        return example

    def z_scores(example) -> list[float]:
        parsed = tf.io.parse_example(tf.constant([example.SerializeToString()]), raw)
        transformed = tft_output.transform_raw_features(parsed)
        return [float(tf.reshape(transformed[f"{n}_xf"], [-1])[0]) for n in names]

    non_finite = with_values(fare=float("nan"), trip_miles=float("inf"))
    for name, z in zip(names, z_scores(non_finite), strict=True):
        if not abs(z) <= 1e-4:  # NaN fails too
            return f"{name}: a non-finite value z-scored to {z}, not 0 (the mean's z-score)"
    # z = (x - mean) / std at x = 0 and x = 1 gives the mean the graph imputes.
    at_zero = z_scores(with_values(fare=0.0, trip_miles=0.0))
    at_one = z_scores(with_values(fare=1.0, trip_miles=1.0))
    means = {n: -z0 / (z1 - z0) for n, z0, z1 in zip(names, at_zero, at_one, strict=True)}
    serve = tf.saved_model.load(_newest_model(out)).signatures["serving_default"]

    def probabilities(example):
        return serve(examples=tf.constant([example.SerializeToString()]))["probabilities"].numpy()

    given, at_mean = probabilities(non_finite), probabilities(with_values(**means))
    if not np.all(np.isfinite(given)) or not np.allclose(given, at_mean, atol=1e-5):
        return f"the pushed model answered NaN / Inf with {given}, the means {means} with {at_mean}"
    return ""


def _whole_number_floats(fields, rows):
    # As pandas writes an integer column once it held a NaN.
    return fields, [{**row, "big_tipper": f"{float(row['big_tipper']):.1f}"} for row in rows]


CASES: tuple[Case, ...] = (
    Case(
        "malformed_csv_row",
        "a CSV row with fewer cells than the header",
        "fails",
        r"Columns do not match specified csv headers: \['pickup_community_area', .*\] -> \[b'1', b'2', b'3'\]",
        "CsvExampleGen fails with Beam's `Columns do not match specified csv headers: [the header] "
        "-> [the short row's cells]` (no file or line named); nothing after it runs",
        _malformed_row,
        failed_at="CsvExampleGen",
    ),
    Case(
        "wrong_type",
        "text in a numeric feature column (fare = 'abc')",
        "fails",
        r"data\.features\[0\]: 'fare' is configured as float but split '\w+' has STRING values",
        "DataGate fails naming the feature, its configured kind and the type found",
        CsvRows(lambda f, r: (f, _every(r, 50, fare="abc"))),
        failed_at="DataGate",
    ),
    Case(
        "nan_inf_floats",
        "NaN and Inf in float features",
        "proceeds",
        "",
        "run succeeds: non-finite values are treated as missing and imputed with the mean "
        "(in training and by the pushed model)",
        CsvRows(lambda f, r: (f, _every(_every(r, 7, fare="nan"), 11, trip_miles="inf"))),
        check=_non_finite_imputed_with_the_mean,
    ),
    Case(
        "empty_input",
        "a CSV with a header and no rows (every split empty)",
        "fails",
        r"DataGate: \d problem\(s\) in the input data; nothing was trained or pushed:[\s\S]*split 'train' has no examples",
        "the run fails before Transform naming the empty split",
        CsvRows(lambda f, r: (f, [])),
        failed_at="DataGate",
    ),
    Case(
        "label_out_of_range",
        "label values outside the configured classes (big_tipper = 2)",
        "fails",
        r"data\.label\.num_classes: label 'big_tipper' takes values in \[0, 2\]",
        "DataGate fails naming the label, the range found and the configured classes",
        CsvRows(lambda f, r: (f, _every(r, 13, big_tipper="2"))),
        failed_at="DataGate",
    ),
    Case(
        "new_category",
        "a category never seen before in a vocabulary feature",
        "proceeds",
        "",
        "run succeeds: the new value maps to an out-of-vocabulary bucket",
        CsvRows(lambda f, r: (f, _every(r, 5, company="Brand New Cab Co", payment_type="Crypto"))),
    ),
    Case(
        "dropped_excluded_column",
        "a column listed in data.exclude is absent from the data (trip_start_timestamp)",
        "proceeds",
        "",
        "run succeeds: excluded columns are dropped at ExampleGen, so no component (statistics, schema, drift "
        "check, Transform, serving signature, Evaluator) depends on them",
        CsvRows(lambda f, r: ([c for c in f if c != "trip_start_timestamp"], r)),
    ),
    Case(
        "unused_csv_column",
        "a CSV with columns that are neither features, the label nor excluded (trip_id, pickup_date)",
        "proceeds",
        "",
        "run succeeds with a warning naming the columns and the fix (add them to data.features, or "
        "to data.exclude to silence it); they are dropped at ExampleGen, so the pushed model serves "
        "examples without them",
        CsvRows(_with_unused_columns),
        check=_serves_without_unused_columns,
    ),
    Case(
        "dropped_feature_column",
        "a configured feature column is missing from the CSV (company)",
        "rejected",
        r"data\.features: feature column 'company' is not in '.*taxi\.csv'",
        "refused before any component runs, naming the file and the column",
        CsvRows(lambda f, r: ([c for c in f if c != "company"], r)),
    ),
    Case(
        "corrupt_tfrecord_shard",
        "a TFRecord shard truncated mid-record",
        "rejected",
        r"data\.path: '.*part-1\.tfrecord' is not a readable TFRecord file: .*truncated record",
        "refused before any component runs, naming the shard (the pre-check reads each shard's first 1000 "
        "records; corruption further in fails ExampleGen, also naming the file)",
        _corrupt_shard,
    ),
    Case(
        "invalid_config",
        "an out-of-range config value (distillation.temperature = 0)",
        "rejected",
        r"distillation\.temperature: expected a number > 0",
        "refused before any component runs, naming the field and the expected form",
        _config_case("distillation.temperature", 0),
    ),
    Case(
        "secret_in_config",
        "a credential in the config (beam_args: --password=...)",
        "rejected",
        r"beam_args\[\d\]: looks like a credential assignment; secrets must not be in the config",
        "refused before any component runs, pointing to Kubernetes secrets",
        _config_case("beam_args", ["--direct_num_workers=1", "--password=hunter2"]),
    ),
    Case(
        "fractional_label",
        "label values with fractions (big_tipper = 0.7, 1.9)",
        "fails",
        r"data\.label\.name: label 'big_tipper' has FLOAT values \(between 0 and 1\.9\) in split '\w+'; .*"
        r"fractional labels are refused, not truncated",
        "DataGate fails naming the label and the values found: fractional labels are refused, never truncated",
        CsvRows(lambda f, r: (f, _every(_every(r, 13, big_tipper="0.7"), 17, big_tipper="1.9"))),
        failed_at="DataGate",
    ),
    Case(
        "string_label",
        "class names instead of ids in the label column (big_tipper = yes / no)",
        "fails",
        r"data\.label\.name: label 'big_tipper' has STRING values in split '\w+'; labels must be integer class ids",
        "DataGate fails naming the label and the fix (map class names to ids)",
        CsvRows(
            lambda f, r: (
                f,
                [{**row, "big_tipper": "yes" if row["big_tipper"] == "1" else "no"} for row in r],
            )
        ),
        failed_at="DataGate",
    ),
    Case(
        "empty_label_cells",
        "empty cells in the label column",
        "fails",
        r"data\.label\.name: label 'big_tipper' is empty or missing in some examples of split '\w+'",
        "DataGate fails naming the label (before Transform, not deep inside the Trainer)",
        CsvRows(lambda f, r: (f, _every(r, 13, big_tipper=""))),
        failed_at="DataGate",
    ),
    Case(
        "bom_csv_beside_readme",
        "a data directory holding a CSV saved with a UTF-8 byte-order mark (as spreadsheets save "
        "'CSV UTF-8') and a README.txt",
        "proceeds",
        "",
        "run succeeds: the mark is stripped from the header, so the first column keeps its name, "
        "and only the .csv files are read; a warning names the files it ignores",
        _spreadsheet_export_dir,
    ),
    Case(
        "semicolon_delimited_csv",
        "a semicolon-delimited CSV (a spreadsheet export in many locales)",
        "rejected",
        r"data\.path: '.*taxi\.csv' looks semicolon-delimited: its header .* is a single comma-separated column",
        "refused before any component runs, naming the file, the delimiter and the fix (re-save with ',')",
        _semicolon_csv,
    ),
    Case(
        "duplicate_feature_names",
        "the same feature listed twice in data.features",
        "rejected",
        r"data\.features\[\d+\]\.name: duplicate feature 'fare'",
        "refused before any component runs, naming the field",
        _edit_config(_duplicate_feature),
    ),
    Case(
        "vector_size_on_scalar_column",
        "a feature declared size: 100000 on a scalar CSV column (fare)",
        "rejected",
        r"data\.features\[0\]\.size: feature 'fare': a CSV cell holds one value, so a CSV feature has size 1, got 100000",
        "refused before any component runs, naming the feature (TFRecord input: the size is checked against the first records)",
        _edit_config(_vector_size),
    ),
    Case(
        "identity_ids_beyond_num_buckets",
        "integer ids outside an identity categorical's [0, num_buckets) (trip_start_hour = 30 with 24 buckets)",
        "fails",
        r"data\.features\[\d+\]\.num_buckets: 'trip_start_hour' \(transform 'identity'\) takes values in \[\d+, 30\] "
        r"in split '\w+', outside its ids \[0, 24\); set num_buckets: 31 or more",
        "DataGate fails naming the feature, the largest value seen and the num_buckets that fits",
        CsvRows(lambda f, r: (f, _every(r, 13, trip_start_hour="30"))),
        failed_at="DataGate",
    ),
    Case(
        "student_larger_than_teacher",
        "a distillation student larger than its teacher (4x the hidden units, same embeddings)",
        "rejected",
        r"student: the student has at least \d+ trainable parameters, not fewer than the teacher's \d+",
        "refused when the config is built, before the teacher trains, with the fix (shrink the student or "
        "set distillation.require_compression: false)",
        _edit_config(_large_student),
    ),
    Case(
        "kind_contradicted_on_eval_only",
        "a feature whose type contradicts its configured kind in the eval split only (fractional trip_start_hour)",
        "fails",
        r"data\.features\[\d+\]: 'trip_start_hour' is configured as int_categorical but split 'eval' has FLOAT values",
        "DataGate fails naming the feature, its kind and the split",
        _kind_contradicted_on_eval,
        failed_at="DataGate",
    ),
    Case(
        "output_not_writable",
        "--output names a file (the pushed run's summary.json), so no run directory can be written there",
        "rejected",
        r"--output: '.*summary\.json' is a file, not a directory; pass --output a directory you can write to",
        "refused before anything runs or is written, naming the path and the fix; exit 2, no traceback "
        "(a path under a file or without write permission is refused the same way)",
        lambda work, base: base,
        output=lambda out: os.path.join(out, "summary.json"),
        check=_untouched_summary,
    ),
    Case(
        "rerun_rejected_summary",
        "a re-run into a directory that holds a pushed run, rejected by the input check (no label column)",
        "rejected",
        r"data\.label\.name: label column 'big_tipper' is not in '.*taxi\.csv'",
        "refused before any component runs; summary.json is this run's: status failed, the error, "
        "no pushed_model (the previous run's result does not survive)",
        CsvRows(_without_label),
        check=_own_failed_summary(r"label column 'big_tipper' is not in"),
    ),
    Case(
        "rerun_rejected_config",
        "a re-run into a directory that holds a pushed run, refused by config validation "
        "(tfxkit run with distillation.temperature = 0)",
        "rejected",
        r"exit 2: tfxkit: invalid config: distillation\.temperature: expected a number > 0",
        "refused before anything runs, naming the field and the expected form; exit 2; "
        "summary.json is this run's: status failed, stage, the error, no pushed_model",
        lambda work, base: base,
        execute=_cli_run_with_invalid_config,
        check=_own_failed_summary(r"distillation\.temperature: expected a number > 0"),
    ),
    Case(
        "whole_number_float_labels",
        "labels written as whole-number floats (big_tipper = 0.0 / 1.0, as pandas writes them "
        "after a NaN)",
        "proceeds",
        "",
        "run succeeds: a label column whose values are all whole numbers is read as the class ids "
        "it holds (one fractional value keeps it refused, as fractional_label)",
        CsvRows(_whole_number_floats),
    ),
    Case(
        "column_names_with_spaces",
        "CSV headers that are not identifiers ('trip miles', 'fare/usd', label 'big tipper?'), "
        "read with data.features[].column / data.label.column beside identifier names",
        "proceeds",
        "",
        "run succeeds: ExampleGen writes each column under its name, so every component and the "
        "pushed model's serving signature use the names (trip_miles, fare); clients send the "
        "names, not the headers",
        _headers_that_are_not_identifiers,
        check=_serves_under_names,
    ),
    Case(
        "gzip_compressed_csv",
        "a gzip-compressed CSV named taxi.csv",
        "rejected",
        r"data\.path: '.*taxi\.csv' is gzip-compressed \(it starts with the gzip signature 1f 8b\), "
        r"and CSV input is read as plain text; decompress it first",
        "refused before any component runs, naming the file, the compression and the fix (decompress)",
        _gzip_csv,
    ),
    Case(
        "csv_headers_in_different_order",
        "two CSV files of one input whose headers list the same columns in another order",
        "rejected",
        r"data\.path: '.*part-1\.csv' has the same columns in another order \(.*\) than "
        r"'.*part-0\.csv' \(.*\); the CSV files of one input must share one header line",
        "refused before any component runs, naming both files, the two headers and the fix (one "
        "header line for all files)",
        _headers_in_another_order,
    ),
    Case(
        "csv_read_as_tfrecord",
        "a CSV file configured as data.format: tfrecord",
        "rejected",
        r"data\.path: '.*taxi\.csv' is not a readable TFRecord file: it holds text \(it starts "
        r"'pickup_community_area,.*'\), yet data\.format is 'tfrecord'; for a CSV file set data\.format: csv",
        "refused before any component runs, naming the file, what it holds and the fix "
        "(data.format: csv); no raw TensorFlow text",
        _csv_as_tfrecord,
    ),
    Case(
        "killed_mid_evaluator",
        "the run is killed (SIGKILL) while the Evaluator runs",
        "killed",
        r"killed while Evaluator ran",
        "nothing pushed, earlier versions intact; summary.json reads running, never succeeded",
        _evaluator_reruns,
        execute=lambda config, out: run_in_child(config, out, kill_in=("Evaluator", "evaluation")),
        check=_not_succeeded,
    ),
    Case(
        "disk_full_during_transform",
        "the disk fills up while Transform writes (its output root on a tmpfs with 128 KiB free)",
        "fails",
        r"pipeline 'taxi' failed: Transform ran out of disk space \(No space left on device\) "
        r"writing '[^']*/pipeline_root/Transform/[^']+'; [\d.]+ \w+ free on that file system now\. "
        r"Free space on that file system, or pass --output a directory on a file system with room",
        "Transform fails naming the full disk, the path and the fix (free space or another "
        "--output); nothing pushed, earlier versions intact; summary.json: failed, that error, "
        "the library's own in `cause`",
        _transform_reruns,
        execute=run_on_full_disk,
        check=_failed_at_transform_for_space,
        failed_at="Transform",
    ),
)


def tree_digest(path: str) -> dict[str, str]:
    """sha256 of every file under `path`, keyed by relative path."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return out


def serving_versions(serving_dir: str) -> dict[str, dict[str, str]]:
    if not os.path.isdir(serving_dir):
        return {}
    return {
        v: tree_digest(os.path.join(serving_dir, v))
        for v in sorted(os.listdir(serving_dir))
        if v.isdigit()
    }


# The taxi pipeline's components in order (the shipped config: one teacher,
# no distillation); a component's successors are the ones after it.
PIPELINE_ORDER = (
    "CsvExampleGen",
    "StatisticsGen",
    "SchemaGen",
    "ExampleValidator",
    "DataGate",
    "Transform",
    "Trainer",
    "Evaluator",
    "Pusher",
)


def _failed_there_and_nothing_after(out: str, component: str) -> str:
    """What contradicts "`component` failed and nothing after it ran" in the run's summary."""
    ran = _summary(out)["components"]
    if ran.get(component, {}).get("status") != "failed":
        failed = sorted(n for n, c in ran.items() if c.get("status") == "failed")
        return f"{component} did not fail (failed: {failed})"
    after = PIPELINE_ORDER[PIPELINE_ORDER.index(component) + 1 :]
    later = sorted(n for n in ran if n.rstrip("_0123456789") in after)
    return f"{later} ran after {component} failed" if later else ""


def run_case(case: Case, baseline_dir: str, work: str, base: PipelineConfig) -> Result:
    """Runs one case against a copy of `baseline_dir` and checks the promise."""
    out = os.path.join(work, "out")
    shutil.copytree(baseline_dir, out)
    serving = local_runner.paths_for(base, out).serving_dir
    before = serving_versions(serving)
    outcome, detail = "proceeds", ""
    try:
        config = case.make(work, base)
        if case.execute is not None:
            try:
                outcome, detail = case.execute(config, out)
            except CaseUnavailable as e:
                return Result(case.name, False, 0, 0, f"skipped: {e}", skipped=str(e))
        else:
            # The console (progress, summary) is not the measurement here.
            summary = local_runner.run(
                config, case.output(out) if case.output else out, stream=io.StringIO()
            )
            detail = f"status={summary['status']} pushed={summary['pushed_model']}"
    except (ConfigError, DataError, OutputDirError) as e:
        outcome, detail = "rejected", str(e)
    except RuntimeError as e:
        outcome, detail = "fails", str(e)
    after = serving_versions(serving)
    new_versions = set(after) - set(before)
    lost = sum(1 for v, digest in before.items() if after.get(v) != digest)
    matched = outcome == case.outcome and (
        not case.message or re.search(case.message, detail) is not None
    )
    problem = case.check(out, baseline_dir) if case.check else ""
    if not problem and case.failed_at and outcome == "fails":
        problem = _failed_there_and_nothing_after(out, case.failed_at)
    if problem:
        matched, detail = False, f"{detail} [{problem}]"
    if case.outcome == "proceeds":
        wrongly = 0
        matched = matched and len(new_versions) == 1
    else:
        wrongly = len(new_versions)
    return Result(
        case.name,
        matched and wrongly == 0 and lost == 0,
        wrongly,
        lost,
        f"{outcome}: {detail[:2000]}",
    )


def together(cases: Sequence[Case]) -> Case:
    """One case for several cases documented to proceed whose bad input is a change to
    the CSV's rows (`CsvRows`): one run on the rows with every change applied, in turn,
    which must push, and every case's own check on it.

    What the test suite runs instead of one whole run per case (docs/reliability.md);
    benchmarks/reliability.py still runs each case on its own.
    """
    for case in cases:
        if case.outcome != "proceeds" or not isinstance(case.make, CsvRows):
            raise ValueError(
                f"{case.name}: only cases that proceed on changed CSV rows go together"
            )
        if case.execute or case.output:
            raise ValueError(f"{case.name}: a case with its own execute or output runs alone")
    mutations = [case.make.mutate for case in cases]

    def mutate(fields: list[str], rows: list[dict[str, str]]) -> Rows:
        for change in mutations:
            fields, rows = change(fields, rows)
        return fields, rows

    checked = [case for case in cases if case.check]

    def check(out: str, baseline_dir: str) -> str:
        return "; ".join(
            f"{case.name}: {problem}"
            for case in checked
            if (problem := case.check(out, baseline_dir))
        )

    return Case(
        "+".join(case.name for case in cases),
        "; ".join(case.what for case in cases),
        "proceeds",
        "",
        "; ".join(case.sees for case in cases),
        CsvRows(mutate),
        check=check if checked else None,
    )


def catalogue_pipeline(config: PipelineConfig) -> PipelineConfig:
    """`config` (the taxi pipeline) on `CATALOGUE_FEATURES`, its other feature
    columns added to `data.exclude`; a config already on them is returned equal."""
    kept = tuple(f for f in config.data.features if f.name in CATALOGUE_FEATURES)
    missing = sorted(set(CATALOGUE_FEATURES) - {f.name for f in kept})
    if missing:
        raise ValueError(f"the catalogue's features {missing} are not in config {config.name!r}")
    dropped = [f.raw_column for f in config.data.features if f.name not in CATALOGUE_FEATURES]
    data = dataclasses.replace(config.data, features=kept, exclude=(*config.data.exclude, *dropped))
    return dataclasses.replace(config, data=data)


def shipped_catalogue_pipeline() -> PipelineConfig:
    """The catalogue's pipeline from the shipped taxi config (what the checks
    compare a run with; the step counts do not matter to them)."""
    return catalogue_pipeline(load_config("taxi"))


def baseline_config(base: PipelineConfig, work: str) -> PipelineConfig:
    """The good run every case starts from: the catalogue's pipeline (`base`
    on `CATALOGUE_FEATURES`) on clean rows."""
    fields, rows = read_taxi_rows()
    return with_data(
        catalogue_pipeline(base), write_csv(os.path.join(work, "data", "taxi.csv"), fields, rows)
    )
