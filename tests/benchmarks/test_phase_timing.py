"""`benchmarks.phase_timing`: the run_fn's training dataset, recorded and drawn alone."""

from __future__ import annotations

import collections

import pytest
import tensorflow as tf
from tfx.components.trainer import fn_args_utils

from benchmarks import phase_timing


@pytest.fixture
def fresh_timers(monkeypatch):
    phases = {
        "trainer": collections.defaultdict(float),
        "transform": collections.defaultdict(float),
    }
    monkeypatch.setattr(phase_timing, "PHASES", phases)
    monkeypatch.setattr(phase_timing, "TRAIN_DATASETS", [])
    return phases


def _fn_args(records: int, train_steps: int, built: list | None = None, later: int = 0):
    """`records` records in each dataset the factory builds (`later` in those built after the
    first two, when given); `built` collects (pattern, options, dataset) of each build."""

    def factory(file_pattern, options, schema=None):
        del schema
        offset = 0 if file_pattern == ["train-*"] else 1000
        count = later if later and built is not None and len(built) >= 2 else records
        # A cache, as `ingestion.cache` keeps one: filled by whoever iterates this dataset.
        dataset = tf.data.Dataset.range(offset, offset + count).batch(2).cache()
        if built is not None:
            built.append((list(file_pattern), options, dataset))
        return dataset

    accessor = fn_args_utils.DataAccessor(
        tf_dataset_factory=factory, record_batch_factory=None, data_view_decode_fn=None
    )
    return fn_args_utils.FnArgs(
        train_files=["train-*"],
        eval_files=["eval-*"],
        train_steps=train_steps,
        data_accessor=accessor,
    )


def _run_fn(fn_args):
    train = fn_args.data_accessor.tf_dataset_factory(fn_args.train_files, None, None)
    evaluation = fn_args.data_accessor.tf_dataset_factory(fn_args.eval_files, None, None)
    return next(iter(train)), next(iter(evaluation))


def test_the_training_dataset_is_recorded_and_drawn_for_its_steps(fresh_timers):
    first_train, first_eval = phase_timing._timed_run_fn(_run_fn)(_fn_args(20, 7))

    # The run_fn got the factory's datasets unchanged.
    assert first_train.numpy().tolist() == [0, 1]
    assert first_eval.numpy().tolist() == [1000, 1001]
    ((dataset, steps, _),) = phase_timing.TRAIN_DATASETS
    assert steps == 7
    assert next(iter(dataset)).numpy().tolist() == [0, 1]
    assert fresh_timers["trainer"]["input_setup"] > 0
    seconds = phase_timing.input_alone()
    assert isinstance(seconds, float) and seconds >= 0


@pytest.mark.usefixtures("fresh_timers")
def test_a_training_dataset_shorter_than_its_steps_is_refused():
    phase_timing._timed_run_fn(_run_fn)(_fn_args(6, 7))
    with pytest.raises(RuntimeError, match="ended after 3 of 7 batches"):
        phase_timing.input_alone()


@pytest.mark.usefixtures("fresh_timers")
def test_no_run_fn_no_input_figure():
    assert phase_timing.input_alone() is None


@pytest.mark.usefixtures("fresh_timers")
def test_the_input_is_drawn_from_a_fresh_dataset_of_the_same_arguments():
    built = []
    # Training's dataset holds 3 batches, too few for 7 steps; a dataset built later holds 10:
    # the figure is drawn only if it comes from a new build.
    phase_timing._timed_run_fn(_run_fn)(_fn_args(6, 7, built, later=20))
    assert [(pattern, options) for pattern, options, _ in built] == [
        (["train-*"], None),
        (["eval-*"], None),
    ]
    trained = built[0][2]

    seconds = phase_timing.input_alone()

    # The factory built a third dataset, of the training arguments, and the 7 batches came
    # from it, not from the one training iterated (whose cache the figure would replay).
    assert isinstance(seconds, float)
    assert len(built) == 3
    pattern, options, drawn = built[2]
    assert (pattern, options) == (["train-*"], None)
    assert drawn is not trained
