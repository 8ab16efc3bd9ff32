"""The serving signature: raw image bytes in, class probabilities and names out.

Exported models take what clients have: the bytes of JPEG (or PNG) files. The signature runs
`preprocess.eval_image`, the same centre crop evaluation uses, never the training
augmentation, so served predictions match evaluated ones. With TF Serving's REST API:

    POST /v1/models/NAME:predict  {"instances": [{"b64": "<base64 of a JPEG>"}]}

Guards: bytes that are not a JPEG or PNG, and images whose declared size exceeds a pixel cap
(read from the header, before anything is decoded), fail the request with a clear error
instead of exhausting the server's memory.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfrecord_pipe.reading import preprocess

INPUT_NAME = "image_bytes"
SIGNATURE = "serving_default"
# Per request image. A 40-megapixel photo decodes to 120 MB; far larger images are attacks or
# mistakes. Lower than the converter's cap (`core.images.DEFAULT_MAX_PIXELS`): a server decodes
# many requests at once.
DEFAULT_MAX_REQUEST_PIXELS = 40_000_000
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    """How the exported signature turns bytes into the model's input and back into answers.

    Attributes:
      labels: label texts in index order (the dataset's labels.txt / manifest labels).
      image_size: side of the model's square input; the same as the reader's.
      dtype: the model's input dtype, as the reader's `dtype` ("float32", "bfloat16", "uint8").
      from_logits: the model outputs logits (softmax is applied); False: probabilities.
      max_pixels: images declaring more pixels than this are refused before decoding.
    """

    labels: tuple[str, ...]
    image_size: int = 224
    dtype: str = "float32"
    from_logits: bool = True
    max_pixels: int = DEFAULT_MAX_REQUEST_PIXELS

    def __post_init__(self):
        problems = []
        if not self.labels:
            problems.append("labels is empty")
        if self.image_size < 1:
            problems.append(f"image_size must be >= 1, got {self.image_size}")
        if preprocess.dtype_problem(self.dtype):
            problems.append(preprocess.dtype_problem(self.dtype))
        if self.max_pixels < 1:
            problems.append(f"max_pixels must be >= 1, got {self.max_pixels}")
        if problems:
            raise ValueError("Invalid ServingConfig: " + "; ".join(problems))


class ServingModule(tf.Module):
    """A Keras model with the bytes-in signature; what `export` saves."""

    def __init__(self, model: tf.keras.Model, config: ServingConfig):
        super().__init__()
        self.model = model
        self._config = config
        self._labels = tf.constant(config.labels)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_NAME)])
    def serve(self, image_bytes):
        """{"probabilities": [N, C] float32, "classid": [N] int64, "class": [N] string}."""
        config = self._config
        images = tf.map_fn(
            lambda encoded: image_from_bytes(encoded, config),
            image_bytes,
            fn_output_signature=tf.TensorSpec(
                [config.image_size, config.image_size, 3], tf.as_dtype(config.dtype)
            ),
        )
        outputs = tf.cast(self.model(images, training=False), tf.float32)
        probabilities = tf.nn.softmax(outputs) if config.from_logits else outputs
        classid = tf.argmax(probabilities, axis=-1)
        return {
            "probabilities": probabilities,
            "classid": classid,
            "class": tf.gather(self._labels, classid),
        }


def image_from_bytes(encoded: tf.Tensor, config: ServingConfig) -> tf.Tensor:
    """One request image: checked, then the evaluation crop of `preprocess`."""
    is_jpeg = tf.io.is_jpeg(encoded)
    is_png = tf.equal(tf.strings.substr(encoded, 0, len(_PNG_MAGIC)), _PNG_MAGIC)
    known = tf.debugging.Assert(
        tf.logical_or(is_jpeg, is_png),
        [f"{INPUT_NAME}: an input is not a JPEG or PNG image (first bytes:",
         tf.strings.substr(encoded, 0, 8), ")"],
    )  # fmt: skip
    with tf.control_dependencies([known]):
        height, width = tf.cond(is_jpeg, lambda: _jpeg_size(encoded), lambda: _png_size(encoded))
    pixels = tf.cast(height, tf.int64) * tf.cast(width, tf.int64)
    small_enough = tf.debugging.Assert(
        pixels <= config.max_pixels,
        [f"{INPUT_NAME}: an image declares", height, "x", width,
         f"pixels, more than the cap of {config.max_pixels}; send a smaller image"],
    )  # fmt: skip
    with tf.control_dependencies([small_enough]):
        return tf.cond(
            is_jpeg,
            lambda: preprocess.eval_image(encoded, config.image_size, config.dtype),
            lambda: preprocess.eval_pixels(
                tf.io.decode_png(encoded, channels=3), config.image_size, config.dtype
            ),
        )


def _jpeg_size(encoded):
    shape = tf.image.extract_jpeg_shape(encoded)
    return shape[0], shape[1]


def _png_size(encoded):
    """Height and width from the PNG header (IHDR), without decoding."""
    header = tf.io.decode_raw(tf.strings.substr(encoded, 16, 8), tf.uint8)
    complete = tf.debugging.Assert(
        tf.equal(tf.size(header), 8), [f"{INPUT_NAME}: a PNG input is cut short"]
    )
    with tf.control_dependencies([complete]):
        big_endian = tf.cast(header, tf.int32) * tf.constant([1 << 24, 1 << 16, 1 << 8, 1] * 2)
    width = tf.reduce_sum(big_endian[:4])
    height = tf.reduce_sum(big_endian[4:])
    return height, width


def export(model: tf.keras.Model, export_dir: str, config: ServingConfig) -> str:
    """Saves `model` as a SavedModel whose `serving_default` takes `image_bytes`.

    Returns:
      export_dir, for chaining.
    """
    module = ServingModule(model, config)
    tf.saved_model.save(module, export_dir, signatures={SIGNATURE: module.serve})
    return export_dir
