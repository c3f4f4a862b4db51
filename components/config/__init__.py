"""Typed, validated pipeline configuration.

- `sections`: the config sections (fields, defaults, docs, rules); read this
  to write a config.
- `loading`: YAML / plain data to a validated config, and the JSON Schema
  (`components.payload` carries it in `custom_config`).
- `secret_scan`: rejects values that look like credentials.
- `validation`: how sections validate and how errors name the field path.
"""

from components.config.loading import (
    from_dict,
    json_schema,
    load_config_file,
    to_dict,
)
from components.config.secret_scan import reject_secret
from components.config.sections import (
    BUILTIN_DATASETS,
    MAX_TEACHERS,
    AugmentationConfig,
    CategoricalTransform,
    ConvTowerConfig,
    DataConfig,
    DistillationConfig,
    EvaluationConfig,
    FeatureConfig,
    FeatureKind,
    FloatTransform,
    IngestionConfig,
    KubeflowConfig,
    LabelConfig,
    ModelConfig,
    PipelineConfig,
    Placement,
    StrategyConfig,
    StrategyKind,
    Toleration,
    TrainConfig,
    TransformConfig,
)
from components.config.validation import ConfigError

__all__ = [
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
    "load_config_file",
    "reject_secret",
    "to_dict",
]
