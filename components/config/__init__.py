"""Typed, validated pipeline configuration.

One module per section (`data`, `runtime`, `training`, `distillation`, `evaluation`,
`kubeflow`, `pipeline`), plus `loading` (YAML, plain data, JSON Schema), `dropin`,
`secret_scan` and `validation`; this package re-exports their public names,
importing a section on first use (so `config.accelerators` stays light)."""

from __future__ import annotations

from components.compat import lazy

# Public name -> the section module that defines it.
_EXPORTS = {
    "BUILTIN_DATASETS": "components.config.data",
    "CategoricalTransform": "components.config.data",
    "DataConfig": "components.config.data",
    "FeatureConfig": "components.config.data",
    "FeatureKind": "components.config.data",
    "FloatTransform": "components.config.data",
    "LabelConfig": "components.config.data",
    "DistillationConfig": "components.config.distillation",
    "MAX_TEACHERS": "components.config.distillation",
    "M_ON_M": "components.config.distillation",
    "NOISY_STUDENT": "components.config.distillation",
    "NoisyStudentConfig": "components.config.distillation",
    "DropInSettings": "components.config.dropin",
    "EvaluationConfig": "components.config.evaluation",
    "KubeflowConfig": "components.config.kubeflow",
    "Placement": "components.config.kubeflow",
    "Toleration": "components.config.kubeflow",
    "from_dict": "components.config.loading",
    "json_schema": "components.config.loading",
    "load_config_file": "components.config.loading",
    "module_config_from_dict": "components.config.loading",
    "read_yaml": "components.config.loading",
    "to_dict": "components.config.loading",
    "PipelineConfig": "components.config.pipeline",
    "ConfigWarning": "components.config.runtime",
    "IngestionConfig": "components.config.runtime",
    "ServiceConfig": "components.config.runtime",
    "StrategyConfig": "components.config.runtime",
    "StrategyKind": "components.config.runtime",
    "TransformConfig": "components.config.runtime",
    "reject_secret": "components.config.secret_scan",
    "AugmentationConfig": "components.config.training",
    "ConvTowerConfig": "components.config.training",
    "ModelConfig": "components.config.training",
    "TrainConfig": "components.config.training",
    "ConfigError": "components.config.validation",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy.exports(__name__, globals(), _EXPORTS)
