"""End-to-end runs of the real pipeline with BeamDagRunner on built-in data.

Each run uses tiny step counts; ML Metadata (SQLite under the run directory)
is the witness of what executed, and the pushed SavedModel must serve raw
serialized tf.Examples read from the input data.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from ml_metadata.proto import metadata_store_pb2

from components.data.sources import taxi_csv_path
from pipelines import local_runner
from pipelines.summary import latest_run_executions, open_store
from testkit.tiny import tiny

EXPECTED_NODES = {
    "StatisticsGen",
    "SchemaGen",
    "ExampleValidator",
    "DataGate",
    "Transform",
    "Trainer",
    "Evaluator",
    "Pusher",
}
# The shipped taxi config trains one model: no teacher beats its small
# student there (pipelines/configs/taxi.yaml), so it has no Distiller.
RESOLVER = "latest_validated_schema"
# The served model's Resolver (evaluation.against_served): on a first run it
# resolves nothing and succeeds; the Evaluator then judges by min_accuracy.
SERVED_RESOLVER = "latest_served_model"
# The gate re-checks every run against the newest validated schema, so it is
# the one node that is never served from the cache.
CACHEABLE_NODES = EXPECTED_NODES - {"DataGate"}


def _node_states(output_dir, name):
    store = open_store(os.path.join(output_dir, "metadata.sqlite"))
    return {node: e.last_known_state for node, e in latest_run_executions(store, name).items()}


def _raw_examples_from_csv(path, raw_spec, n):
    """Serialized tf.Examples built from the first `n` CSV rows (empty cells omitted)."""
    with open(path) as f:
        rows = list(csv.DictReader(io.StringIO(f.read())))[:n]
    examples = []
    for row in rows:
        feature = {}
        for key, spec in raw_spec.items():
            value = row.get(key, "")
            if value == "":
                continue
            if spec.dtype == tf.string:
                feature[key] = tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[value.encode()])
                )
            elif spec.dtype == tf.int64:
                feature[key] = tf.train.Feature(
                    int64_list=tf.train.Int64List(value=[int(float(value))])
                )
            else:
                feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
        examples.append(
            tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
        )
    return examples


def _served_eval_split(output, pushed_dir, label="big_tipper", batch=512):
    """Labels of ExampleGen's eval split and the classes the pushed model serves for them."""
    (split,) = tf.io.gfile.glob(
        os.path.join(output, "pipeline_root", "CsvExampleGen", "examples", "*", "Split-eval")
    )
    files = tf.io.gfile.glob(os.path.join(split, "*"))
    records = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    labels = np.array(
        [
            tf.train.Example.FromString(r).features.feature[label].int64_list.value[0]
            for r in records
        ]
    )
    model = tf.saved_model.load(pushed_dir)
    serve = model.signatures["serving_default"]
    classes = np.concatenate(
        [
            serve(examples=tf.constant(records[i : i + batch]))["classes"].numpy().reshape(-1)
            for i in range(0, len(records), batch)
        ]
    )
    return labels, classes


def _serve(pushed_dir, examples):
    model = tf.saved_model.load(pushed_dir)
    outputs = model.signatures["serving_default"](examples=tf.constant(examples))
    return {k: v.numpy() for k, v in outputs.items()}


@pytest.fixture(scope="module")
def taxi_run(tiny_taxi_run):
    """The tiny taxi run the console script made (tests/conftest.py, shared
    with the reliability tests): `(output_dir, summary)`."""
    return tiny_taxi_run["output"], tiny_taxi_run["summary"]


@pytest.mark.multiprocess
@pytest.mark.e2e
def test_taxi_every_component_ran_and_model_was_pushed(taxi_run, taxi_config):
    output, summary = taxi_run
    states = _node_states(output, taxi_config.name)
    assert EXPECTED_NODES | {"CsvExampleGen", RESOLVER, SERVED_RESOLVER} == set(states)
    assert all(
        s == metadata_store_pb2.Execution.COMPLETE for n, s in states.items() if n != RESOLVER
    ), states
    assert summary["status"] == "succeeded"
    assert summary["pushed_model"] and summary["pushed_model"].startswith(
        os.path.join(output, "serving", "taxi")
    )
    # Checked against the pushed model served on ExampleGen's eval split here,
    # independently of TFMA.
    labels, classes = _served_eval_split(output, summary["pushed_model"])
    assert summary["metrics"]["example_count"] == len(labels) > 0
    assert summary["metrics"]["accuracy"] == pytest.approx(np.mean(classes == labels), abs=1e-6)
    on_disk = json.load(open(os.path.join(output, "summary.json")))
    assert on_disk["status"] == "succeeded"
    assert set(on_disk["components"]) == set(states)
    assert on_disk["components"][RESOLVER]["status"] == "empty"  # first run: no baseline yet
    assert all(
        c["status"] == "succeeded" and c["seconds"] >= 0
        for n, c in on_disk["components"].items()
        if n != RESOLVER
    )


# Console lines a successful run may print besides progress and the summary
# (which lists every component): headroom, far below the ~180 lines of
# library start-up noise the log file takes instead.
MAX_CONSOLE_LINES = 60


@pytest.mark.multiprocess
@pytest.mark.e2e
def test_taxi_console_shows_progress_and_summary_and_the_log_keeps_the_rest(tiny_taxi_run):
    output, summary = tiny_taxi_run["output"], tiny_taxi_run["summary"]
    stdout, stderr = tiny_taxi_run["stdout"], tiny_taxi_run["stderr"]
    out = stdout.splitlines()
    for node in summary["components"]:
        assert any(line.endswith(f"> {node} started") for line in out), (node, out)
        assert any(f"< {node} finished (" in line for line in out), (node, out)
    assert "Pipeline succeeded" in out
    log = os.path.join(output, "tfxkit.log")
    assert out[-1] == f"Full log: {log}"
    assert summary["log"] == log
    # No traceback (the first run's empty drift baseline included) and no
    # library start-up noise on the console.
    assert "Traceback" not in stderr and "Traceback" not in stdout
    assert len(out) + len(stderr.splitlines()) <= MAX_CONSOLE_LINES, (stdout, stderr)
    with open(log) as f:
        text = f.read()
    assert "node Transform is finished." in text
    assert "Input resolution error" in text  # kept in the log, with its traceback


@pytest.mark.multiprocess
@pytest.mark.e2e
def test_taxi_pushed_model_serves_raw_examples(taxi_run):
    output, summary = taxi_run
    import tensorflow_transform as tft

    pushed = summary["pushed_model"]
    transform_dirs = tf.io.gfile.glob(
        os.path.join(output, "pipeline_root", "Transform", "transform_graph", "*")
    )
    raw_spec = tft.TFTransformOutput(transform_dirs[0]).raw_feature_spec()
    examples = _raw_examples_from_csv(taxi_csv_path(), raw_spec, 16)
    outputs = _serve(pushed, examples)
    assert outputs["probabilities"].shape == (16, 2)
    np.testing.assert_allclose(outputs["probabilities"].sum(axis=1), 1.0, rtol=1e-5)
    assert set(outputs["classes"]) <= {0, 1}


@pytest.mark.multiprocess
@pytest.mark.e2e
def test_taxi_transform_wrote_the_configured_shards_and_compression(taxi_run, taxi_config):
    from components.data import layout as transform_layout

    output, _ = taxi_run
    root = os.path.join(output, "pipeline_root", "Transform")
    (graph,) = tf.io.gfile.glob(os.path.join(root, "transform_graph", "*"))
    layout = transform_layout.read_layout(graph)
    shards = transform_layout.resolve_num_shards(
        taxi_config.transform.num_shards, taxi_config.strategy.workers
    )
    assert (layout.compression, layout.num_shards) == (taxi_config.transform.compression, shards)
    suffix = ".gz" if taxi_config.transform.compression == "gzip" else ".tfrecord"
    for split in ("train", "eval"):
        files = sorted(
            tf.io.gfile.glob(os.path.join(root, "transformed_examples", "*", f"Split-{split}", "*"))
        )
        assert len(files) == shards and all(f.endswith(suffix) for f in files)
        assert layout.split_files(split) == files


@pytest.mark.multiprocess
@pytest.mark.e2e
def test_taxi_rerun_is_served_from_cache(tiny_taxi_run, taxi_config, tmp_path):
    # A copy: the shared run stays as the other tests expect it.
    output = str(tmp_path / "out")
    shutil.copytree(tiny_taxi_run["output"], output)
    second = local_runner.run(tiny_taxi_run["config"], output, runner="beam")
    states = _node_states(output, taxi_config.name)
    cached = {n for n, s in states.items() if s == metadata_store_pb2.Execution.CACHED}
    # The copy's Pusher pushes to the copy's own serving directory (its
    # destination changed), so it runs again; the Evaluator now has a served
    # model to compare with (the first run's), so it runs again; everything
    # before them is cached.
    reran = {"Evaluator", "Pusher"}
    assert CACHEABLE_NODES - reran <= cached, states
    assert second["status"] == "succeeded"
    assert all(second["components"][n]["status"] == "cached" for n in CACHEABLE_NODES - reran)
    gate = second["gates"]["Evaluator"]
    assert gate["against"] == "served" and gate["blessed"] is True
    assert gate["baseline_accuracy"] == pytest.approx(
        tiny_taxi_run["summary"]["metrics"]["accuracy"]
    )
    assert second["pushed_model"].startswith(os.path.join(output, "serving"))
    # The second run's gate found the first run's validated schema.
    assert second["components"][RESOLVER]["status"] == "succeeded"
    assert second["components"]["DataGate"]["status"] == "succeeded"


@pytest.mark.e2e
def test_digits_end_to_end(tmp_path, digits_config):
    summary = local_runner.run(tiny(digits_config), str(tmp_path), runner="beam")
    states = _node_states(str(tmp_path), digits_config.name)
    # digits distils a student (tiny() leaves out the scratch baseline), which
    # a second Evaluator compares with the served model.
    assert EXPECTED_NODES | {
        "ImportExampleGen",
        RESOLVER,
        SERVED_RESOLVER,
        "Distiller",
        "ServedEvaluator",
    } == set(states)
    assert all(
        s == metadata_store_pb2.Execution.COMPLETE for n, s in states.items() if n != RESOLVER
    ), states
    assert summary["pushed_model"]
    records = list(
        tf.data.TFRecordDataset(str(tmp_path / "data" / "digits" / "digits.tfrecord")).take(8)
    )
    examples = []
    for r in records:
        ex = tf.train.Example.FromString(r.numpy())
        del ex.features.feature["label"]
        examples.append(ex.SerializeToString())
    outputs = _serve(summary["pushed_model"], examples)
    assert outputs["probabilities"].shape == (8, 10)
    assert set(outputs["classes"]) <= set(range(10))


def _user_csv_config(config, path):
    return dataclasses.replace(
        config, data=dataclasses.replace(config.data, builtin="", path=str(path))
    )


def test_missing_data_path_fails_before_anything_runs(tmp_path, taxi_config):
    config = _user_csv_config(taxi_config, tmp_path / "nope.csv")
    with pytest.raises(ValueError, match=r"data\.path: '.*nope\.csv' does not exist"):
        local_runner.run(config, str(tmp_path / "out"))
    assert not (tmp_path / "out" / "serving").exists()
    assert not (tmp_path / "out" / "metadata.sqlite").exists()


def _copy_taxi_without(tmp_path, column, rows=50):
    with open(taxi_csv_path()) as f:
        reader = csv.DictReader(f)
        fields = [c for c in reader.fieldnames if c != column]
        data = [row for _, row in zip(range(rows), reader, strict=False)]
    path = tmp_path / "taxi.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(data)
    return path


def test_csv_without_label_column_names_file_and_column(tmp_path, taxi_config):
    path = _copy_taxi_without(tmp_path, "big_tipper")
    with pytest.raises(
        ValueError, match=r"data\.label\.name: label column 'big_tipper' is not in '.*taxi\.csv'"
    ):
        local_runner.run(_user_csv_config(taxi_config, path), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "serving").exists()


def test_feature_absent_from_data_names_file_and_column(tmp_path, taxi_config):
    path = _copy_taxi_without(tmp_path, "company")
    with pytest.raises(
        ValueError, match=r"data\.features: feature column 'company' is not in '.*taxi\.csv'"
    ):
        local_runner.run(_user_csv_config(taxi_config, path), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "serving").exists()


def test_unreadable_tfrecord_names_the_file(tmp_path, digits_config):
    path = tmp_path / "broken.tfrecord"
    path.write_bytes(b"this is not a tfrecord file at all")
    config = dataclasses.replace(
        digits_config, data=dataclasses.replace(digits_config.data, builtin="", path=str(path))
    )
    with pytest.raises(
        ValueError, match=r"data\.path: '.*broken\.tfrecord' is not a readable TFRecord file"
    ):
        local_runner.run(config, str(tmp_path / "out"))


def test_input_check_warnings_reach_the_console(tmp_path, taxi_config, capfd):
    # The README says the package's warnings are shown: the input check's
    # too, not only the log file (here the run is then refused: no label).
    data = tmp_path / "data"
    data.mkdir()
    shutil.move(str(_copy_taxi_without(tmp_path, "big_tipper")), data / "taxi.csv")
    (data / "README.txt").write_text("Chicago taxi trips.\n")
    with pytest.raises(ValueError, match=r"label column 'big_tipper' is not in"):
        local_runner.run(_user_csv_config(taxi_config, data), str(tmp_path / "out"))
    console = capfd.readouterr().err
    assert (
        f"WARNING: data.path: reading the 1 .csv file(s) in {str(data)!r} and ignoring README.txt"
        in console
    )


class _StudentCheckError(ValueError):
    pass


def _refuse(_):
    raise _StudentCheckError("module_file: student_fn of 'student.py' returns probabilities")


def test_a_component_error_raised_through_beam_is_described_as_the_component_raised_it():
    import apache_beam as beam

    with pytest.raises(_StudentCheckError) as raised:
        with beam.Pipeline() as p:
            _ = p | beam.Create([1]) | "Run[Distiller]" >> beam.Map(_refuse)
    assert "[while running 'Run[Distiller]']" in str(raised.value)
    assert local_runner._describe(raised.value) == (
        "_StudentCheckError: module_file: student_fn of 'student.py' returns probabilities"
    )


def test_a_remote_traceback_in_the_message_is_reduced_to_its_last_line():
    # As portable runners re-raise a worker's failure: its traceback inside the message.
    error = RuntimeError(
        "Pipeline job failed: Traceback (most recent call last):\n"
        '  File "/site-packages/apache_beam/runners/worker/sdk_worker.py", line 1, in x\n'
        "ValueError: module_file: bad student [while running 'Run[Distiller]']\n"
    )
    assert local_runner._describe(error) == (
        "RuntimeError: Pipeline job failed: ValueError: module_file: bad student"
    )


def test_beam_stages_names_the_runner_the_beam_args_choose():
    assert local_runner.beam_stages([]).startswith("Beam's in-process runners (")
    assert "no Prism download" in local_runner.beam_stages(["--direct_num_workers=2"])
    assert local_runner.beam_stages(["--runner=PrismRunner", "--prism_location=/p"]) == (
        "--runner=PrismRunner from beam_args"
    )
    flink = ["--runner", "PortableRunner", "--job_endpoint=js:8099", "--environment_type=EXTERNAL"]
    assert local_runner.beam_stages(flink) == (
        "--runner=PortableRunner from beam_args (--job_endpoint=js:8099, --environment_type=EXTERNAL)"
    )
