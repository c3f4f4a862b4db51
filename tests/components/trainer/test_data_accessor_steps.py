"""The named steps of `data_accessor.make_tf_dataset_factory`, alone.

`test_data_accessor` compares whole factories with stock TFX; these tests pin
what each step decides from the caller's `TensorFlowDatasetOptions`.
"""

from __future__ import annotations

import dataclasses

import pytest
import tensorflow as tf
from tfx_bsl.public.tfxio import TensorFlowDatasetOptions

from components.config import IngestionConfig, ServiceConfig
from components.data import layout, stored_input
from components.trainer import data_accessor

# A dispatcher address only: no step under test here connects to it.
SERVED = IngestionConfig(service=ServiceConfig(dispatcher="localhost:1"))
# Examples recorded for the one file of `STORED`.
RECORDS = 5
STORED = stored_input.StoredInput(
    files=("f",),
    feature_spec={"x": tf.io.FixedLenFeature([1], tf.float32)},
    packing=None,
    compression="none",
    shard_stats={"f": layout.ShardStats(records=RECORDS, raw_bytes=0, file_bytes=0)},
)


def _options(**fields) -> TensorFlowDatasetOptions:
    return TensorFlowDatasetOptions(**{"batch_size": 2, **fields})


def test_split_key_is_the_label_or_the_first_feature():
    produced = frozenset({"b", "a", "label"})
    assert data_accessor._split_key("label", produced) == "label"
    assert data_accessor._split_key(None, produced) == "a"
    with pytest.raises(ValueError, match=r"label_key 'nope' is not in the schema \(\['a', 'b'"):
        data_accessor._split_key("nope", produced)


def test_on_service_only_for_training_reads_without_a_pass_count():
    repeat = _options(num_epochs=None, shuffle=True)
    assert not data_accessor._on_service(IngestionConfig(), repeat)
    assert data_accessor._on_service(SERVED, repeat)
    # One unshuffled pass is the reader's evaluation mode: read here.
    assert not data_accessor._on_service(SERVED, _options(num_epochs=1, shuffle=False))
    with pytest.raises(ValueError, match="cannot give exactly num_epochs=2 passes"):
        data_accessor._on_service(SERVED, _options(num_epochs=2, shuffle=True))


def test_reader_config_fills_what_the_section_leaves_to_the_caller():
    options = _options(
        batch_size=16,
        shuffle=True,
        shuffle_buffer_size=50,
        reader_num_threads=3,
        parser_num_threads=-1,
        prefetch_buffer_size=4,
    )
    config = data_accessor._reader_config(IngestionConfig(num_parallel_reads=7), options, False)
    assert (config.batch_size, config.eval_batch_size, config.shuffle_buffer) == (16, 16, 50)
    # The section's own tuning wins; a negative (autotune) thread count is 0.
    assert (config.num_parallel_reads, config.num_parallel_calls, config.prefetch) == (7, 0, 4)
    unshuffled = data_accessor._reader_config(IngestionConfig(), _options(shuffle=False), False)
    assert unshuffled.shuffle_buffer == 0


@pytest.mark.parametrize(
    "fields,on_service,deterministic",
    [
        # Shuffled without a seed: no order to reproduce.
        ({"shuffle": True, "num_epochs": None}, False, False),
        ({"shuffle": True, "num_epochs": None, "shuffle_seed": 1}, False, True),
        ({"shuffle": False, "num_epochs": None, "sloppy_ordering": True}, False, False),
        # A finite number of passes must be exact.
        ({"shuffle": True, "num_epochs": 2, "sloppy_ordering": True}, False, True),
        ({"shuffle": False, "num_epochs": None}, True, False),
    ],
)
def test_reader_config_reads_deterministically_as_stock_does(fields, on_service, deterministic):
    config = data_accessor._reader_config(IngestionConfig(), _options(**fields), on_service)
    assert config.deterministic is deterministic


def _batches(n: int) -> tf.data.Dataset:
    """`n` examples in batches of 2, as the reader's `(features, label)`."""
    return tf.data.Dataset.range(n).map(lambda i: ({"x": i}, -i)).batch(2)


def test_as_stock_gives_exact_passes_batched_across_their_boundaries():
    reader = _batches(RECORDS).repeat()
    ds = data_accessor._as_stock(reader, STORED, _options(num_epochs=2, label_key="y"), "y")
    sizes = [int(label.shape[0]) for _, label in ds]
    assert sizes == [2] * RECORDS


def test_as_stock_drops_a_final_batch_and_repeats_infinitely():
    one_pass = _options(num_epochs=1, shuffle=False, drop_final_batch=True, label_key="y")
    ds = data_accessor._as_stock(_batches(RECORDS), STORED, one_pass, "y")
    assert [int(label.shape[0]) for _, label in ds] == [2, 2]
    forever = data_accessor._as_stock(_batches(RECORDS), STORED, _options(label_key="y"), "y")
    assert forever.cardinality() == tf.data.INFINITE_CARDINALITY


def test_as_stock_puts_the_label_back_without_a_label_key():
    one_pass = _options(num_epochs=1, shuffle=False)
    ds = data_accessor._as_stock(_batches(RECORDS), STORED, one_pass, "y")
    first = next(iter(ds))
    assert set(first) == {"x", "y"}
    assert first["y"].numpy().tolist() == [0, -1]


def test_read_uses_a_file_cache_only_for_repeated_reads(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(
        data_accessor.ingestion, "make_dataset", lambda *a, **kw: calls.append((a, kw))
    )
    config = dataclasses.replace(IngestionConfig(), cache="file")
    data_accessor._read(STORED, _options(), config, "x", str(tmp_path), False)
    data_accessor._read(
        STORED, _options(num_epochs=1, shuffle=False), config, "x", str(tmp_path), False
    )
    (repeated_args, repeated), (single_args, single) = calls
    assert repeated["training"] and repeated["cache_path"].startswith(str(tmp_path))
    assert repeated_args[3].cache == "file" and repeated["service_job"] == ""
    assert not single["training"] and single["cache_path"] == ""
    assert single_args[3].cache == "none"
