"""What the teacher's and the student's module files share, as a TFX user would factor it.

tf.keras only (tf_keras under TFX), no tfxkit import: the stock-compatible
input (`fn_args.data_accessor.tf_dataset_factory`), labeled examples only
(label >= 0), optional translate / flip augmentation, Adam under a cosine
schedule, and a serving signature over raw tf.Examples.
"""

import tensorflow as tf
from tfx_bsl.public import tfxio

IMAGE = "image_xf"
LABEL = "label"
BATCH = 128
LEARNING_RATE = 1e-3


def conv_net(filters, convs_per_block, head, name):
    """3x3 'same' convolutions, each block ending in 2x2 max pooling; a dense head; logits out."""
    inputs = tf.keras.layers.Input(shape=(28, 28, 1), name=IMAGE)
    x = inputs
    for width in filters:
        for _ in range(convs_per_block):
            x = tf.keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
        x = tf.keras.layers.MaxPool2D()(x)
    x = tf.keras.layers.Dense(head, activation="relu")(tf.keras.layers.Flatten()(x))
    return tf.keras.Model({IMAGE: inputs}, tf.keras.layers.Dense(10)(x), name=name)


def augment(features, label, seed):
    """Random shifts of up to 2 pixels and horizontal mirrors, per image."""
    images = features[IMAGE]
    padded = tf.pad(images, [[0, 0], [2, 2], [2, 2], [0, 0]])
    seeds = tf.random.experimental.stateless_split(seed, 2)
    shifted = tf.map_fn(
        lambda x: tf.image.stateless_random_crop(x[0], [28, 28, 1], seed=tf.cast(x[1], tf.int32)),
        (padded, tf.random.experimental.stateless_split(seeds[0], tf.shape(images)[0])),
        fn_output_signature=tf.float32,
    )
    flip = tf.random.stateless_uniform([tf.shape(images)[0], 1, 1, 1], seed=seeds[1]) < 0.5
    return {IMAGE: tf.where(flip, tf.image.flip_left_right(shifted), shifted)}, label


def dataset(fn_args, files, tft_output, training, augmented=False, seed=0):
    data = fn_args.data_accessor.tf_dataset_factory(
        files,
        tfxio.TensorFlowDatasetOptions(batch_size=BATCH, label_key=LABEL, shuffle_seed=seed),
        tft_output.transformed_metadata.schema,
    )
    data = data.map(lambda f, y: ({IMAGE: f[IMAGE]}, y))
    if training:
        # Only labeled images train a model on its own: the transfer set has label -1.
        data = (
            data.unbatch()
            .filter(lambda f, y: tf.reshape(y, []) >= 0)
            .batch(BATCH, drop_remainder=True)
        )
        if augmented:
            data = data.enumerate().map(
                lambda i, batch: augment(*batch, tf.stack([tf.constant(seed, tf.int64), i])),
                num_parallel_calls=tf.data.AUTOTUNE,
            )
    return data.prefetch(tf.data.AUTOTUNE)


def optimizer(steps):
    return tf.keras.optimizers.Adam(tf.keras.optimizers.schedules.CosineDecay(LEARNING_RATE, steps))


def train_and_save(fn_args, model, augmented, seed):
    import tensorflow_transform as tft

    tft_output = tft.TFTransformOutput(fn_args.transform_output)
    model.compile(
        optimizer=optimizer(fn_args.train_steps),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(
        dataset(fn_args, fn_args.train_files, tft_output, True, augmented, seed),
        steps_per_epoch=fn_args.train_steps,
        validation_data=dataset(fn_args, fn_args.eval_files, tft_output, False),
        validation_steps=fn_args.eval_steps,
        verbose=2,
    )
    model.tft_layer = tft_output.transform_features_layer()
    raw_spec = tft_output.raw_feature_spec()
    raw_spec.pop(LABEL)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(examples):
        transformed = model.tft_layer(tf.io.parse_example(examples, raw_spec))
        return {"outputs": model({IMAGE: transformed[IMAGE]})}

    model.save(fn_args.serving_model_dir, save_format="tf", signatures={"serving_default": serve})
