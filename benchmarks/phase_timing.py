"""Where a Trainer / Transform execution spends its time: timers around what both sides call.

Measurement only, installed in a benchmark's own process (`install`) before
the pipeline runs: every timer wraps a function both the stock and the
tfxkit executors call (or, for tfxkit-only steps, the tfxkit function) and
adds the seconds it took to a phase, without changing arguments, results or
order. Nested calls of one phase count once (the outermost).

Trainer phases (seconds inside the executor's `Do`):
  setup: `Do` entered -> the user's `run_fn` called (FnArgs, the strategy,
    the data accessor, installing and importing the module file);
  strategy: of which, tfxkit's strategy resolution (`task.start`; 0 stock);
  input_setup: `data_accessor.tf_dataset_factory` calls (building the datasets);
  first_step: `Model.fit` entered -> first training batch done (tracing the
    train step and reading the first batch);
  steps: the rest of `fit` (training and validation steps);
  export: `tf.saved_model.save` / `Model.save`;
  rest: the remainder of `Do` (model building in the run_fn, checks after it).

After the pipeline, outside every execution's time, `input_alone` draws the
run's own training dataset (the one its `run_fn` built on
`fn_args.train_files`) for `fn_args.train_steps` batches, in-graph, with
nothing else running: what the input pipeline alone costs for the batches
that `first_step` + `steps` consumed with the model (its start-up included),
i.e. about the most a faster input pipeline could save there.

Transform phases (seconds inside the executor's `Do`):
  beam: TFX's `TransformProcessor.Transform` (analysis, transform and
    writing, one Beam pipeline);
  layout_record: tfxkit's layout record (`writer.write_layout_record`; 0 stock);
  rest: the remainder of `Do` (installing the module file, checks,
    settings, clean-up).
"""

from __future__ import annotations

import collections
import functools
import sys
import time

PHASES: dict[str, collections.defaultdict] = {
    "trainer": collections.defaultdict(float),
    "transform": collections.defaultdict(float),
}
_DEPTH: collections.Counter = collections.Counter()
# (dataset, steps, build): the training datasets run_fns built, in order, each with
# a function that builds a fresh one of the same arguments.
TRAIN_DATASETS: list = []


def _timed(component: str, phase: str, fn):
    """`fn`, adding its duration to `PHASES[component][phase]` (outermost call only)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        key = (component, phase)
        _DEPTH[key] += 1
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _DEPTH[key] -= 1
            if not _DEPTH[key]:
                PHASES[component][phase] += time.perf_counter() - start

    return wrapper


def _patch(owner, name: str, component: str, phase: str) -> None:
    setattr(owner, name, _timed(component, phase, getattr(owner, name)))


def _first_step_callback(keras, start: float):
    class FirstStep(keras.callbacks.Callback):
        """Notes when the first training batch is done (one Python call per batch)."""

        def on_train_batch_end(self, batch, logs=None):
            if "first_step" not in PHASES["trainer"]:
                PHASES["trainer"]["first_step"] = time.perf_counter() - start

    return FirstStep()


def _patch_fit() -> None:
    """Times `Model.fit` and `Model.save` of tf_keras and of Keras 3 (whichever the run_fn uses).

    A stock pipeline file that imports tfx before anything sets
    `TF_USE_LEGACY_KERAS` gets Keras 3 as `tf.keras`; tfxkit's Trainer gives
    its run_fn tf_keras (`components.compat.legacy_keras`).
    """
    for name in ("tf_keras", "keras"):
        keras = sys.modules.get(name)
        if keras is None or getattr(keras.Model.fit, "_phase_timed", False):
            continue
        fit = keras.Model.fit

        def timed_fit(self, *args, _fit=fit, _keras=keras, **kwargs):
            start = time.perf_counter()
            kwargs["callbacks"] = [
                *(kwargs.get("callbacks") or []),
                _first_step_callback(_keras, start),
            ]
            try:
                return _fit(self, *args, **kwargs)
            finally:
                PHASES["trainer"]["fit"] += time.perf_counter() - start

        timed_fit._phase_timed = True
        keras.Model.fit = timed_fit
        _patch(keras.Model, "save", "trainer", "export")


def _timed_run_fn(run_fn):
    @functools.wraps(run_fn)
    def wrapper(fn_args):
        PHASES["trainer"]["setup"] = time.perf_counter() - PHASES["trainer"]["_do_start"]
        accessor = fn_args.data_accessor
        factory = _timed("trainer", "input_setup", accessor.tf_dataset_factory)

        def recording_factory(file_pattern, *args, **kwargs):
            dataset = factory(file_pattern, *args, **kwargs)
            if list(file_pattern) == list(fn_args.train_files) and fn_args.train_steps:

                def build():
                    return accessor.tf_dataset_factory(file_pattern, *args, **kwargs)

                TRAIN_DATASETS.append((dataset, int(fn_args.train_steps), build))
            return dataset

        fn_args.data_accessor = accessor._replace(tf_dataset_factory=recording_factory)
        return run_fn(fn_args)

    return wrapper


def _trainer_do(do):
    @functools.wraps(do)
    def wrapper(self, *args, **kwargs):
        if _DEPTH["trainer", "do"] == 1:  # the outermost Do (its timer counts it already)
            PHASES["trainer"]["_do_start"] = time.perf_counter()
            _patch_fit()
        return do(self, *args, **kwargs)

    return _timed("trainer", "do", wrapper)


def install() -> None:
    """Installs every timer (call after the pipeline module is loaded, before it runs)."""
    import tensorflow as tf
    from tfx.components.trainer import executor as tfx_trainer
    from tfx.components.transform import executor as tfx_transform
    from tfx.components.util import udf_utils

    get_fn = udf_utils.get_fn

    def timed_get_fn(exec_properties, fn_name):
        fn = get_fn(exec_properties, fn_name)
        return _timed_run_fn(fn) if fn_name == "run_fn" else fn

    udf_utils.get_fn = timed_get_fn
    tfx_trainer.GenericExecutor.Do = _trainer_do(tfx_trainer.GenericExecutor.Do)
    tf.saved_model.save = _timed("trainer", "export", tf.saved_model.save)
    _patch(tfx_transform.Executor, "Do", "transform", "do")
    _patch(tfx_transform.TransformProcessor, "Transform", "transform", "beam")
    if "components.trainer.executor" in sys.modules:
        from components.data import writer
        from components.trainer import executor
        from components.training import task
        from components.transform import executor as transform_executor

        executor.Executor.Do = _trainer_do(executor.Executor.Do)
        _patch(task, "start", "trainer", "strategy")
        _patch(transform_executor.Executor, "Do", "transform", "do")
        _patch(writer, "write_layout_record", "transform", "layout_record")


def input_alone() -> float | None:
    """Seconds to draw `train_steps` batches from a fresh copy of the first recorded training
    dataset (built again by its factory, arguments unchanged), in-graph.

    Fresh: the dataset training iterated may hold what it cached in memory
    (`ingestion.cache: memory`, or `auto` choosing it), which one side would then replay
    while the other parses again. A file cache (`ingestion.cache: file`) is keyed by the
    files and outlives the dataset, so the rebuilt one reads it: run such a side with
    `cache: memory` or `none` for an input figure.
    """
    if not TRAIN_DATASETS:
        return None
    import tensorflow as tf

    _, steps, build = TRAIN_DATASETS[0]
    dataset = build()
    start = time.perf_counter()
    count = dataset.take(steps).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
    seconds = time.perf_counter() - start
    if int(count) != steps:
        raise RuntimeError(f"input_alone: the dataset ended after {int(count)} of {steps} batches")
    return round(seconds, 2)


def summary() -> dict[str, dict[str, float]]:
    """`trainer_phases_s` / `transform_phases_s` of the run, each phase rounded, with `rest`."""
    trainer = dict(PHASES["trainer"])
    trainer.pop("_do_start", None)
    fit = trainer.pop("fit", 0.0)
    first = min(trainer.pop("first_step", 0.0), fit)
    trainer_out = {
        "do": trainer.get("do", 0.0),
        "setup": trainer.get("setup", 0.0),
        "strategy": trainer.get("strategy", 0.0),
        "input_setup": trainer.get("input_setup", 0.0),
        "first_step": first,
        "steps": fit - first,
        "export": trainer.get("export", 0.0),
    }
    trainer_out["rest"] = trainer_out["do"] - sum(
        trainer_out[k] for k in ("setup", "input_setup", "first_step", "steps", "export")
    )
    transform = dict(PHASES["transform"])
    transform_out = {
        "do": transform.get("do", 0.0),
        "beam": transform.get("beam", 0.0),
        "layout_record": transform.get("layout_record", 0.0),
    }
    transform_out["rest"] = (
        transform_out["do"] - transform_out["beam"] - transform_out["layout_record"]
    )
    return {
        "trainer_phases_s": {k: round(v, 2) for k, v in trainer_out.items()},
        "transform_phases_s": {k: round(v, 2) for k, v in transform_out.items()},
    }
