"""Subprocess entry point of the Trainer tests: `python -m tests.components.training.worker SPEC`.

Strategies that need logical CPU devices or a cluster must own a fresh
process (TensorFlow fixes its devices and collective setup when it
initialises), so tests describe jobs in a JSON spec and run them here:

- `probe`: create the strategy of `config`; record kind, replicas, devices,
  chief, or the error message;
- `run`: create the strategy, then `run_fn.run` (train, export, drop the
  backup); record eval results and the trained layer weights (`.npz`);
- `run_fn`: the TFX entry `run_fn(FnArgs)` exactly as the Trainer executor
  calls it, reading `TF_CONFIG` from the environment;
- `distil`: the Distiller's `run_fn` on a `student_fn` module file
  (`module_file`) and Keras teachers (`teacher_dirs`);
- `tf_config`: record the `TF_CONFIG` this process derives from its
  JobSet environment (`cluster.tf_config_from_jobset`), or None;
- `ps_servers`: start in-process worker / ps servers of a parameter-server
  cluster (given as TF_CONFIG dicts) and keep them for the next jobs.

A job's `env` entries (e.g. `TF_CONFIG`) are set before it runs. The
results list goes to `spec["result"]` as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    from absl import logging

    logging.set_verbosity(logging.INFO)
    results, servers = [], []
    for job in spec["jobs"]:
        results.append(run_job(job, servers))
        with open(spec["result"], "w") as f:
            json.dump(results, f)


def run_job(job: dict, servers: list) -> dict:
    import numpy as np

    from components.config import PipelineConfig, payload
    from components.config.payload import CONFIG_KEY
    from components.trainer import run_fn
    from components.training import cluster, strategies
    from components.training import fit as training
    from components.training import task as task_lib
    from tests.components.training.penguins import layer_weights

    kind = job["kind"]
    os.environ.update(job.get("env", {}))
    if kind == "tf_config":
        return {"tf_config": cluster.tf_config_from_jobset(os.environ)}
    if kind == "ps_servers":
        for text in job["tf_configs"]:
            servers.append(strategies.start_server(cluster.parse_tf_config(json.dumps(text))))
        return {"servers": len(servers)}
    config = PipelineConfig.from_json(job["config"])
    if kind == "distil":
        # The Distiller's run_fn on a student_fn module, as its executor calls it.
        from tfx.components.trainer.fn_args_utils import FnArgs

        from components.config import payload
        from components.distiller import run_fn as distiller_run_fn

        custom_config = payload.encode(None, config=config)
        custom_config[payload.TEACHER_DIRS_KEY] = job["teacher_dirs"]
        custom_config[payload.STUDENT_MODULE_KEY] = {"module_file": job["module_file"]}
        distiller_run_fn.run_fn(FnArgs(**job["inputs"], custom_config=custom_config))
        return {"done": True}
    if kind == "run_fn":
        from tfx.components.trainer.fn_args_utils import FnArgs

        run_fn.run_fn(FnArgs(**job["inputs"], custom_config={CONFIG_KEY: job["config"]}))
        return {"done": True}
    try:
        choice = strategies.create_strategy(config.strategy)
    except cluster.StrategyError as e:
        return {"error": str(e)}
    out = {
        "kind": choice.kind,
        "replicas": choice.num_replicas,
        "devices": list(choice.devices),
        "is_chief": choice.is_chief,
        "class": type(choice.strategy).__name__,
    }
    if kind == "run":
        try:
            trainer = task_lib.Task("Trainer", choice, payload.Payload(config=config))
            model, results = run_fn.run(trainer, training.TrainingInputs(**job["inputs"]))
        except Exception as e:  # noqa: BLE001 - reported to the test, which asserts on it
            out["error"] = f"{type(e).__name__}: {e}"
            out["traceback"] = traceback.format_exc()
            return out
        out["results"] = results
        out["iterations"] = int(model.optimizer.iterations.numpy())
        np.savez(job["weights"], **layer_weights(model))
    return out


if __name__ == "__main__":
    main(sys.argv[1])
