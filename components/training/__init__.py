"""The training layer: cluster and strategies, the one training `Task`, models,
inputs, fit and export. No TFX types."""
