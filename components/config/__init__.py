"""Typed, validated pipeline configuration.

One module per section (`data`, `runtime`, `training`, `distillation`, `evaluation`,
`kubeflow`, `pipeline`), plus `loading` (YAML, plain data, JSON Schema), `dropin`,
`secret_scan` and `validation`; this package re-exports their public names.
"""

from components.config.data import (
    BUILTIN_DATASETS,
    CategoricalTransform,
    DataConfig,
    FeatureConfig,
    FeatureKind,
    FloatTransform,
    LabelConfig,
)
from components.config.distillation import (
    MAX_TEACHERS,
    DistillationConfig,
)
from components.config.dropin import DropInSettings
from components.config.evaluation import (
    EvaluationConfig,
)
from components.config.kubeflow import (
    KubeflowConfig,
    Placement,
    Toleration,
)
from components.config.loading import (
    from_dict,
    json_schema,
    load_config,
    load_config_file,
    module_config_from_dict,
    to_dict,
)
from components.config.pipeline import (
    PipelineConfig,
)
from components.config.runtime import (
    IngestionConfig,
    StrategyConfig,
    StrategyKind,
    TransformConfig,
)
from components.config.secret_scan import reject_secret
from components.config.training import (
    AugmentationConfig,
    ConvTowerConfig,
    ModelConfig,
    TrainConfig,
)
from components.config.validation import ConfigError

__all__ = [
    "DropInSettings",
    "BUILTIN_DATASETS",
    "MAX_TEACHERS",
    "AugmentationConfig",
    "CategoricalTransform",
    "ConfigError",
    "ConvTowerConfig",
    "DataConfig",
    "DistillationConfig",
    "EvaluationConfig",
    "FeatureConfig",
    "FeatureKind",
    "FloatTransform",
    "IngestionConfig",
    "KubeflowConfig",
    "LabelConfig",
    "ModelConfig",
    "PipelineConfig",
    "Placement",
    "StrategyConfig",
    "StrategyKind",
    "Toleration",
    "TrainConfig",
    "TransformConfig",
    "from_dict",
    "json_schema",
    "load_config",
    "load_config_file",
    "module_config_from_dict",
    "reject_secret",
    "to_dict",
]
