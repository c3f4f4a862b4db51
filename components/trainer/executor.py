"""Trainer executor: validates the config first, then runs TFX's GenericExecutor.

With a user module (drop-in, see `components.dropin`), the user's `run_fn`
runs inside the configured strategy's scope and Keras precision policy, with
`fn_args.data_accessor.tf_dataset_factory` backed by tfxkit's input pipeline
(`components.trainer.data_accessor`); on a multi-worker job only the chief's
`serving_model_dir` is the model artifact (the others save to scratch), and a
`backup_and_restore(fn_args)` backup is removed after the chief's export. A
run_fn whose Keras fit / evaluate gets the repeating dataset and no step count
(`train_args` / `eval_args` without `num_steps`) fails at once, as under stock
TFX, naming the argument.

On Kubeflow, a multi-worker strategy trains through a training job instead
(a TrainJob or a TFJob, see `components.kubeflow.jobs`): the step submits and
watches the job, and each replica runs this module (`python -m
components.trainer.executor`) on the step's invocation, with the `TF_CONFIG`
the training operator gives it or, on a TrainJob, the one
`components.strategies` derives from its JobSet environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

import tensorflow as tf
from absl import logging
from tfx.components.trainer import executor as tfx_trainer_executor
from tfx.components.util import udf_utils
from tfx.dsl.components.base import base_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils, standard_component_specs

from components import dropin, legacy_keras, models, payload, strategies
from components.kubeflow import env as tfxkit_env
from components.kubeflow import jobs
from components.trainer import data_accessor


class Executor(tfx_trainer_executor.GenericExecutor):
    """Fails fast on an invalid config, before any input is read."""

    def Do(self, input_dict, output_dict, exec_properties):
        decoded = payload.decode_exec_properties(exec_properties)
        decoded, exec_properties = self.prepare(decoded, input_dict, exec_properties)
        config = decoded.config
        if config is not None and jobs.should_launch(config, os.environ):
            invocation = {
                "input_dict": artifact_utils.jsonify_artifact_dict(input_dict),
                "output_dict": artifact_utils.jsonify_artifact_dict(output_dict),
                "exec_properties": json.loads(json.dumps(exec_properties)),
            }
            model_run = artifact_utils.get_single_uri(
                output_dict[standard_component_specs.MODEL_RUN_KEY]
            )
            jobs.launch(config, invocation, model_run, os.environ, log=logging.info)
            return
        if decoded.settings is not None:
            self._run_user_module(decoded.settings, input_dict, output_dict, exec_properties)
            return
        self._run_fn(decoded, input_dict, output_dict, exec_properties)

    def prepare(self, decoded: payload.Payload, input_dict, exec_properties):
        """What a subclass adds to the payload before training or launching a job.

        Returns:
          `(payload, exec_properties)`: the execution properties are what a
          job's replicas re-run this executor on, so they must carry it too.
        """
        del input_dict  # the Trainer adds nothing
        return decoded, exec_properties

    def _run_fn(self, decoded: payload.Payload, input_dict, output_dict, exec_properties) -> None:
        """TFX's GenericExecutor.Do, with the decoded payload handed to the run_fn."""
        self._log_startup(input_dict, output_dict, exec_properties)
        fn_args = payload.attach(self._GetFnArgs(input_dict, output_dict, exec_properties), decoded)
        run_fn = udf_utils.get_fn(exec_properties, "run_fn")
        logging.info("Training model.")
        run_fn(fn_args)
        # As stock TFX: on a multi-worker job the run_fn exports once (the chief).
        if not fileio.exists(fn_args.serving_model_dir):
            raise RuntimeError("run_fn failed to generate model.")
        logging.info(
            "Training complete. Model written to %s. ModelRun written to %s",
            fn_args.serving_model_dir,
            fn_args.model_run_dir,
        )

    def _run_user_module(self, settings, input_dict, output_dict, exec_properties) -> None:
        """Runs the user's `run_fn` under the configured strategy, with the fast data accessor."""
        self._log_startup(input_dict, output_dict, exec_properties)
        # Before the user module is imported: it must see tf_keras as tf.keras.
        legacy_keras.ensure_legacy_keras()
        choice = strategies.create_strategy(settings.strategy)
        if choice.role == strategies.ROLE_SERVER:
            logging.info("Trainer: serving as %s:%d", choice.task_type, choice.task_id)
            strategies.start_server(choice.tf_config).join()
            return
        if choice.role == strategies.ROLE_EVALUATOR:
            logging.info("Trainer: evaluator task; the Evaluator component evaluates the export")
            return
        fn_args = self._GetFnArgs(input_dict, output_dict, exec_properties)
        fn_args.data_accessor = data_accessor.tfxkit_data_accessor(
            fn_args,
            input_dict[standard_component_specs.EXAMPLES_KEY],
            settings,
            num_workers=choice.tf_config.num_workers if choice.tf_config else 1,
        )
        serving_dir = fn_args.serving_model_dir
        if not choice.is_chief:
            # Every worker must save (a collective), only the chief into the artifact.
            fn_args.serving_model_dir = os.path.join(
                fn_args.model_run_dir, f"export-{choice.task_type}-{choice.task_id}"
            )
        run_fn = udf_utils.get_fn(exec_properties, "run_fn")
        scope = strategy_scope(settings, choice)
        logging.info(
            "Trainer: running the user run_fn %s",
            f"under {choice.describe()}" if scope else "as stock TFX does (one device, no scope)",
        )
        with models.precision_policy(settings.mixed_precision), scope or contextlib.nullcontext():
            try:
                run_fn(fn_args)
            except RuntimeError as e:
                if scope and "Mixing different tf.distribute.Strategy" in str(e):
                    raise RuntimeError(
                        f"strategy.kind: the user run_fn enters its own tf.distribute strategy inside the "
                        f"configured one ({choice.kind}); remove the run_fn's strategy, or leave "
                        f"strategy.kind 'auto' on one device to keep it: {e}"
                    ) from e
                raise
            except ValueError as e:
                unset = _unset_step_args(e, fn_args)
                if not unset:
                    raise
                args, fields = (" / ".join(names) for names in zip(*unset, strict=True))
                raise ValueError(
                    f"{args}: not set, so {fields} {'is' if len(unset) == 1 else 'are'} None and "
                    "the user run_fn's Keras fit or evaluate got no step count for the repeating "
                    "dataset of fn_args.data_accessor.tf_dataset_factory "
                    "(TensorFlowDatasetOptions.num_epochs None repeats forever, as in stock TFX); "
                    "give the Trainer train_args=tfx.proto.TrainArgs(num_steps=N) / "
                    "eval_args=tfx.proto.EvalArgs(num_steps=N) (or a full config with "
                    f"train.train_steps / train.eval_steps), or a finite num_epochs: {e}"
                ) from e
        if not choice.is_chief:
            if tf.io.gfile.exists(fn_args.serving_model_dir):
                tf.io.gfile.rmtree(fn_args.serving_model_dir)
            return
        if not fileio.exists(serving_dir):
            raise RuntimeError(
                f"run_fn: the user run_fn wrote no model to fn_args.serving_model_dir ({serving_dir})"
            )
        backup = dropin.backup_dir(fn_args)
        if tf.io.gfile.exists(backup):
            tf.io.gfile.rmtree(backup)
            logging.info("Trainer: removed the training backup %s after export", backup)


# What Keras (tf_keras) raises for fit / evaluate on an infinite dataset without steps.
_NO_STEPS_MESSAGES = (
    "infinitely repeating dataset, please specify",
    "infinite dataset, you must specify the number of steps",
)


def _unset_step_args(error: ValueError, fn_args) -> list[tuple[str, str]]:
    """`(Trainer argument, fn_args field)` to name when Keras refused an infinite dataset without steps."""
    if not any(m in str(error) for m in _NO_STEPS_MESSAGES):
        return []
    return [
        (arg, f"fn_args.{field}")
        for arg, field in (
            ("train_args.num_steps", "train_steps"),
            ("eval_args.num_steps", "eval_steps"),
        )
        if getattr(fn_args, field) is None
    ]


def strategy_scope(settings, choice: strategies.StrategyChoice):
    """The scope a user run_fn runs in, or None to run it as stock TFX does.

    `auto` resolving to a single replica (one device, no cluster) is what
    stock TFX gives a run_fn, so no scope is entered: a run_fn that creates
    and enters its own strategy (TFX's penguin example does) keeps working.
    Any configured kind, or `auto` finding several devices or a cluster,
    runs the run_fn inside that strategy's scope.
    """
    if settings.strategy.kind == "auto" and choice.num_replicas == 1 and choice.tf_config is None:
        return None
    return choice.strategy.scope()


def main() -> None:
    """A training-job replica: trains on the invocation the Trainer step wrote.

    The step recorded its exec properties after its executor (a subclass such
    as the Distiller's included) had prepared them, so every replica runs this
    base executor on them and trains exactly what the step would have.
    """
    logging.set_verbosity(logging.INFO)
    invocation = jobs.read_invocation(tfxkit_env.invocation_uri(os.environ))
    context = base_executor.BaseExecutor.Context(tmp_dir=tempfile.mkdtemp(prefix="tfxkit-replica-"))
    Executor(context).Do(
        artifact_utils.parse_artifact_dict(invocation["input_dict"]),
        artifact_utils.parse_artifact_dict(invocation["output_dict"]),
        invocation["exec_properties"],
    )


if __name__ == "__main__":
    main()
