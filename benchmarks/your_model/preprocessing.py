"""Fashion-MNIST preprocessing_fn, as a TFX user writes it (tf only).

Raw examples: `image` (784 int64 pixels), `label` (class id; -1 for an
image of the unlabeled transfer set). Transformed: `image_xf` (28x28x1 in
[0, 1]) and `label` as it is.
"""

import tensorflow as tf


def preprocessing_fn(inputs):
    image = tf.cast(inputs["image"], tf.float32) / 255.0
    return {"image_xf": tf.reshape(image, [-1, 28, 28, 1]), "label": inputs["label"]}
