"""The data layer: raw input, built-in datasets, the Transform -> Trainer layout,
stored input, tf.data ingestion, augmentation and label masks. No TFX types."""
