"""The training workflow shared by the teacher Trainer and the distiller (no TFX types).

`fit` trains a compiled Keras model under the configured strategy, with mixed precision,
gradient accumulation and a crash-recovery backup; `build_model`, `make_optimizer`,
`learning_rate` and `compile_classifier` set it up.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
import tf_keras as keras
from absl import logging

from components.config import ConfigError, ModelConfig, PipelineConfig
from components.data import codes, layout, service
from components.data.preprocessing import num_ids
from components.data.pseudo_labels import PseudoLabels
from components.training import backup, cluster, models, strategies
from components.training.inputs import DROP_UNLABELED, TrainingInputs, distributed_datasets


def build_model(
    config: PipelineConfig, tft_output: tft.TFTransformOutput, shape: ModelConfig, name: str
) -> keras.Model:
    """A classifier of the given shape over this run's transformed features."""
    cards = {f.name: num_ids(f, tft_output) for f in config.data.features if f.is_categorical}
    return models.build_classifier(
        config.data, shape, cards, name, recompute=config.train.gradient_checkpointing
    )


def learning_rate(
    config: PipelineConfig, total_steps: int
) -> float | keras.optimizers.schedules.LearningRateSchedule:
    """`train.learning_rate` under `train.lr_schedule` for a training of `total_steps` updates.

    The `cosine` schedule warms up linearly from 0 over `train.warmup_steps`
    and then decays to 0 at `total_steps`. The optimizer's step counter is
    restored with a `BackupAndRestore` backup, so a resumed run continues
    the schedule where it stopped.
    """
    train = config.train
    if train.lr_schedule == "constant":
        return train.learning_rate
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if train.warmup_steps else train.learning_rate,
        decay_steps=max(1, total_steps - train.warmup_steps),
        warmup_target=train.learning_rate if train.warmup_steps else None,
        warmup_steps=train.warmup_steps,
    )


def make_optimizer(config: PipelineConfig, total_steps: int) -> keras.optimizers.Optimizer:
    """Adam at `learning_rate(config, total_steps)`."""
    return keras.optimizers.Adam(learning_rate(config, total_steps))


def compile_classifier(
    model: keras.Model, config: PipelineConfig, total_steps: int | None = None
) -> None:
    """Compiles a classifier: Adam under the configured schedule, sparse cross-entropy, accuracy."""
    model.compile(
        optimizer=make_optimizer(config, total_steps or config.train.train_steps),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )


def fit(
    config: PipelineConfig,
    inputs: TrainingInputs,
    build_and_compile: Callable[[], keras.Model],
    *,
    choice: strategies.StrategyChoice,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    unlabeled: str | PseudoLabels = DROP_UNLABELED,
    component: str = "Trainer",
) -> tuple[keras.Model, dict[str, float]]:
    """Builds, trains and evaluates a model under the configured strategy.

    Works for any compiled Keras model: the teacher (Keras's own train step)
    and models with a custom `train_step` such as the distiller. In order:

    1. the strategy (`choice`, created by the task: `components.training.task`) and the settings
       are checked before any data is read: batch sizes must split over the
       replicas, accumulation needs a model that supports it;
    2. `build_and_compile` runs inside `strategy.scope()` and the
       `train.mixed_precision` policy, so variables are distributed and
       layers compute in the configured precision;
    3. datasets come from `inputs.make_datasets` per input pipeline (each worker
       reads its shard at its per-replica batch size) through
       `strategy.distribute_datasets_from_function`, or through a
       `DatasetCreator` scheduled on every worker by the `ClusterCoordinator`
       under the parameter-server strategy;
    4. training backs up to `inputs.backup_dir` (beside the execution's
       model run directory when the inputs come from `from_fn_args`) every
       `train.checkpoint_every_steps` steps and resumes from there when the
       process is started again with the same inputs (the task removes it
       after the export, see `Task.export` in `components.training.task`);
    5. a task of a multi-task cluster that loses a peer (a collective or a
       remote call fails: the peer died, or a collective timed out) raises
       `cluster.PeerLost` naming it (see `naming_lost_peers`);
    6. training from a tf.data service whose workers are all lost, none
       answering again within `ingestion.service.worker_wait_seconds`, fails
       with `IngestionError` naming the dispatcher (`service.watching_workers`).

    Loss scaling across replicas: Keras's compiled losses average per-example
    losses over the local batch and divide by the replicas in sync, so the
    all-reduced (summed) gradient is that of the mean over the *global*
    batch; custom steps should use `tf.nn.compute_average_loss` for the same
    reason. Metric variables are aggregated across replicas when read.

    Gradient accumulation (`train.grad_accum_steps` = N > 1): each step
    receives N micro-batches of `ingestion.batch_size` stacked on a leading
    axis and makes one optimizer update (see `models.accumulate_gradients`),
    so `train_steps` still counts updates and each update sees N x
    `ingestion.batch_size` examples.

    Args:
      config: The validated pipeline config.
      inputs: Paths and step counts.
      build_and_compile: Returns a compiled Keras model (called once, inside
        the strategy scope).
      choice: The task's strategy (`Task.choice`; created before anything
        else touches TensorFlow).
      callbacks: Extra Keras callbacks, run after the backup callback.
      component: Names the training in the service watch's messages.

    Returns:
      The trained model and its evaluation results on the eval split.

    Raises:
      ConfigError: naming the field, for settings that cannot work (before
        any data is read).
      cluster.PeerLost: naming the task of the cluster that was lost.
      IngestionError: every tf.data service worker lost for longer than the bound.
    """
    if choice.role != strategies.ROLE_TRAINER:
        raise ValueError(
            f"Trainer: this task ({choice.task_type}:{choice.task_id}) is a {choice.role}, not a trainer"
        )
    _check_settings(config, choice)
    keras.utils.set_random_seed(config.train.seed)
    tft_output = tft.TFTransformOutput(inputs.transform_output)
    with models.precision_policy(config.train.mixed_precision):
        with choice.strategy.scope():
            model = build_and_compile()
        _configure_model(model, config)
        decodes = _decode_in_step(model, config, inputs)
        train_data, eval_data = distributed_datasets(
            config, inputs, tft_output, choice, unlabeled, decoding_step=decodes
        )
        with naming_lost_peers(choice, inputs.backup_dir):
            _train(model, train_data, config, inputs, choice, component, callbacks)
            results = model.evaluate(
                eval_data, steps=inputs.eval_steps, return_dict=True, verbose=0
            )
    logging.info("Trainer: eval after training: %s", results)
    return model, results


# What TensorFlow raises when a peer of the cluster is gone (Unavailable,
# Aborted) or a collective waited past its timeout (DeadlineExceeded).
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError)


@contextlib.contextmanager
def naming_lost_peers(choice: strategies.StrategyChoice, backup_dir: str) -> Iterator[None]:
    """Re-raises a lost peer of a multi-task cluster as `cluster.PeerLost`, naming it.

    TensorFlow's error names the peer in its own terms, pages down, or not
    at all (a collective timeout); the task's own error names it as
    `TF_CONFIG` does (`worker:1 (host:port)`), says what restarts and where
    training resumes from. Single-process training re-raises unchanged.
    """
    tf_config = choice.tf_config
    if tf_config is None or (tf_config.num_workers < 2 and not tf_config.has_ps):
        yield
        return
    try:
        yield
    except _PEER_ERRORS as e:
        lost = cluster.lost_peers(tf_config, str(e))
        me = f"{choice.task_type}:{choice.task_id}"
        if lost:
            who = ", ".join(cluster.task_label(tf_config, t) for t in lost)
            what = f"lost {who}"
        elif isinstance(e, tf.errors.DeadlineExceededError):
            what = (
                "a collective timed out (strategy.collective_timeout_seconds) though every peer "
                "accepts connections: one is alive but stuck"
            )
        else:
            what = "lost a peer (every peer accepts connections again)"
        if not choice.uses_coordinator:
            restart = "the whole group restarts (kubeflow.max_restarts) and resumes"
        elif any(job == "ps" for job, _ in lost):
            restart = (
                "the parameter server's variables are gone with it: the job restarts "
                "(kubeflow.max_restarts) and the coordinator resumes"
            )
        else:
            restart = "the job restarts (kubeflow.max_restarts) and the coordinator resumes"
        raise cluster.PeerLost(
            f"Trainer: {me} of the {choice.kind} cluster {what} ({cluster.first_line(e)}); "
            f"{restart} from the last backup in {backup_dir}"
        ) from e


def _check_settings(config: PipelineConfig, choice: strategies.StrategyChoice) -> None:
    # Only what depends on the strategy resolved at run time: the config's
    # own ranges were validated when it was built.
    train = config.train
    strategies.check_batch_sizes(
        config.ingestion.batch_size,
        config.ingestion.eval_batch_size,
        choice.num_replicas,
        choice.kind,
    )
    if train.mixed_precision == "mixed_float16":
        if choice.kind == "tpu":
            raise ConfigError(
                "train.mixed_precision: TPUs compute in bfloat16; use 'mixed_bfloat16'"
            )
        if not tf.config.list_physical_devices("GPU"):
            logging.warning(
                "Trainer: train.mixed_precision 'mixed_float16' without a GPU runs, but slowly; use 'mixed_bfloat16' on CPU"
            )


def _configure_model(model: keras.Model, config: PipelineConfig) -> None:
    """Applies accumulation and steps-per-execution settings to the compiled model."""
    steps = config.train.grad_accum_steps
    if steps > 1:
        if not getattr(model, "supports_gradient_accumulation", False):
            raise ConfigError(
                f"train.grad_accum_steps: model {model.name!r} ({type(model).__name__}) cannot accumulate gradients; "
                "mix components.training.models.GradientAccumulationMixin into its class (a custom train_step then calls "
                "models.accumulate_gradients), or set train.grad_accum_steps: 1"
            )
        model.grad_accum_steps = steps
    if config.strategy.steps_per_execution > 1:
        model.steps_per_execution = config.strategy.steps_per_execution


def _decode_in_step(model: keras.Model, config: PipelineConfig, inputs: TrainingInputs) -> bool:
    """Makes `model`'s training step decode what the service may send as codes; returns
    whether it did (with the service on, `codes` not `off`, codebooks in the layout).

    The step decodes a feature only where it arrives as codes (uint8), so it also
    runs unchanged on values: `make_datasets` decides what is sent.
    """
    service = config.ingestion.service
    record = layout.read_layout(inputs.transform_output)
    if not service.enabled or service.codes == "off" or record is None or not record.codebooks:
        return False
    books = {name: np.asarray(b, np.float32) for name, b in record.codebooks.items()}
    model.train_step = codes.decoding_step(model.train_step, books)
    return True


def _train(
    model: keras.Model,
    train_data,
    config: PipelineConfig,
    inputs: TrainingInputs,
    choice: strategies.StrategyChoice,
    component: str,
    callbacks: Sequence[keras.callbacks.Callback],
) -> None:
    """`model.fit` with the backup, under `service.watching_workers` (see `fit`)."""
    steps_per_epoch = min(config.train.steps_per_epoch, inputs.train_steps)
    save_freq: int | str = max(
        1, config.train.checkpoint_every_steps // config.strategy.steps_per_execution
    )
    if choice.uses_coordinator:
        # Keras backs up a parameter-server run at epoch ends only, so
        # epochs are no longer than the backup interval.
        steps_per_epoch = min(steps_per_epoch, config.train.checkpoint_every_steps)
        save_freq = "epoch"
    backups = backup.TrainingBackup(inputs.backup_dir, save_freq=save_freq, delete_checkpoint=False)
    # Evaluation reads no service data: only training is watched.
    with service.watching_workers(
        config.ingestion.service, component, cancellable=not choice.uses_coordinator
    ) as watch:
        progress = [] if watch is None else [_Progress(watch)]
        model.fit(
            train_data,
            steps_per_epoch=steps_per_epoch,
            epochs=math.ceil(inputs.train_steps / steps_per_epoch),
            callbacks=[backups, _ResumeLog(backups.backup_dir), *callbacks, *progress],
            verbose=2,
        )


class _Progress(keras.callbacks.Callback):
    """Tells a `service.WorkerWatch` that training still makes steps."""

    def __init__(self, watch: service.WorkerWatch):
        super().__init__()
        self._watch = watch
        # Keras need not convert the step's logs to numpy for this callback.
        self._supports_tf_logs = True

    def on_train_batch_end(self, batch, logs=None):
        self._watch.progress()


class _ResumeLog(keras.callbacks.Callback):
    """Logs whether training resumed from a backup, and from which step."""

    def __init__(self, directory: str):
        super().__init__()
        self._directory = directory

    def on_train_begin(self, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step:
            logging.info("Trainer: resumed from the backup in %s at step %d", self._directory, step)
        else:
            logging.info("Trainer: no backup in %s; training from step 0", self._directory)
