"""The distillation layer: losses, the Keras distiller model, teachers and students.
No TFX types."""

# What `components.distillation` held when it was one module, and where it lives now.
_MOVED = {
    "Distiller": "components.distillation.model",
    "count_params": "components.distillation.model",
    "DistillationLosses": "components.distillation.losses",
    "check_hyperparameters": "components.distillation.losses",
    "normalized_weights": "components.distillation.losses",
    "soft_targets": "components.distillation.losses",
    "distillation_losses": "components.distillation.losses",
    "UNLABELED": "components.data.labels",
    "labeled_mask": "components.data.labels",
    "feature_fingerprints": "components.data.labels",
}


def __getattr__(name: str):
    if name in _MOVED:
        raise ImportError(f"components.distillation.{name} moved to {_MOVED[name]}.{name}")
    raise AttributeError(f"module 'components.distillation' has no attribute {name!r}")
