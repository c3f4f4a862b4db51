"""Checks of a config against where it runs that need no TensorFlow.

The console script runs these before its heavy imports (TensorFlow and TFX
take about half a minute to import on a busy machine), so a wrong data path
or a local path in a Kubeflow config is reported at once. The runners call
the same functions, so the rules live here once.
"""

from __future__ import annotations

from components.config import ConfigError, PipelineConfig


def cluster_data_uri(config: PipelineConfig) -> str:
    """ExampleGen's input directory on the cluster: `kubeflow.data_uri`, else `data.path`.

    Raises:
      ConfigError: no data section, built-in data without `kubeflow.data_uri`,
        or a local path.
    """
    config.require_data("the tfxkit pipeline")
    uri = config.kubeflow.data_uri
    if not uri:
        if config.data.builtin:
            raise ConfigError(
                f"kubeflow.data_uri: data.builtin {config.data.builtin!r} lives on the machine that compiles; "
                "copy it to a bucket (kubeflow/README.md, step 1) and set kubeflow.data_uri to that directory"
            )
        uri = config.data.path
    if "://" not in uri:
        raise ConfigError(
            f"kubeflow.data_uri: {uri!r} is a local path, which pods on the cluster cannot read; "
            "use a directory URI such as gs://<bucket>/data/<name>"
        )
    return uri


def check_cluster_paths(config: PipelineConfig) -> None:
    """`kubeflow.pipeline_root` and `kubeflow.serving_dir` are URIs every pod can reach.

    Raises:
      ConfigError: naming the missing or local URI.
    """
    kf = config.kubeflow
    for name in ("pipeline_root", "serving_dir"):
        value = getattr(kf, name)
        if "://" not in value:
            got = f"got {value!r}" if value else "it is empty"
            raise ConfigError(
                f"kubeflow.{name}: expected a URI every pod can reach, such as gs://<bucket>/{config.name}/"
                f"{'root' if name == 'pipeline_root' else 'serving'} ({got})"
            )


def check_for_cluster(config: PipelineConfig) -> None:
    """Everything `tfxkit compile` can refuse before building the pipeline.

    Raises:
      ConfigError: naming the field.
    """
    cluster_data_uri(config)
    check_cluster_paths(config)
