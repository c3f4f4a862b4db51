"""Kubeflow / Kubernetes side of tfxkit.

`placement` renders a config `Placement` to Kubernetes and KFP forms (the
one rendering the compiler and the training jobs share), `env` declares the
environment variables between the compiled pipeline and the job replicas,
`tfjob` runs multi-worker training as a TFJob, and `submit` uploads a
compiled pipeline. Nothing is imported here: importing `env` (as
`components.training.cluster` does) must not pull in TensorFlow or the job code.
"""
