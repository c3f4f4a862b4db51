"""Trainer executor: decodes the payload first, then launches a job or hosts the run_fn.

`Executor.Do` decodes the payload, then submits a training job on Kubeflow
(`components.trainer.launcher`), hosts a user module's `run_fn` or runs the tfxkit
`run_fn` (`components.trainer.host`); `main` is each job replica's entry
(`python -m components.trainer.executor`).
"""

from __future__ import annotations

import os
import tempfile

from absl import logging
from tfx.components.trainer import executor as tfx_trainer_executor
from tfx.components.util import udf_utils
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils, standard_component_specs

from components.compat import user_code
from components.config import payload
from components.kubernetes import env as tfxkit_env
from components.kubernetes import jobs
from components.trainer import fn_args as fn_args_lib
from components.trainer import host, launcher


class Executor(tfx_trainer_executor.GenericExecutor):
    """Fails fast on an invalid config, before any input is read."""

    def Do(self, input_dict, output_dict, exec_properties):
        # TFX's user-code wheel (a module_file) is unpacked, not pip-installed.
        with user_code.unpacked_wheels():
            self._do(input_dict, output_dict, exec_properties)

    def _do(self, input_dict, output_dict, exec_properties):
        decoded = payload.decode_exec_properties(exec_properties)
        decoded, exec_properties = self.prepare(decoded, input_dict, exec_properties)
        if launcher.should_launch(decoded.config):
            launcher.launch(decoded.config, input_dict, output_dict, exec_properties)
            return
        self._log_startup(input_dict, output_dict, exec_properties)

        def make_fn_args():
            fn_args = self._GetFnArgs(input_dict, output_dict, exec_properties)
            return fn_args_lib.with_payload(fn_args, decoded)

        if decoded.settings is not None:
            host.run_user_fn(
                decoded.settings,
                exec_properties,
                make_fn_args,
                input_dict[standard_component_specs.EXAMPLES_KEY],
            )
            return
        fn_args = make_fn_args()
        host.run_product_fn(udf_utils.get_fn(exec_properties, "run_fn"), fn_args)

    def prepare(self, decoded: payload.Payload, input_dict, exec_properties):
        """What a subclass adds to the payload before training or launching a job.

        Returns:
          `(payload, exec_properties)`: the execution properties are what a
          job's replicas re-run this executor on, so they must carry it too.
        """
        del input_dict  # the Trainer adds nothing
        return decoded, exec_properties


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
