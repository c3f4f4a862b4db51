"""Runs one TFX example pipeline in a process of its own (see `test_tfx_examples_e2e`).

    python -m tests.components.dropin.run_example SPEC_JSON

The spec names the example (`tfx_examples.TAXI.name`, `PENGUIN.name` or `MNIST.name`),
the work directory, the data root, whether the imports are swapped, the
step count, optionally the `beam_pipeline_args`, with `enable_tuning` the penguin example's own stock Tuner, and
with `distill_steps` the distillation stage a user adds
(`tfx_examples.add_distillation`). The run happens here, not in the test process: a Transform run
leaves its vocabulary tables in the process's TensorFlow resource manager
under names derived from the graph, so a later, different Transform in the
same process (the product's own, in the next test module) would collide
with them. Writes `<root>/result.json`: the node ids of the example's DAG
and the signatures of every pushed model (teacher and student); when it
distils, how the Distiller reads the teacher (`tfx_examples.teacher_agreement`).
"""

from __future__ import annotations

import glob
import json
import os
import sys

from absl import logging
from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

from testkit import tfx_examples


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    example = tfx_examples.BY_NAME[spec["example"]]
    module = tfx_examples.load_pipeline(
        example, spec["code_dir"], swapped=spec["swapped"], train_steps=spec["train_steps"]
    )
    pipeline = tfx_examples.create_pipeline(
        example,
        module,
        spec["root"],
        spec["data_root"],
        enable_tuning=spec.get("enable_tuning", False),
        # The DirectRunner's defaults (in memory, one worker) without TFX packaging
        # itself for every Beam executor (`tfx_examples.create_pipeline`), unless the
        # spec names a runner (`beam_pipeline_args`, e.g. Prism's).
        beam_pipeline_args=spec.get("beam_pipeline_args", ()),
    )
    if spec.get("distill_steps"):
        # TFX 1.21's taxi module reads only some of the categorical features its
        # Transform writes, so the label is no longer the one feature the teacher
        # leaves unread: it is named, as a user of that module names it.
        config = (
            {"distillation": {"label_key": "tips_xf"}} if example is tfx_examples.TAXI else None
        )
        tfx_examples.add_distillation(
            example, pipeline, spec["root"], spec["distill_steps"], config=config
        )
    if spec.get("enable_tuning"):
        # The example's run_fn logs the hyperparameters it got at INFO.
        logging.set_verbosity(logging.INFO)
    BeamDagRunner().run(pipeline)
    result = {
        "nodes": sorted(c.id for c in pipeline.components),
        "signatures": {
            m: tfx_examples.signatures(m) for m in tfx_examples.pushed_models(spec["root"])
        },
        "student_signatures": {
            m: tfx_examples.signatures(m)
            for m in tfx_examples.pushed_models(spec["root"], tfx_examples.STUDENT_PUSH)
        },
    }
    if spec.get("distill_steps"):
        result["teacher"] = tfx_examples.teacher_agreement(spec["root"])
    if spec.get("enable_tuning"):
        (path,) = glob.glob(
            os.path.join(
                spec["root"], "pipeline_root", "Tuner", "best_hyperparameters", "*", "*.txt"
            )
        )
        with open(path) as f:
            result["best_hyperparameters"] = json.load(f)["values"]
    with open(spec["result"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
