"""Real TFT on rows held in memory, written as a Transform writes its graph (tests, benchmarks)."""

from __future__ import annotations

import os


def analyze_and_transform(instances: list[dict], spec: dict, config, out_dir: str):
    """Runs the config's generated `preprocessing_fn` over `instances` with TFT's Beam API.

    Args:
      instances: Raw examples as `{feature: [values]}`.
      spec: Their raw feature spec.
      config: The `PipelineConfig` whose `preprocessing_fn` runs.
      out_dir: The transform graph and raw metadata go to `out_dir/transform_graph`.

    Returns:
      `(transformed instances, an ExampleProtoCoder for them, the transform graph dir)`.
    """
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam
    from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io, schema_utils

    from components.data.preprocessing import build_preprocessing_fn

    raw_metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(spec))
    transform_output = os.path.join(out_dir, "transform_graph")
    with tft_beam.Context(temp_dir=os.path.join(out_dir, "tft_tmp"), force_tf_compat_v1=False):
        (transformed, transformed_metadata), transform_fn = (
            instances,
            raw_metadata,
        ) | tft_beam.AnalyzeAndTransformDataset(
            build_preprocessing_fn(config), output_record_batches=False
        )
        _ = transform_fn | tft_beam.WriteTransformFn(transform_output)
    metadata_io.write_metadata(
        raw_metadata, os.path.join(transform_output, tft.TFTransformOutput.RAW_METADATA_DIR)
    )
    return transformed, tft.coders.ExampleProtoCoder(transformed_metadata.schema), transform_output
