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


def write_transformed_files(
    directory: str,
    spec: dict,
    record_batches,
    *,
    num_shards: int,
    compression: str,
    pack: bool,
):
    """Encodes Arrow record batches as the tfxkit Transform does, round-robin into shards.

    The Transform writer's own `EncodeExamplesFn` and `CodebooksFn`, without a Beam
    runner, and the layout record it would write: the real record format, fast.

    Args:
      directory: Gets `Split-train/transformed_examples-*` and a `staging` directory.
      spec: The transformed feature spec.
      record_batches: `pa.RecordBatch`es of the spec's features.
      num_shards / compression / pack: As `transform.num_shards`, `compression`, `pack_features`.

    Returns:
      `(shard paths, layout.Layout)`.
    """
    import tensorflow as tf
    from tensorflow_transform.tf_metadata import schema_utils

    from components.data import layout, writer

    settings = writer.OutputSettings(
        num_shards, compression, pack, os.path.join(directory, "staging")
    )
    schema = schema_utils.schema_from_feature_spec(spec)
    packing = writer.plan_packing(schema, settings)
    encoder = writer.EncodeExamplesFn(schema, packing)
    prefix = os.path.join(directory, "Split-train", "transformed_examples")
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    paths = [f"{prefix}-{i:05d}-of-{num_shards:05d}{settings.suffix}" for i in range(num_shards)]
    options = tf.io.TFRecordOptions(compression_type=layout.compression_type(compression))
    writers = [tf.io.TFRecordWriter(p, options) for p in paths]
    books = writer.CodebooksFn(writer.coded_features(schema))
    accumulator = books.create_accumulator()
    i = 0
    for batch in record_batches:
        accumulator = books.add_input(accumulator, (batch, None))
        for record in encoder.encode(batch):
            writers[i % num_shards].write(record)
            i += 1
    for w in writers:
        w.close()
    staged = {
        prefix: {
            "output_path": prefix,
            "packing": layout.packing_to_json(packing),
            "shards": [writer.describe_shard(p, compression) for p in paths],
            "codebooks": books.extract_output(accumulator),
        }
    }
    return paths, writer.build_layout(staged, {prefix: "train"}, spec, settings)
