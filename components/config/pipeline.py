"""The whole configuration: `PipelineConfig`, its cross-section rules and its JSON form.

Nested frozen dataclasses, every section validated when constructed (`dataclasses.replace`
included); every error is a `ConfigError` whose message starts with the field's dotted path.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import field
from typing import Self

from pydantic import model_validator

from components.config.data import BUILTIN_DATASETS, DataConfig
from components.config.distillation import (
    M_ON_M,
    NOISY_STUDENT,
    BaselineConfig,
    DistillationConfig,
)
from components.config.evaluation import EvaluationConfig
from components.config.kubeflow import KubeflowConfig
from components.config.runtime import (
    IngestionConfig,
    StrategyConfig,
    TransformConfig,
    check_service,
)
from components.config.secret_scan import reject_secrets
from components.config.training import (
    AugmentationConfig,
    ModelConfig,
    TrainConfig,
    min_trainable_params,
)
from components.config.validation import ConfigError, fail, from_plain, section, to_plain


@section()
class PipelineConfig:
    """The whole pipeline.

    Attributes:
      name: Pipeline name (ML Metadata context, push sub-directory).
      data: The data section. Required in a config file and wherever the
        product's own model, preprocessing or pipeline runs (`require_data`);
        left out (None) only by a config for a user's own module file
        (Trainer / Transform `config=`, docs/bring-your-own-pipeline.md).
      transform, ingestion, strategy, train, teacher, student, distillation,
      evaluation, kubeflow: the sections above.
      beam_args: Beam pipeline args for local runs. Empty (the default):
        Beam's DirectRunner defaults, in memory on one worker; TFX then
        also skips building a source package of itself for Beam to stage,
        which only remote runners need (about 1.3 s per Beam component).
    """

    name: str = "tfxkit"
    data: DataConfig | None = None
    transform: TransformConfig = field(default_factory=TransformConfig)
    ingestion: IngestionConfig = field(default_factory=IngestionConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    teacher: ModelConfig = field(default_factory=ModelConfig)
    student: ModelConfig = field(
        default_factory=lambda: ModelConfig(hidden_units=(16,), embedding_dim=2)
    )
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    kubeflow: KubeflowConfig = field(default_factory=KubeflowConfig)
    beam_args: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", self.name):
            fail("name", f"expected letters, digits, '_' or '-', got {self.name!r}")
        # Without a data section (a user's own module) the rules that read
        # the features have nothing to check: that config trains no tfxkit model.
        has_data = self.data is not None
        images = [f.name for f in self.data.features if f.shape] if has_data else []
        for role in ("teacher", "student"):
            if has_data and getattr(self, role).conv is not None and not images:
                fail(
                    f"{role}.conv",
                    "a conv tower needs an image-shaped feature: give a float feature a shape such as [28, 28, 1]",
                )
        for role in ("teacher", "student"):
            conv = getattr(self, role).conv
            if conv is not None and conv.residual and self.train.gradient_checkpointing:
                fail(
                    f"{role}.conv.residual",
                    "train.gradient_checkpointing recomputes whole conv blocks, which have no residual "
                    "branches; turn one of them off",
                )
        student_steps = self.student_train_steps()
        if self.distillation.enabled and self.train.warmup_steps >= student_steps:
            fail(
                "distillation.student_train_steps",
                f"expected more steps than train.warmup_steps ({self.train.warmup_steps}), got {student_steps}",
            )
        if self.train.augmentation.enabled and self.distillation.cache_teacher_logits:
            fail(
                "distillation.cache_teacher_logits",
                "the cache keys soft targets by example, and with train.augmentation every view is a new "
                "example (the cache would grow without bound and never hit); turn one of them off",
            )
        if has_data and self.train.augmentation.image_views and not images:
            fail(
                "train.augmentation",
                "augmentation shifts and flips images: no feature has a shape (e.g. [28, 28, 1]); turn it off or declare the shape",
            )
        if (
            has_data
            and self.train.augmentation.input_noise
            and not any(not f.is_categorical and not f.shape for f in self.data.features)
        ):
            fail(
                "train.augmentation.input_noise",
                "input noise perturbs tabular float features (float, no image shape), and there is "
                "none; set input_noise: 0 (images get translate / flip)",
            )
        if (
            has_data
            and self.train.augmentation.mixup
            and all(f.is_categorical for f in self.data.features)
        ):
            fail(
                "train.augmentation.mixup",
                "mixup mixes float (dense) features, and every feature is categorical "
                "(integer ids, bucketized floats included); set mixup: 0",
            )
        noisy = self.distillation.method == NOISY_STUDENT
        if (
            has_data
            and self.distillation.enabled
            and self.distillation.require_compression
            and not noisy
        ):
            self._check_student_is_smaller()
        if has_data and self.distillation.enabled and noisy:
            self._check_noisy_student()
        check_service(self.ingestion, self.strategy, self.train.augmentation.image_views)
        if (
            has_data
            and self.ingestion.service.remote == "augment"
            and self.ingestion.service.enabled
            and self.data.labeled_fraction < 1.0
        ):
            fail(
                "ingestion.service.remote",
                "'augment' makes the image views on the service's workers, but data.labeled_fraction "
                f"{self.data.labeled_fraction} picks the labeled examples by their stored pixels, which the "
                "views change; set remote: parse (views on this host) or labeled_fraction: 1",
            )
        for i, baseline in enumerate(self.distillation.baselines):
            # Each baseline trains as a config of its own: every rule of this
            # one applies to its model and augmentation too.
            try:
                self.alone_config(baseline)
            except ConfigError as e:
                fail(
                    f"distillation.baselines[{i}]",
                    f"baseline {baseline.name!r} is refused as the config it trains with (its model "
                    f"is that config's teacher): {e}",
                )
        reject_secrets(self)
        return self

    def alone_config(self, baseline: BaselineConfig | None = None) -> PipelineConfig:
        """The config a model trained alone beside the Distiller trains with.

        The `student` network (or `baseline`'s model), hard labels only, the
        student's steps and schedule, and `train.augmentation` (or
        `baseline`'s). It trains one model, so its distillation stage is off
        (the student-smaller-than-teacher rule does not apply to it), and
        it caches no teacher targets.

        Raises:
          ConfigError: when that config breaks a rule (naming the field in it).
        """
        model = baseline.model if baseline and baseline.model else self.student
        augmentation = (
            baseline.augmentation if baseline and baseline.augmentation else self.train.augmentation
        )
        return dataclasses.replace(
            self,
            teacher=model,
            train=dataclasses.replace(
                self.train, train_steps=self.student_train_steps(), augmentation=augmentation
            ),
            distillation=dataclasses.replace(
                self.distillation,
                enabled=False,
                scratch_baseline=False,
                baselines=(),
                cache_teacher_logits=False,
            ),
        )

    def students_config(self) -> PipelineConfig:
        """The config the Noisy Student rounds' students train with.

        This config with `train.augmentation` replaced by
        `noisy_student.student_augmentation` when that is set (the field then
        consumed: None in the result), or by no augmentation with
        `augment_students: false`; the teacher Trainers keep this config's.

        Raises:
          ConfigError: when that config breaks a rule (naming the field in it).
        """
        settings = self.distillation.noisy_student
        if settings.student_augmentation is not None:
            augmentation = settings.student_augmentation
        elif not settings.augment_students:
            augmentation = AugmentationConfig()
        else:
            return self
        return dataclasses.replace(
            self,
            train=dataclasses.replace(self.train, augmentation=augmentation),
            distillation=dataclasses.replace(
                self.distillation,
                noisy_student=dataclasses.replace(settings, student_augmentation=None),
            ),
        )

    def _check_noisy_student(self) -> None:
        if self.distillation.noisy_student.student_augmentation is not None:
            try:
                self.students_config()
            except ConfigError as e:
                fail(
                    "distillation.noisy_student.student_augmentation",
                    f"the rounds' students train with it, and the config they train with is "
                    f"refused: {e}",
                )
        if self.data.labeled_fraction >= 1.0:
            fail(
                "data.labeled_fraction",
                "method noisy_student learns from unlabeled examples, and with labeled_fraction 1 every "
                "training example keeps its label; set labeled_fraction below 1 (the rest become the "
                "unlabeled set) or method: kd",
            )
        if (
            self.distillation.noisy_student.pseudo_labels == "soft"
            and self.train.augmentation.mixup
        ):
            fail(
                "distillation.noisy_student.pseudo_labels",
                "soft pseudo-labels are class distributions, and mixup mixes integer labels; set "
                "pseudo_labels: hard or train.augmentation.mixup: 0",
            )

    def _check_student_is_smaller(self) -> None:
        # Both models embed the same categoricals; vocabularies only add
        # `embedding_dim` parameters per id. With the student's embeddings at
        # least as wide, a student no smaller at the fewest ids is no smaller
        # for any data. Other cases depend on the vocabularies: the Distiller
        # checks them with the real sizes before training.
        # M-on-M serves one student per teacher: the served ensemble is what must be smaller.
        served = self.distillation.num_teachers if self.distillation.method == M_ON_M else 1
        student = served * min_trainable_params(self.data, self.student)
        teacher = min_trainable_params(self.data, self.teacher)
        if self.student.embedding_dim >= self.teacher.embedding_dim and student >= teacher:
            what = (
                f"the {served} students of method m_on_m (served together) have"
                if served > 1
                else "the student has"
            )
            fail(
                "student",
                f"{what} at least {student} trainable parameters, not fewer than the teacher's {teacher} "
                "(whatever the vocabulary sizes), and distillation.require_compression is true; shrink "
                "student.hidden_units / student.embedding_dim or set distillation.require_compression: false",
            )

    def require_data(self, what: str) -> DataConfig:
        """The data section, which `what` (e.g. "the generated preprocessing_fn") needs.

        Raises:
          ConfigError: naming `data` when this config has none.
        """
        if self.data is None:
            raise ConfigError(
                f"data: {what} needs the data section: set exactly one of 'builtin' "
                f"({', '.join(BUILTIN_DATASETS)}) or 'path' (your CSV/TFRecord files) and the features; "
                "a config without one serves only your own module (module_file, run_fn or preprocessing_fn)"
            )
        return self.data

    def student_train_steps(self) -> int:
        """Optimizer steps of the student: `distillation.student_train_steps`, else `train.train_steps`.

        The Distiller, the scratch baseline (the student's shape trained alone
        for the same steps) and the config's own checks all read it here.
        """
        return self.distillation.student_train_steps or self.train.train_steps

    def transform_view(self) -> PipelineConfig:
        """This config with only what Transform reads; every other section at its default.

        Transform reads `data`, `transform` and `strategy` (the worker count
        sets the shard count). The rest is reset so that it does not enter
        Transform's execution properties: changing, say, `train.train_steps`
        re-runs the Trainer and reuses the cached Transform output.
        """
        return type(self)(
            name=self.name,
            data=self.data,
            transform=self.transform,
            strategy=self.strategy,
        )

    def to_json(self) -> str:
        """The config as JSON (sorted keys), as it travels in `custom_config`."""
        return json.dumps(to_plain(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PipelineConfig:
        """Parses and validates the JSON of `to_json`."""
        return from_plain(cls, json.loads(text))
