"""`create_pipeline(config, paths)`: the TFX DAG. Knows no orchestrator.

ExampleGen -> StatisticsGen -> SchemaGen -> ExampleValidator -> Transform
(tfxkit) -> Trainer (tfxkit) -> Evaluator (TFMA value thresholds) -> Pusher
(only when blessed). The local and Kubeflow runners both call this function;
only paths, placement and the runner differ.
"""

from __future__ import annotations

import dataclasses

import tensorflow_model_analysis as tfma
from tfx import v1 as tfx

from components.config import PipelineConfig
from components.data import ResolvedInput
from components.trainer.component import Trainer
from components.transform.component import Transform


@dataclasses.dataclass(frozen=True)
class PipelinePaths:
    """Where a run reads and writes (local paths or cluster URIs).

    Attributes:
      pipeline_root: TFX pipeline root (artifacts).
      serving_dir: Pusher's filesystem destination.
      metadata_path: SQLite ML Metadata file ('' when the orchestrator
        provides the metadata store, as on Kubeflow).
    """

    pipeline_root: str
    serving_dir: str
    metadata_path: str = ""


def eval_config(config: PipelineConfig) -> tfma.EvalConfig:
    """TFMA config: accuracy must reach `evaluation.min_accuracy` to bless."""
    return tfma.EvalConfig(
        model_specs=[
            tfma.ModelSpec(
                signature_name="serving_default",
                label_key=config.data.label.name,
                prediction_key="probabilities",
            )
        ],
        slicing_specs=[tfma.SlicingSpec()],
        metrics_specs=[
            tfma.MetricsSpec(
                metrics=[
                    tfma.MetricConfig(class_name="ExampleCount"),
                    tfma.MetricConfig(
                        class_name="SparseCategoricalAccuracy",
                        config='{"name": "accuracy"}',
                        threshold=tfma.MetricThreshold(
                            value_threshold=tfma.GenericValueThreshold(
                                lower_bound={"value": config.evaluation.min_accuracy}
                            )
                        ),
                    ),
                    tfma.MetricConfig(
                        class_name="SparseCategoricalCrossentropy", config='{"name": "loss"}'
                    ),
                ]
            )
        ],
    )


def example_gen(config: PipelineConfig, data: ResolvedInput):
    """CSV or TFRecord ExampleGen with hash-bucketed train / eval splits."""
    input_config = tfx.proto.Input(splits=[tfx.proto.Input.Split(name="single_split", pattern=data.pattern)])
    output_config = tfx.proto.Output(
        split_config=tfx.proto.SplitConfig(
            splits=[
                tfx.proto.SplitConfig.Split(name="train", hash_buckets=config.data.train_buckets),
                tfx.proto.SplitConfig.Split(name="eval", hash_buckets=config.data.eval_buckets),
            ]
        )
    )
    cls = tfx.components.CsvExampleGen if data.format == "csv" else tfx.components.ImportExampleGen
    return cls(input_base=data.input_base, input_config=input_config, output_config=output_config)


def create_pipeline(
    config: PipelineConfig,
    data: ResolvedInput,
    paths: PipelinePaths,
    beam_pipeline_args: list[str] | None = None,
    enable_cache: bool = True,
) -> tfx.dsl.Pipeline:
    """Builds the pipeline for a validated config.

    Args:
      config: A validated `PipelineConfig`.
      data: The ExampleGen input (see `components.data.resolve_input`).
      paths: Pipeline root, push destination and metadata location.
      beam_pipeline_args: Beam args for Beam-based components.
      enable_cache: Reuse outputs of executions with unchanged inputs.
    """
    gen = example_gen(config, data)
    statistics = tfx.components.StatisticsGen(examples=gen.outputs["examples"])
    schema = tfx.components.SchemaGen(statistics=statistics.outputs["statistics"], infer_feature_shape=True)
    validator = tfx.components.ExampleValidator(
        statistics=statistics.outputs["statistics"], schema=schema.outputs["schema"]
    )
    transform = Transform(config=config, examples=gen.outputs["examples"], schema=schema.outputs["schema"])
    trainer = Trainer(
        config=config,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        schema=schema.outputs["schema"],
    )
    evaluator = tfx.components.Evaluator(
        examples=gen.outputs["examples"],
        model=trainer.outputs["model"],
        eval_config=eval_config(config),
    )
    pusher = tfx.components.Pusher(
        model=trainer.outputs["model"],
        model_blessing=evaluator.outputs["blessing"],
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(base_directory=paths.serving_dir)
        ),
    )
    components = [gen, statistics, schema, validator, transform, trainer, evaluator, pusher]
    metadata = (
        tfx.orchestration.metadata.sqlite_metadata_connection_config(paths.metadata_path)
        if paths.metadata_path
        else None
    )
    return tfx.dsl.Pipeline(
        pipeline_name=config.name,
        pipeline_root=paths.pipeline_root,
        components=components,
        enable_cache=enable_cache,
        metadata_connection_config=metadata,
        beam_pipeline_args=list(beam_pipeline_args if beam_pipeline_args is not None else config.beam_args),
    )
