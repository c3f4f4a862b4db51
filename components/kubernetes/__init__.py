"""Kubeflow / Kubernetes side of tfxkit: placement, job backends, their environment, submit.

Nothing is imported here: importing `env` (as `components.training.cluster` does) must
not pull in TensorFlow or the job code.
"""
