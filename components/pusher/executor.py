"""Pusher executor whose filesystem push is atomic.

TFX's stock Pusher copies the model file by file into `<base>/<version>`; a
process killed mid-copy leaves a half-written version directory that a model
server polling `<base>` will try to load. This executor pushes with
`atomic.atomic_copy_model`, so the destination holds either the old versions
only or the complete new one.

It pushes only a model every blessing it is given blesses: the Evaluator's
(`model_blessing`) and, when the pipeline has a second gate, the served-model
Evaluator's (`served_blessing`); the log names the one that refused.
"""

from __future__ import annotations

import os
import time

import tensorflow as tf
from absl import logging
from tfx.components.pusher import executor as tfx_pusher_executor
from tfx.components.util import model_utils
from tfx.proto import pusher_pb2
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import io_utils, proto_utils

from components.pusher.atomic import atomic_copy_model

SERVED_BLESSING_KEY = "served_blessing"
# Each blessing input and what refused when it does not bless.
_GATES = (
    (standard_component_specs.MODEL_BLESSING_KEY, "the Evaluator"),
    (SERVED_BLESSING_KEY, "the served-model gate"),
)


class Executor(tfx_pusher_executor.Executor):
    """Pushes a blessed model with an atomic rename (filesystem destinations)."""

    def CheckBlessing(self, input_dict) -> bool:
        """Whether every given blessing (`_GATES`, then stock's infra blessing) blesses.

        Logs which one refused.
        """
        for key, gate in _GATES:
            if not input_dict.get(key):
                continue
            blessing = artifact_utils.get_single_instance(input_dict[key])
            if not model_utils.is_model_blessed(blessing):
                logging.info(
                    "Pusher: not pushed: %s (%s) did not bless the model (%s)",
                    gate,
                    key,
                    blessing.uri,
                )
                return False
        return super().CheckBlessing(input_dict)

    def Do(self, input_dict, output_dict, exec_properties):
        self._log_startup(input_dict, output_dict, exec_properties)
        model_push = artifact_utils.get_single_instance(
            output_dict[standard_component_specs.PUSHED_MODEL_KEY]
        )
        if not self.CheckBlessing(input_dict):
            self._MarkNotPushed(model_push)
            return
        destination = pusher_pb2.PushDestination()
        proto_utils.json_to_proto(
            exec_properties[standard_component_specs.PUSH_DESTINATION_KEY], destination
        )
        if destination.WhichOneof("destination") != "filesystem":
            super().Do(input_dict, output_dict, exec_properties)
            return
        model_path = self.GetModelPath(input_dict)
        version = str(int(time.time()))
        serving_path = os.path.join(destination.filesystem.base_directory, version)
        while tf.io.gfile.exists(serving_path):
            # Two pushes within one second: take the next free version number.
            version = str(int(version) + 1)
            serving_path = os.path.join(destination.filesystem.base_directory, version)
        serving_path = atomic_copy_model(model_path, destination.filesystem.base_directory, version)
        logging.info("Pusher: model written to %s", serving_path)
        io_utils.copy_dir(model_path, model_push.uri)
        self._MarkPushed(model_push, pushed_destination=serving_path, pushed_version=version)
