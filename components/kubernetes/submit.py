"""Uploads a compiled pipeline to Kubeflow Pipelines (and optionally runs it).

Submitting lives apart from compiling (`pipelines.kubeflow_runner`): it needs
only the compiled YAML and a KFP endpoint, no TFX and no config.
"""

from __future__ import annotations

import os
import time


def submit(
    package_path: str,
    host: str,
    pipeline_name: str,
    *,
    version_name: str | None = None,
    run: bool = False,
    experiment: str = "Default",
    namespace: str | None = None,
) -> dict[str, str]:
    """Uploads a compiled pipeline through `kfp.Client` (a new version if the name exists).

    Args:
      package_path: The compiled YAML.
      host: The KFP API endpoint (e.g. http://localhost:8080 after a port-forward).
      pipeline_name: Name of the pipeline in KFP.
      version_name: Name of the new version (default: the file name and a timestamp).
      run: Also start a run of the uploaded version.
      experiment: Experiment of the run.
      namespace: Kubeflow profile namespace (multi-user deployments).

    Returns:
      `pipeline_id`, `version_id` and, with `run`, `run_id`.
    """
    import kfp

    client = kfp.Client(host=host, namespace=namespace)
    pipeline_id = client.get_pipeline_id(pipeline_name)
    if pipeline_id is None:
        pipeline = client.upload_pipeline(package_path, pipeline_name=pipeline_name)
        pipeline_id = pipeline.pipeline_id
        # Uploading a new pipeline creates its first version; runs need its id.
        versions = client.list_pipeline_versions(
            pipeline_id, page_size=1, sort_by="created_at desc"
        )
        version_id = versions.pipeline_versions[0].pipeline_version_id
    else:
        name = version_name or f"{os.path.basename(package_path)}-{time.strftime('%Y%m%d-%H%M%S')}"
        version_id = client.upload_pipeline_version(
            package_path, name, pipeline_id=pipeline_id
        ).pipeline_version_id
    out = {"pipeline_id": pipeline_id, "version_id": version_id}
    if run:
        experiment_id = client.create_experiment(experiment, namespace=namespace).experiment_id
        result = client.run_pipeline(
            experiment_id=experiment_id,
            job_name=f"{pipeline_name}-{time.strftime('%Y%m%d-%H%M%S')}",
            pipeline_id=pipeline_id,
            version_id=version_id,
        )
        out["run_id"] = result.run_id
    return out
