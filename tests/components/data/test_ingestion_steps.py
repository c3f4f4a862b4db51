"""Each named step of `ingestion.make_dataset`, alone.

`test_ingestion` covers the recipe end to end (contents, sharding, caching,
shuffling, every refusal); these tests pin what each step decides or builds,
on the same small transformed files.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

from components.config import ServiceConfig
from components.data import ingestion, memory
from components.data import layout as transform_layout
from tests.components.data.test_ingestion import BATCH, CONFIG, LABEL, SPEC, write

# Small enough to read whole in every test, large enough for several batches.
N = 100
# A dispatcher address only: no step under test here connects to it.
SERVED = dataclasses.replace(
    CONFIG, deterministic=False, service=ServiceConfig(dispatcher="localhost:1", remote="parse")
)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return write(tmp_path_factory.mktemp("packed"), pack=True, compression="none", n=N)


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    return write(tmp_path_factory.mktemp("unpacked"), pack=False, compression="none", n=N)


def _plan(written, config=CONFIG, **kwargs) -> ingestion._ReadPlan:
    """The plan `make_dataset` would build for `written` (overrides in `kwargs`)."""
    arguments = dict(
        batch_size=BATCH,
        compression=written.layout.compression,
        training=True,
        packing=written.layout.packing,
        shard_stats=written.layout.shard_stats(),
        input_context=None,
        cache_path="",
        seed=3,
        service_job="",
        remote_map=None,
    )
    arguments.update(kwargs)
    return ingestion._plan_read(
        written.files, written.layout.feature_spec(), LABEL, config, **arguments
    )


def _uids(ds: tf.data.Dataset) -> list[int]:
    return [int(u) for features, _ in ds for u in features["uid"].numpy().reshape(-1)]


# --------------------------------------------------------------------------- #
# Planning: arguments checked and resolved before any op is built.
# --------------------------------------------------------------------------- #


def test_check_spec_returns_the_compression_type_and_a_copy_of_the_spec(packed):
    spec = packed.layout.feature_spec()
    ctype, checked = ingestion._check_spec(packed.files, spec, LABEL, "gzip", packed.layout.packing)
    assert ctype == "GZIP"
    assert checked == spec and checked is not spec


def test_check_spec_refuses_a_packing_the_spec_does_not_hold(packed):
    packing = packed.layout.packing
    with pytest.raises(ingestion.IngestionError, match="must hold the packed feature"):
        ingestion._check_spec(packed.files, SPEC, LABEL, "none", packing)
    both = dict(packed.layout.feature_spec(), uid=SPEC["uid"])
    with pytest.raises(ingestion.IngestionError, match=r"features \['uid'\] are both packed"):
        ingestion._check_spec(packed.files, both, LABEL, "none", packing)


def test_check_spec_checks_files_before_compression_before_label(packed):
    # The order `make_dataset`'s refusals have always had.
    with pytest.raises(ingestion.IngestionError, match="no input files"):
        ingestion._check_spec([], SPEC, "nope", "zip", None)
    with pytest.raises(ingestion.IngestionError, match="transform.compression"):
        ingestion._check_spec(packed.files, SPEC, "nope", "zip", None)
    with pytest.raises(ingestion.IngestionError, match="label 'nope'"):
        ingestion._check_spec(packed.files, SPEC, "nope", "none", None)


def test_check_options_says_what_runs_on_the_service():
    assert ingestion._check_options(CONFIG, "", "", None) == ""
    # Without a job the dataset stays here, whatever the config.
    assert ingestion._check_options(SERVED, "", "", None) == ""
    assert ingestion._check_options(SERVED, "", "job", None) == "parse"
    augment = dataclasses.replace(
        SERVED, service=dataclasses.replace(SERVED.service, remote="augment")
    )
    assert ingestion._check_options(augment, "", "job", lambda f, y: (f, y)) == "augment"


def test_check_options_refuses_a_file_cache_without_path_and_a_stray_remote_map():
    with pytest.raises(ingestion.IngestionError, match="'file' needs a cache path"):
        ingestion._check_options(dataclasses.replace(CONFIG, cache="file"), "", "", None)
    with pytest.raises(ingestion.IngestionError, match="remote_map runs on the service only"):
        ingestion._check_options(SERVED, "", "job", lambda f, y: (f, y))


def test_pipeline_share():
    assert ingestion._pipeline_share(None, 64) == (64, 1, 0)
    context = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4
    )
    assert ingestion._pipeline_share(context, 64) == (16, 2, 1)


def test_training_cache_follows_the_config_and_never_caches_augmented_views(unpacked, monkeypatch):
    stats = unpacked.layout.shard_stats()
    estimate = ingestion.parsed_bytes(SPEC, stats, unpacked.files)
    # The whole estimate is above the share `auto` may take; a third of it is not.
    monkeypatch.setattr(memory, "available_bytes", lambda: 2 * estimate)
    config = dataclasses.replace(CONFIG, cache="auto")
    assert ingestion._training_cache(config, SPEC, stats, unpacked.files, 1, "") == "none"
    assert ingestion._training_cache(config, SPEC, stats, unpacked.files, 3, "") == "memory"
    assert ingestion._training_cache(config, SPEC, None, unpacked.files, 1, "") == "none"
    memory_cache = dataclasses.replace(CONFIG, cache="memory")
    assert ingestion._training_cache(memory_cache, SPEC, None, unpacked.files, 1, "augment") == (
        "none"
    )


def test_plan_read_sorts_files_and_keeps_evaluation_plain(packed):
    plan = _plan(
        dataclasses.replace(packed, files=packed.files[::-1]),
        dataclasses.replace(CONFIG, cache="memory"),
        training=False,
    )
    assert plan.files == tuple(sorted(packed.files))
    assert (plan.shuffle, plan.cache, plan.policy) == (False, "none", "none")
    assert plan.fixed and plan.read_batch == ingestion.READ_BATCH


def test_a_shuffling_plan_reads_blocks_the_buffer_holds_eight_of(packed):
    config = dataclasses.replace(CONFIG, shuffle_buffer=800)
    assert _plan(packed, config).read_batch == 100
    # Never below a batch, never above READ_BATCH.
    assert _plan(packed, config, batch_size=256).read_batch == 256
    big = dataclasses.replace(CONFIG, shuffle_buffer=10**6)
    assert _plan(packed, big).read_batch == ingestion.READ_BATCH


def _sorted_files(directory, files: int, per_file: int) -> list[str]:
    """`files` uncompressed files, file k holding ids [k n, (k + 1) n) of label k."""
    paths = []
    for k in range(files):
        path = os.path.join(directory, f"sorted-{k:05d}-of-{files:05d}.tfrecord")
        with tf.io.TFRecordWriter(path) as out:
            for i in range(k * per_file, (k + 1) * per_file):
                example = tf.train.Example()
                example.features.feature["id"].int64_list.value.append(i)
                example.features.feature["label"].int64_list.value.append(k)
                out.write(example.SerializeToString())
        paths.append(path)
    return paths


def test_a_shuffled_window_mixes_eight_files_stretches(tmp_path):
    """Label-sorted files (one class each): the first shuffle window's examples come from
    most of the 8 files, not from the 2 or 3 the reader has open on a 2-core host
    without `SHUFFLE_BLOCKS`."""
    files = _sorted_files(str(tmp_path), 8, 1000)
    spec = {
        "id": tf.io.FixedLenFeature([1], tf.int64),
        "label": tf.io.FixedLenFeature([1], tf.int64),
    }
    config = dataclasses.replace(CONFIG, shuffle_buffer=800, deterministic=False)
    ds = ingestion.make_dataset(
        files, spec, "label", config, batch_size=32, compression="none", training=True, seed=5
    )
    labels = []
    for _, label in ds:
        labels.extend(label.numpy().reshape(-1).tolist())
        if len(labels) >= 800:
            break
    assert len(set(labels[:800])) >= 6, sorted(set(labels[:800]))


def test_plan_read_shards_by_pipeline_but_not_on_the_service(packed):
    context = tf.distribute.InputContext(3, 1, 3)
    local = _plan(packed, input_context=context, batch_size=3 * BATCH)
    assert (local.policy, local.data_shards, local.per_replica_batch) == ("data", 3, BATCH)
    served = _plan(packed, SERVED, input_context=context, batch_size=3 * BATCH, service_job="job")
    # The job hands out each file once per epoch: nothing to shard here.
    assert (served.remote, served.policy, served.data_shards) == ("parse", "none", 1)
    assert served.unpacked_remotely


def test_batches_from_the_workers_are_buffered_by_bytes_unless_prefetch_is_set():
    spec = (
        {
            "image": tf.TensorSpec([None, 784], tf.float32),
            "uid": tf.TensorSpec([None, 1], tf.float32),
        },
        tf.TensorSpec([None], tf.int64),
    )
    plan = ingestion._ReadPlan(**{**_PLAN_DEFAULTS, "per_replica_batch": 512})
    # 785 floats and an int64 label: 3,148 bytes an example, 1,611,776 a batch of 512.
    assert ingestion._service_prefetch(spec, plan) == 64 * 2**20 // 1_611_776 == 41
    assert ingestion._service_prefetch(spec, dataclasses.replace(plan, per_replica_batch=4)) == 64
    huge = dataclasses.replace(plan, per_replica_batch=10**6)
    assert ingestion._service_prefetch(spec, huge) == 2
    fixed = dataclasses.replace(plan, config=dataclasses.replace(SERVED, prefetch=3))
    assert ingestion._service_prefetch(spec, fixed) == 3


def test_the_workers_batch_unless_this_process_caches(packed):
    streamed = _plan(packed, dataclasses.replace(SERVED, cache="none"), service_job="job")
    assert streamed.batched_remotely
    # A cache here replays one epoch: filled before the shuffle, so shuffling and
    # batching stay here.
    cached = _plan(packed, dataclasses.replace(SERVED, cache="memory"), service_job="job")
    assert cached.unpacked_remotely and not cached.batched_remotely
    read = dataclasses.replace(SERVED, service=dataclasses.replace(SERVED.service, remote="read"))
    assert not _plan(
        packed, dataclasses.replace(read, cache="none"), service_job="job"
    ).batched_remotely
    # Under parallel_epochs every worker reads every file with one seed: batched there,
    # the trainer would get each batch once per worker.
    parallel = dataclasses.replace(
        SERVED,
        cache="none",
        service=dataclasses.replace(SERVED.service, processing_mode="parallel_epochs"),
    )
    every_file = _plan(packed, parallel, service_job="job")
    assert every_file.unpacked_remotely and not every_file.batched_remotely


# --------------------------------------------------------------------------- #
# Checking the files and reading them.
# --------------------------------------------------------------------------- #


def test_check_files_counts_recorded_records(packed):
    checks = ingestion._check_files(_plan(packed))
    stats = packed.layout.shard_stats()
    assert checks.accounting and not checks.count_bytes
    assert checks.records == tuple(stats[f].records for f in sorted(packed.files))
    assert sum(checks.records) == N


def test_check_files_counts_bytes_without_stats_and_nothing_for_gzip(packed, tmp_path):
    checks = ingestion._check_files(_plan(packed, shard_stats=None))
    assert checks.accounting and checks.count_bytes
    assert checks.raw_bytes == tuple(os.path.getsize(f) for f in sorted(packed.files))
    assert set(checks.records) == {-1}
    gzipped = write(tmp_path, pack=True, compression="gzip", n=N)
    checks = ingestion._check_files(_plan(gzipped, shard_stats=None))
    # zlib checks a gzip file's integrity itself (naming no file).
    assert not checks.accounting and set(checks.raw_bytes) == {-1}


def test_check_files_checks_every_first_record(unpacked):
    spec = dict(unpacked.layout.feature_spec(), vec=tf.io.FixedLenFeature([2], tf.float32))
    plan = dataclasses.replace(_plan(unpacked), spec=spec)
    with pytest.raises(ingestion.IngestionError, match="'vec' in '.*' has 3 values"):
        ingestion._check_files(plan)


def test_check_features_accepts_defaults_and_names_kind_mismatches():
    example = tf.train.Example()
    example.features.feature["x"].int64_list.value.append(1)
    features = example.features.feature
    spec = {
        "x": tf.io.FixedLenFeature([1], tf.int64),
        "absent": tf.io.FixedLenFeature([1], tf.int64, default_value=[0]),
        "sparse": tf.io.VarLenFeature(tf.string),
    }
    ingestion._check_features("f.tfrecord", features, spec, None)
    with pytest.raises(ingestion.IngestionError, match="'x' in 'f.tfrecord' holds a int64_list"):
        ingestion._check_features(
            "f.tfrecord", features, {"x": tf.io.FixedLenFeature([1], tf.float32)}, None
        )


@pytest.mark.parametrize("pipelines", [1, 2, 3])
def test_read_files_gives_each_pipeline_its_records(packed, pipelines):
    records = []
    for pipeline in range(pipelines):
        context = tf.distribute.InputContext(pipelines, pipeline, pipelines)
        plan = _plan(packed, training=False, input_context=context, batch_size=pipelines * BATCH)
        ds = ingestion._read_files(plan, ingestion._check_files(plan))
        for path, batch in ds:
            assert path.numpy().decode() in packed.files
            records.extend(batch.numpy().tolist())
    assert len(records) == len(set(records)) == N


def test_read_file_streams_one_file_in_read_batches(packed):
    plan = _plan(packed, training=False)
    checks = ingestion._check_files(plan)
    path = plan.files[0]
    ds = ingestion._read_file(
        tf.constant(path),
        tf.constant(checks.raw_bytes[0], tf.int64),
        tf.constant(checks.records[0], tf.int64),
        plan=plan,
        checks=checks,
    )
    batches = [batch.numpy() for _, batch in ds]
    assert sum(len(b) for b in batches) == checks.records[0]
    assert all(len(b) <= plan.read_batch for b in batches)


def test_assert_present_names_a_missing_file(tmp_path):
    there = tmp_path / "there.tfrecord"
    there.write_bytes(b"")
    assert ingestion._assert_present(tf.constant(str(there))).numpy() == str(there).encode()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"(?s)gone\.tfrecord.*is gone"):
        ingestion._assert_present(tf.constant(str(tmp_path / "gone.tfrecord")))


# The end-of-file sentinel `_read_file` appends to every file's batches.
END = ()


def _step(plan, checks, state, batch, *, records=-1, raw_bytes=-1):
    return ingestion._count_and_share(
        state,
        tf.constant(batch, tf.string),
        path=tf.constant("f.tfrecord"),
        want_bytes=tf.constant(raw_bytes, tf.int64),
        want_records=tf.constant(records, tf.int64),
        plan=plan,
        checks=checks,
    )


def test_count_and_share_keeps_every_nth_record_across_batches(packed):
    plan = dataclasses.replace(_plan(packed), policy="data", num_pipelines=3, pipeline_id=1)
    checks = ingestion._ReadChecks(
        accounting=False, count_bytes=False, raw_bytes=(-1,), records=(-1,)
    )
    zero = tf.constant(0, tf.int64)
    state, (_, first) = _step(plan, checks, (zero, zero), [b"r0", b"r1", b"r2", b"r3"])
    state, (_, second) = _step(plan, checks, state, [b"r4", b"r5"])
    # Record j of the file goes to pipeline j % 3, across batch boundaries.
    assert first.numpy().tolist() == [b"r1"] and second.numpy().tolist() == [b"r4"]
    assert int(state[0]) == 6


def test_count_and_share_fails_an_incomplete_file_at_its_end(packed):
    plan = _plan(packed)
    zero = tf.constant(0, tf.int64)
    by_records = ingestion._ReadChecks(
        accounting=True, count_bytes=False, raw_bytes=(-1,), records=(3,)
    )
    state, _ = _step(plan, by_records, (zero, zero), [b"a", b"b", b"c"], records=3)
    _step(plan, by_records, state, END, records=3)
    short, _ = _step(plan, by_records, (zero, zero), [b"a", b"b"], records=3)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="(?s)f.tfrecord.*is corrupt, truncated"
    ):
        _step(plan, by_records, short, END, records=3)
    # By bytes: each record's data plus its TFRecord framing.
    by_bytes = ingestion._ReadChecks(
        accounting=True, count_bytes=True, raw_bytes=(-1,), records=(-1,)
    )
    complete = 2 + 2 * transform_layout.RECORD_OVERHEAD_BYTES
    state, _ = _step(plan, by_bytes, (zero, zero), [b"a", b"b"], raw_bytes=complete)
    _step(plan, by_bytes, state, END, raw_bytes=complete)
    with pytest.raises(tf.errors.InvalidArgumentError, match="is corrupt, truncated"):
        _step(plan, by_bytes, state, END, raw_bytes=complete + 1)


# --------------------------------------------------------------------------- #
# Parsing, caching, batching and options.
# --------------------------------------------------------------------------- #


def _parsed(plan) -> tf.data.Dataset:
    return ingestion._parse_batches(ingestion._read_files(plan, ingestion._check_files(plan)), plan)


def test_parse_batches_keeps_the_packed_feature_until_batching(packed):
    plan = _plan(packed, training=False)
    parsed = list(_parsed(plan))
    assert all(set(p) == {transform_layout.PACKED_FEATURE, "tag"} for p in parsed)
    features, label = ingestion._split_label(parsed[0], plan=plan)
    assert set(features) == {"uid", "vec", "cat", "tag"}
    assert label.dtype == tf.int64 and label.shape[0] == features["uid"].shape[0]


def test_parse_names_the_file_of_a_bad_record():
    # A tf.Example lacking features the spec requires.
    example = tf.train.Example()
    example.features.feature["uid"].float_list.value.append(1.0)
    serialized = tf.constant([example.SerializeToString()])
    with pytest.raises(tf.errors.InvalidArgumentError, match="Name: bad.tfrecord, Feature: "):
        ingestion._parse(tf.constant("bad.tfrecord"), serialized, spec=SPEC)


def test_parse_batches_refuses_augmenting_variable_length_features(unpacked):
    spec = dict(unpacked.layout.feature_spec(), tag=tf.io.VarLenFeature(tf.string))
    plan = dataclasses.replace(
        _plan(unpacked), spec=spec, remote="augment", remote_map=lambda f, y: (f, y)
    )
    with pytest.raises(ingestion.IngestionError, match="'augment' needs fixed-length features"):
        _parsed(plan)


# A served training plan, whole, for steps that read nothing but the plan.
_PLAN_DEFAULTS = dict(
    files=("f",),
    compression="none",
    ctype="",
    spec=SPEC,
    label_key=LABEL,
    packing=None,
    shard_stats=None,
    config=SERVED,
    training=True,
    per_replica_batch=BATCH,
    num_pipelines=1,
    pipeline_id=0,
    policy="none",
    remote="parse",
    service_job="job",
    remote_map=None,
    codebooks={},
    shuffle=False,
    cache="none",
    cache_path="",
    seed=None,
)


@pytest.mark.parametrize(
    "training,cache,repeated",
    [(True, "none", True), (True, "memory", False), (False, "none", False)],
)
def test_on_service_repeats_the_training_job_unless_cached(monkeypatch, training, cache, repeated):
    """`remote: read`: the workers' part ends before the batching, so the repeat is added
    here (with `parse` the workers' batching repeats, `test_service.py`)."""
    sent = []
    monkeypatch.setattr(
        ingestion.service, "distribute", lambda ds, config, job, what: sent.append(ds) or ds
    )
    plan = ingestion._ReadPlan(
        **{**_PLAN_DEFAULTS, "remote": "read", "training": training, "cache": cache}
    )
    ingestion._on_service(tf.data.Dataset.range(3), plan, "reading")
    infinite = sent[0].cardinality() == tf.data.INFINITE_CARDINALITY
    assert bool(infinite) == repeated


def test_cache_parsed_writes_one_file_cache_per_pipeline(packed, tmp_path):
    plan = dataclasses.replace(_plan(packed), cache="none")
    ds = tf.data.Dataset.range(3)
    assert ingestion._cache_parsed(ds, plan) is ds
    prefix = str(tmp_path / "cache")
    for pipelines in (1, 2):
        file_plan = dataclasses.replace(
            plan, cache="file", cache_path=prefix, num_pipelines=pipelines, pipeline_id=1
        )
        assert list(ingestion._cache_parsed(ds, file_plan).as_numpy_iterator()) == [0, 1, 2]
    assert tf.io.gfile.glob(prefix + ".index") and tf.io.gfile.glob(prefix + "_pipeline1.index")


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_batch_examples_gives_one_pass_or_full_repeated_batches(unpacked, sparse):
    plan = _plan(unpacked, dataclasses.replace(CONFIG, cache="none"), training=False)
    if sparse:
        spec = dict(plan.spec, tag=tf.io.VarLenFeature(tf.string))
        plan = dataclasses.replace(plan, spec=spec)
    one_pass = ingestion._batch_examples(_parsed(plan), plan)
    assert sorted(_uids(one_pass)) == list(range(N))
    assert [len(label) for _, label in one_pass][-1] == N % BATCH
    train_plan = dataclasses.replace(plan, training=True, shuffle=True)
    train = ingestion._batch_examples(_parsed(train_plan), train_plan)
    batches = [label.shape[0] for _, label in train.take(2 * N // BATCH)]
    assert set(batches) == {BATCH}


def test_with_options_turns_auto_sharding_off():
    config = dataclasses.replace(CONFIG, deterministic=False, prefetch=2)
    options = ingestion._with_options(tf.data.Dataset.range(3), config).options()
    assert options.deterministic is False
    assert options.experimental_distribute.auto_shard_policy == (
        tf.data.experimental.AutoShardPolicy.OFF
    )


def test_permute_reorders_every_feature_alike():
    batch = {"a": tf.range(64), "b": tf.range(64) * 10}
    out = ingestion._permute(batch, tf.constant([1, 2], tf.int64))
    assert sorted(out["a"].numpy().tolist()) == list(range(64))
    assert out["a"].numpy().tolist() != list(range(64))
    np.testing.assert_array_equal(out["b"].numpy(), out["a"].numpy() * 10)
