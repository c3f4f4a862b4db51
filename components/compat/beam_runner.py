"""The product's local Beam runner: Beam's in-process runners, chosen explicitly.

Beam's `DirectRunner` (`SwitchingDirectRunner.run_pipeline`, Beam 2.72 and 2.77) first
tries Prism for every pipeline its support check accepts: it downloads a Prism binary
from GitHub at run time, runs the pipeline there (about 2.3x slower than in-process for
TFT on 200k rows), and falls back to the in-process runners only when that fails. So
which runner a run gets depended on the network. `LocalRunner` is that same switch
without the Prism attempt: the FnApiRunner (in memory, or `--direct_running_mode
multi_processing`), or the bundle-based runner where the FnApiRunner lacks a feature.

It is chosen as Beam's default runner (`local_by_default`), never as a `--runner`
argument, so a `--runner` in `beam_args` (Prism, Flink, Dataflow) always wins: a local
run makes it the default for the whole run (TFX's BeamDagRunner builds its own pipeline
with no options, and every component runs in the same process), the product's Transform
for its own pipeline (a drop-in in a stock pipeline, a Kubeflow pod). An argument would
not do: TFX's Beam executors also parse `beam_pipeline_args` as absl flags, and a
pipeline script may define a `runner` flag of its own (TFX's penguin example defines an
enum of three runner names, which refuses any other value).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from absl import logging
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.runners.direct.direct_runner import SwitchingDirectRunner

RUNNER = "components.compat.beam_runner.LocalRunner"


class LocalRunner(SwitchingDirectRunner):
    """Beam's DirectRunner switch (FnApiRunner, else bundle-based) without trying Prism.

    Beam's switch skips Prism for an interactive pipeline (`_is_interactive`, read
    only by its Prism check), which this runner declares itself to be; nothing else
    of the switch reads it.
    """

    _is_interactive = True

    def run_pipeline(self, pipeline, options):
        logging.info(
            "Beam: running in this process on Beam's in-process runners (%s, pinned: no "
            "Prism download; a --runner in beam_args chooses another)",
            RUNNER,
        )
        return super().run_pipeline(pipeline, options)


@contextlib.contextmanager
def local_by_default() -> Iterator[None]:
    """`LocalRunner` is Beam's default runner inside the block (a pipeline built with no
    `--runner`, as TFX's BeamDagRunner builds its own), and what it was again after."""
    before = StandardOptions.DEFAULT_RUNNER
    StandardOptions.DEFAULT_RUNNER = RUNNER
    try:
        yield
    finally:
        StandardOptions.DEFAULT_RUNNER = before
