"""The data layer: raw input, built-in datasets, the Transform -> Trainer layout,
stored input, tf.data ingestion, augmentation and label masks. No TFX types."""

# What `components.data` held when it was one module, and where it lives now.
_MOVED = {
    name: "components.data.sources"
    for name in (
        "DataError",
        "ResolvedInput",
        "check_data_path",
        "check_input",
        "resolve_input",
        "taxi_csv_path",
        "write_digits",
        "write_fashion_mnist",
        "FASHION_MNIST_SPLITS",
    )
}


def __getattr__(name: str):
    if name in _MOVED:
        raise ImportError(f"components.data.{name} moved to {_MOVED[name]}.{name}")
    raise AttributeError(f"module 'components.data' has no attribute {name!r}")
