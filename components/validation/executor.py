"""DataGate executor: fail the run before Transform when the data is bad."""

from __future__ import annotations

import os

from absl import logging
from tensorflow_data_validation.utils import anomalies_util
from tfx.components.statistics_gen import stats_artifact_utils
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils
from tfx.utils import io_utils

from components.config import payload
from components.validation.checks import gate_messages

SCHEMA_FILE = "schema.pbtxt"


class DataValidationError(ValueError):
    """The input data breaks the schema or the config; nothing downstream runs."""


def _read_schema(artifacts):
    if not artifacts:
        return None
    uri = artifact_utils.get_single_uri(artifacts)
    return io_utils.SchemaReader().read(io_utils.get_only_uri_in_dir(uri))


class Executor(base_executor.BaseExecutor):
    """Collects every problem (see `checks`), raises if any, else publishes the schema."""

    def Do(self, input_dict, output_dict, exec_properties):
        config = payload.decode_exec_properties(exec_properties).config
        stats_artifact = artifact_utils.get_single_instance(input_dict["statistics"])
        anomalies_artifact = artifact_utils.get_single_instance(input_dict["anomalies"])
        splits = artifact_utils.decode_split_names(stats_artifact.split_names)
        stats = {s: stats_artifact_utils.load_statistics(stats_artifact, s).proto() for s in splits}
        anomalies = {}
        for split in artifact_utils.decode_split_names(anomalies_artifact.split_names):
            path = os.path.join(
                artifact_utils.get_split_uri([anomalies_artifact], split), "SchemaDiff.pb"
            )
            anomalies[split] = anomalies_util.load_anomalies_binary(path)
        baseline = _read_schema(input_dict.get("baseline_schema"))
        logging.info(
            "DataGate: baseline schema %s",
            "found" if baseline is not None else "none (first validated run)",
        )
        problems = gate_messages(stats, anomalies, config.data, baseline)
        if problems:
            raise DataValidationError(
                f"DataGate: {len(problems)} problem(s) in the input data; nothing was trained or pushed:\n  "
                + "\n  ".join(problems)
            )
        schema = _read_schema(input_dict["schema"])
        out_uri = artifact_utils.get_single_uri(output_dict["validated_schema"])
        io_utils.write_pbtxt_file(os.path.join(out_uri, SCHEMA_FILE), schema)
