"""Transform executor: TFX's Transform, writing ingestion-ready output.

`Executor` checks the TFX / TFT internals it relies on, then runs TFX's Transform with the
tfxkit writer (`components.data.writer`) and its layout record when tfxkit settings ask for
it; without them, or with `stock_output`, its output is exactly TFX's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from tfx.components.transform import executor as tfx_transform_executor
from tfx.types import artifact_utils, standard_component_specs

from components.compat import beam_runner, beam_signatures, user_code
from components.compat import tfx_transform as tfx_compat
from components.config import payload
from components.data import writer

# Prefix TFX gives the transformed examples of a split (`<split uri>/transformed_examples-*`).
EXAMPLES_PREFIX = "transformed_examples"


def split_prefixes(transformed_examples) -> dict[str, str]:
    """Output path prefix -> split name, for every transformed examples artifact."""
    prefixes = {}
    for artifact in transformed_examples or []:
        for split in artifact_utils.decode_split_names(artifact.split_names):
            prefixes[
                os.path.join(artifact_utils.get_split_uri([artifact], split), EXAMPLES_PREFIX)
            ] = split
    return prefixes


@contextlib.contextmanager
def _every_run() -> Iterator[None]:
    """What every run of this executor, stock output or not, runs under."""
    with (
        tfx_compat.without_deep_copy(),
        beam_signatures.cached_signatures(),
        user_code.unpacked_wheels(),
    ):
        yield


class Executor(tfx_transform_executor.Executor):
    """Fails fast on an unsupported TFX / TFT or an invalid config, then runs TFX's Transform with the tfxkit writer."""

    def _make_beam_pipeline(self):
        # Beam's in-process runners unless the pipeline's beam_pipeline_args name a
        # runner (components.compat.beam_runner), in a stock pipeline too. Set as Beam's
        # default, not as a --runner argument: TFX also parses these args as absl flags,
        # and a pipeline script may define its own `runner` flag (TFX's penguin example
        # does, an enum of Beam's runner names).
        with beam_runner.local_by_default():
            return super()._make_beam_pipeline()

    def Do(self, input_dict, output_dict, exec_properties):
        decoded = payload.decode_exec_properties(exec_properties)
        # Before anything else runs: the patches below are only right for the TFX / TFT they were written for.
        tfx_compat.check()
        # A user module carries drop-in settings (with or without a full config).
        config = decoded.settings or decoded.config
        if config is None or getattr(config, "stock_output", False):
            with _every_run():
                super().Do(input_dict, output_dict, exec_properties)
            return
        graph_uri = artifact_utils.get_single_uri(
            output_dict[standard_component_specs.TRANSFORM_GRAPH_KEY]
        )
        settings = writer.OutputSettings.from_config(
            config, os.path.join(graph_uri, writer.STAGING_DIR)
        )
        writer.clear_staged_records(settings)
        with (
            _every_run(),
            tfx_compat.tfrecord_writer(
                lambda schema, output_path: writer.WriteIngestionReady(
                    settings, schema, output_path
                )
            ),
        ):
            super().Do(input_dict, output_dict, exec_properties)
        # After the run: TFX's `Do` sets the split names of the transformed examples.
        prefixes = split_prefixes(
            output_dict.get(standard_component_specs.TRANSFORMED_EXAMPLES_KEY)
        )
        writer.write_layout_record(graph_uri, prefixes, settings)
