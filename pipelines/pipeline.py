"""`create_pipeline(config, paths)`: the TFX DAG. Knows no orchestrator.

Builds ExampleGen, the statistics and schema, DataGate, Transform, the teacher Trainers,
the distillation stage (`distillation_stage`), the Evaluators (against the served
model's Resolver, `served_model`) and the Pusher from a validated config; both runners
call it with their `PipelinePaths`.
"""

from __future__ import annotations

import dataclasses

import tensorflow_model_analysis as tfma
from tfx import components as stock
from tfx.dsl.components.common.resolver import Resolver
from tfx.dsl.input_resolution.strategies.latest_artifact_strategy import LatestArtifactStrategy
from tfx.dsl.input_resolution.strategies.latest_blessed_model_strategy import (
    LatestBlessedModelStrategy,
)
from tfx.orchestration import metadata as tfx_metadata
from tfx.orchestration import pipeline as tfx_pipeline
from tfx.proto import example_gen_pb2, pusher_pb2
from tfx.types import channel, standard_artifacts

from components.config import M_ON_M, NOISY_STUDENT, PipelineConfig
from components.data.sources import ResolvedInput
from components.distiller.component import Distiller, EnsembleStudent, StudentRound, round_id
from components.example_gen import CsvExampleGen, ExampleRules, ImportExampleGen
from components.pusher.component import Pusher
from components.trainer.baseline import ModelBaseline, StudentBaseline
from components.trainer.component import Trainer
from components.transform.component import Transform
from components.validation.component import DataGate
from pipelines.roles import (
    EVALUATOR_ID,
    GATE_ID,
    GATE_SCHEMA_KEY,
    SERVED_GATE_ID,
    SERVED_RESOLVER_ID,
    baseline_id,
    teacher_id,
)


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


def _accuracy_change_threshold(result: tfma.EvalConfig, max_drop: float) -> tfma.EvalConfig:
    """`result` with a change threshold on accuracy: at most `max_drop` (absolute) below
    the baseline model's."""
    for metrics_spec in result.metrics_specs:
        for metric in metrics_spec.metrics:
            if metric.class_name == "SparseCategoricalAccuracy":
                metric.threshold.change_threshold.CopyFrom(
                    tfma.GenericChangeThreshold(
                        direction=tfma.MetricDirection.HIGHER_IS_BETTER,
                        absolute={"value": -max_drop},
                    )
                )
    return result


def served_eval_config(config: PipelineConfig) -> tfma.EvalConfig:
    """`eval_config` plus the served-model gate: the candidate's accuracy may be at most
    `evaluation.change_threshold` below the served model's (the Evaluator's baseline).

    One unnamed model spec, as TFX's examples: TFX's Evaluator adds the
    baseline's spec when the Resolver found a served model, and on a first run
    (none) drops the change threshold (it always "rubber-stamps" a missing
    baseline), leaving `min_accuracy` alone to decide.
    """
    return _accuracy_change_threshold(eval_config(config), config.evaluation.change_threshold)


def distillation_eval_config(config: PipelineConfig) -> tfma.EvalConfig:
    """`eval_config` with the student as candidate and the teacher as baseline.

    Adds a change threshold to accuracy: the candidate may score at most
    `evaluation.max_accuracy_drop` (absolute) below the baseline.
    """
    result = eval_config(config)
    (spec,) = result.model_specs
    candidate, baseline = tfma.ModelSpec(), tfma.ModelSpec()
    candidate.CopyFrom(spec)
    baseline.CopyFrom(spec)
    candidate.name, baseline.name, baseline.is_baseline = "candidate", "baseline", True
    del result.model_specs[:]
    result.model_specs.extend([candidate, baseline])
    return _accuracy_change_threshold(result, config.evaluation.max_accuracy_drop)


def distillation_stage(config: PipelineConfig, transform, schema, teacher) -> list:
    """Extra teacher Trainers and the Distiller that learns from all teachers.

    Args:
      config: The validated config (`distillation.enabled`).
      transform: The Transform component.
      schema: The SchemaGen component.
      teacher: The first teacher Trainer (id `Trainer`).

    Returns:
      The components to add after `teacher`: the other teachers, the
      `StudentBaseline` when `distillation.scratch_baseline` is set, a
      `ModelBaseline` per `distillation.baselines` entry (`Baseline_<name>`), the
      `EnsembleStudent` with `distillation.method: m_on_m` (one student of
      all the teachers, the M-on-M ensemble's yardstick), with
      `noisy_student` the `StudentRound`s before the last, and the
      Distiller, always last.
    """
    teachers = [teacher]
    for i in range(1, config.distillation.num_teachers):
        seeded = dataclasses.replace(
            config, train=dataclasses.replace(config.train, seed=config.train.seed + i)
        )
        teachers.append(
            Trainer(
                config=seeded,
                examples=transform.outputs["transformed_examples"],
                transform_graph=transform.outputs["transform_graph"],
                schema=schema.outputs["schema"],
            ).with_id(teacher_id(i))
        )
    common = {
        "examples": transform.outputs["transformed_examples"],
        "transform_graph": transform.outputs["transform_graph"],
        "schema": schema.outputs["schema"],
    }
    models = [t.outputs["model"] for t in teachers]
    baselines = []
    if config.distillation.scratch_baseline:
        baselines.append(StudentBaseline(config=config, **common))
    for baseline in config.distillation.baselines:
        baselines.append(
            ModelBaseline(config=config, baseline=baseline, **common).with_id(
                baseline_id(baseline.name)
            )
        )
    if config.distillation.method == M_ON_M:
        baselines.append(EnsembleStudent(config=config, teacher_models=models, **common))
    if config.distillation.method != NOISY_STUDENT:
        return [
            *teachers[1:],
            *baselines,
            Distiller(config=config, teacher_models=models, **common),
        ]
    # Noisy Student: round k's student (seed train.seed + k) is round k + 1's teacher.
    # The students train with their own augmentation (`students_config`), the teachers with
    # `train.augmentation`.
    rounds = []
    settings = config.distillation.noisy_student
    students = config.students_config()
    train = students.train
    for k in range(1, settings.rounds + 1):
        seeded = dataclasses.replace(
            students, train=dataclasses.replace(train, seed=train.seed + k)
        )
        if k == settings.rounds:
            rounds.append(Distiller(config=seeded, teacher_models=models, **common))
        else:
            rounds.append(
                StudentRound(config=seeded, teacher_models=models, **common).with_id(round_id(k))
            )
        models = [rounds[-1].outputs["model"]]
    return [*teachers[1:], *baselines, *rounds]


def example_gen(config: PipelineConfig, data: ResolvedInput):
    """CSV or TFRecord ExampleGen: the data's own splits, or hash-bucketed train / eval.

    The executor drops `data.exclude`, writes each `column` under its
    feature's (or the label's) `name` and configured float columns as floats
    (see `components.example_gen`).
    """
    cls = CsvExampleGen if data.format == "csv" else ImportExampleGen
    common = {
        "input_base": data.input_base,
        "custom_config": ExampleRules.from_data(config.data).custom_config(),
    }
    if data.splits:
        input_config = example_gen_pb2.Input(
            splits=[
                example_gen_pb2.Input.Split(name=name, pattern=pattern)
                for name, pattern in data.splits
            ]
        )
        return cls(input_config=input_config, **common)
    input_config = example_gen_pb2.Input(
        splits=[example_gen_pb2.Input.Split(name="single_split", pattern=data.pattern)]
    )
    output_config = example_gen_pb2.Output(
        split_config=example_gen_pb2.SplitConfig(
            splits=[
                example_gen_pb2.SplitConfig.Split(
                    name="train", hash_buckets=config.data.train_buckets
                ),
                example_gen_pb2.SplitConfig.Split(
                    name="eval", hash_buckets=config.data.eval_buckets
                ),
            ]
        )
    )
    return cls(input_config=input_config, output_config=output_config, **common)


def data_checks(config: PipelineConfig, gen) -> list:
    """What checks the data before anything trains on it, in pipeline order.

    Returns:
      StatisticsGen, SchemaGen, ExampleValidator, the Resolver of the drift
      baseline (`latest_validated_schema`: the schema of the last run whose
      data passed the gate) and the DataGate (id `GATE_ID`) that reads them.
    """
    statistics = stock.StatisticsGen(examples=gen.outputs["examples"])
    schema = stock.SchemaGen(statistics=statistics.outputs["statistics"], infer_feature_shape=True)
    validator = stock.ExampleValidator(
        statistics=statistics.outputs["statistics"], schema=schema.outputs["schema"]
    )
    baseline_schema = Resolver(
        strategy_class=LatestArtifactStrategy,
        schema=channel.Channel(
            type=standard_artifacts.Schema,
            producer_component_id=GATE_ID,
            output_key=GATE_SCHEMA_KEY,
        ),
    ).with_id("latest_validated_schema")
    gate = DataGate(
        config=config,
        statistics=statistics.outputs["statistics"],
        schema=schema.outputs["schema"],
        anomalies=validator.outputs["anomalies"],
        baseline_schema=baseline_schema.outputs["schema"],
    ).with_id(GATE_ID)
    return [statistics, schema, validator, baseline_schema, gate]


def transform_after_gate(config: PipelineConfig, gen, schema, gate) -> Transform:
    """Transform of ExampleGen's examples, run once `gate` has passed them."""
    # StatisticsGen already describes the data and DataGate checks it; nothing
    # here reads Transform's own pre/post-transform statistics or its analyzer
    # cache, which cost a tiny run's Transform about a quarter of its time.
    transform = Transform(
        config=config,
        examples=gen.outputs["examples"],
        schema=schema.outputs["schema"],
        disable_statistics=True,
        disable_analyzer_cache=True,
    )
    # Ordering only (not data), so an unchanged run's Transform stays cached
    # even though the gate re-checks against a newer baseline every run.
    transform.add_upstream_node(gate)
    return transform


def served_model(gate_id: str) -> Resolver:
    """The Resolver of the served model: the latest model the served gate blessed.

    TFX's `LatestBlessedModelStrategy`, as in TFX's examples, with the
    blessing channel bound to the served gate's node (`gate_id`: the
    `Evaluator` without distillation, `SERVED_GATE_ID` with it), so a student
    the teacher gate blessed does not count as served. Empty on a pipeline's
    first run.
    """
    return Resolver(
        strategy_class=LatestBlessedModelStrategy,
        model=channel.Channel(type=standard_artifacts.Model),
        model_blessing=channel.Channel(
            type=standard_artifacts.ModelBlessing,
            producer_component_id=gate_id,
            output_key="blessing",
        ),
    ).with_id(SERVED_RESOLVER_ID)


def evaluate_and_push(
    config: PipelineConfig, gen, trainer, distill: list, serving_dir: str
) -> list:
    """The Evaluator(s) and the Pusher of the pipeline's candidate model.

    Args:
      config: The validated config.
      gen: ExampleGen (the Evaluators read its examples).
      trainer: The (first teacher) Trainer.
      distill: The distillation stage (`distillation_stage`), its last
        component the Distiller; [] without distillation.
      serving_dir: The Pusher's filesystem destination.

    Returns:
      The components after the models, the Pusher last. Without
      distillation the Trainer's model is the candidate: `[Evaluator,
      Pusher]`, judged by `eval_config`, or with `evaluation.against_served`
      `[served_model(...), Evaluator, Pusher]`, the Evaluator's baseline the
      served model (`served_eval_config`). With distillation the
      Distiller's student is, against the Trainer's model as baseline
      (`distillation_eval_config`); with `against_served` a second
      Evaluator (`SERVED_GATE_ID`) compares it with the served model and the
      Pusher needs both blessings.
    """
    distilled = config.distillation.enabled
    candidate = (distill[-1] if distilled else trainer).outputs["model"]

    def evaluator(baseline, evaluation):
        return stock.Evaluator(
            examples=gen.outputs["examples"],
            model=candidate,
            baseline_model=baseline,
            eval_config=evaluation,
        )

    against_served = config.evaluation.against_served
    served_gate = None
    if not distilled:
        served = served_model(EVALUATOR_ID) if against_served else None
        gate = (
            evaluator(served.outputs["model"], served_eval_config(config))
            if served
            else evaluator(None, eval_config(config))
        )
    else:
        gate = evaluator(trainer.outputs["model"], distillation_eval_config(config))
        served = served_model(SERVED_GATE_ID) if against_served else None
        if served:
            served_gate = evaluator(served.outputs["model"], served_eval_config(config)).with_id(
                SERVED_GATE_ID
            )
    pusher = Pusher(
        model=candidate,
        model_blessing=gate.outputs["blessing"],
        served_blessing=served_gate.outputs["blessing"] if served_gate else None,
        push_destination=pusher_pb2.PushDestination(
            filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=serving_dir)
        ),
    )
    return [c for c in (served, gate, served_gate, pusher) if c is not None]


def create_pipeline(
    config: PipelineConfig,
    data: ResolvedInput,
    paths: PipelinePaths,
    beam_pipeline_args: list[str] | None = None,
    enable_cache: bool = True,
) -> tfx_pipeline.Pipeline:
    """Builds the pipeline for a validated config.

    ExampleGen, the data checks (`data_checks`), Transform once the gate has
    passed (`transform_after_gate`), the Trainer, the distillation stage
    when `distillation.enabled` (`distillation_stage`), then the Evaluator
    and the Pusher, behind the served model's Resolver when
    `evaluation.against_served` (`evaluate_and_push`).

    Args:
      config: A validated `PipelineConfig`.
      data: The ExampleGen input (see `components.data.sources.resolve_input`).
      paths: Pipeline root, push destination and metadata location.
      beam_pipeline_args: Beam args for Beam-based components.
      enable_cache: Reuse outputs of executions with unchanged inputs.

    Raises:
      ConfigError: naming `data` for a config without a data section.
    """
    config.require_data("the tfxkit pipeline")
    gen = example_gen(config, data)
    checks = data_checks(config, gen)
    _, schema, _, _, gate = checks
    transform = transform_after_gate(config, gen, schema, gate)
    trainer = Trainer(
        config=config,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        schema=schema.outputs["schema"],
    )
    distill = []
    if config.distillation.enabled:
        distill = distillation_stage(config, transform, schema, trainer)
    metadata = (
        tfx_metadata.sqlite_metadata_connection_config(paths.metadata_path)
        if paths.metadata_path
        else None
    )
    return tfx_pipeline.Pipeline(
        pipeline_name=config.name,
        pipeline_root=paths.pipeline_root,
        components=[
            gen,
            *checks,
            transform,
            trainer,
            *distill,
            *evaluate_and_push(config, gen, trainer, distill, paths.serving_dir),
        ],
        enable_cache=enable_cache,
        metadata_connection_config=metadata,
        beam_pipeline_args=list(
            beam_pipeline_args if beam_pipeline_args is not None else config.beam_args
        ),
    )
