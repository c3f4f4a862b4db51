"""Patches of TF, TFX and Beam internals, each with its reason."""
