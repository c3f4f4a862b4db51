"""The distillation layer: losses, the Keras distiller model, teachers and students.
No TFX types."""
