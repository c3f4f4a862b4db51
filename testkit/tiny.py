"""Tiny runs: a shipped pipeline with step counts small enough for tests.

Shared by the tests (`tests/conftest.py` and the end-to-end modules) and the
benchmarks that run the same tiny pipeline (`benchmarks/reliability.py`).
"""

from __future__ import annotations

import dataclasses

from components.config import PipelineConfig


def tiny(config: PipelineConfig, **train_overrides) -> PipelineConfig:
    """The same pipeline with step counts small enough for tests."""
    train = dataclasses.replace(
        config.train,
        train_steps=20,
        eval_steps=2,
        steps_per_epoch=10,
        checkpoint_every_steps=10,
        warmup_steps=min(config.train.warmup_steps, 5),
        **train_overrides,
    )
    # Thresholds any model passes: a tiny run tests the plumbing, not quality.
    # A run again on a copy of a pushed run is compared with that run's model
    # (evaluation.against_served) and must still push.
    evaluation = dataclasses.replace(
        config.evaluation, min_accuracy=0.0, max_accuracy_drop=1.0, change_threshold=1.0
    )
    # A patient student stays patient: twice the teacher's tiny step count.
    student_steps = 40 if config.distillation.student_train_steps else 0
    # The scratch baseline and other baselines are one more Trainer each per
    # run: the tests that check them turn them back on.
    distillation = dataclasses.replace(
        config.distillation,
        student_train_steps=student_steps,
        scratch_baseline=False,
        baselines=(),
    )
    return dataclasses.replace(
        config, train=train, evaluation=evaluation, distillation=distillation
    )
