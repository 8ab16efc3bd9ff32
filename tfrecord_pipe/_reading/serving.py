"""The serving signature: raw image files in, class probabilities and names out.

Exported models take what clients have: the bytes of image files. The signature makes of each
file what the converter would have stored (`graph_normalise`: EXIF orientation, transparency
on white, first frame, `max_side`, the JPEG re-encoding), then runs `preprocess.eval_image`,
the centre crop evaluation uses, so a file served gives the model the pixels it was evaluated
on. With TF Serving's REST API:

    POST /v1/models/NAME:predict  {"instances": [{"b64": "<base64 of an image file>"}]}

Guards, each naming the request item (`image_bytes[3]`): bytes in a format TensorFlow cannot
decode, a header that cannot be read, an image that declares more pixels than the cap (read
from the header, before anything is decoded), image data that cannot be decoded. The request
fails with that error, instead of exhausting the server's memory or answering for wrong pixels.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile

import tensorflow as tf

from tfrecord_pipe._core import arguments, images, keywords, manifest
from tfrecord_pipe._reading import dataset, graph_normalise, preprocess

INPUT_NAME = "image_bytes"
SIGNATURE = "serving_default"
# Per request image. A 40-megapixel photo decodes to 120 MB; far larger images are attacks or
# mistakes. Lower than the converter's cap (`core.images.DEFAULT_MAX_PIXELS`): a server decodes
# many requests at once.
DEFAULT_MAX_REQUEST_PIXELS = 40_000_000


@keywords.suggest_on_typo
@dataclasses.dataclass(frozen=True)
class ServingConfig:
    """How the exported signature turns bytes into the model's input and back into answers.

    Attributes:
      labels: label texts in index order (the dataset's labels.txt / manifest labels).
      image_size: side of the model's square input; the same as the reader's.
      dtype: the model's input dtype, as the reader's `dtype` ("float32", "bfloat16", "uint8").
      from_logits: the model outputs logits (softmax is applied); False: probabilities.
      max_pixels: images declaring more pixels than this are refused before decoding.
      max_side, jpeg_quality: the conversion's (`core.images.ImagePolicy`), so that served
        files are downscaled and re-encoded as the records were. `for_dataset` reads them, and
        the labels, from the dataset's manifest.
    """

    labels: tuple[str, ...]
    image_size: int = 224
    dtype: str = "float32"
    from_logits: bool = True
    max_pixels: int = DEFAULT_MAX_REQUEST_PIXELS
    max_side: int | None = images.ImagePolicy.max_side
    jpeg_quality: int = images.ImagePolicy.jpeg_quality

    @classmethod
    def for_dataset(cls, path: str, **options) -> ServingConfig:
        """The config for a model trained on the dataset folder `path`: its labels, and the
        conversion's `max_side` and `jpeg_quality`; `options` sets the rest (image_size, ...)."""
        found = dataset.read_manifest(path)
        policy = found.conversion.get("policy", {})
        recorded = {name: policy[name] for name in ("max_side", "jpeg_quality") if name in policy}
        return cls(labels=found.labels, **{**recorded, **options})

    def __post_init__(self):
        if isinstance(self.labels, str) or not all(isinstance(x, str) for x in self.labels):
            raise ValueError(
                "Invalid ServingConfig: labels must be label names in index order (a tuple of "
                f"str, as dataset.label_names gives), got {self.labels!r}"
            )
        object.__setattr__(self, "labels", tuple(self.labels))
        arguments.check_fields(self, _TYPE_CHECKS, "ServingConfig")
        problems = []
        if not self.labels:
            problems.append("labels is empty")
        if repeated := manifest.repeated_labels(self.labels):  # answers would name two alike
            problems.append(f"labels lists these more than once: {repeated}")
        if self.image_size < 1:
            problems.append(f"image_size must be >= 1, got {self.image_size}")
        if preprocess.dtype_problem(self.dtype):
            problems.append(preprocess.dtype_problem(self.dtype))
        if self.max_pixels < 1:
            problems.append(f"max_pixels must be >= 1, got {self.max_pixels}")
        try:
            images.ImagePolicy(max_side=self.max_side, jpeg_quality=self.jpeg_quality)
        except arguments.Invalid as err:
            problems.extend(err.problems)
        arguments.refuse("ServingConfig", problems)


# labels are checked by hand (a tuple of str), dtype by its value.
_TYPE_CHECKS = arguments.field_checks(ServingConfig, skip=("labels", "dtype"))


class ServingModule(tf.Module):
    """A model's TensorFlow function with the bytes-in signature; what `export` saves.

    `model_outputs` takes [N, size, size, 3] batches of the config's dtype; `export` makes it
    from a Keras model of any backend.
    """

    def __init__(self, model_outputs: tf.Module, config: ServingConfig):
        super().__init__()
        self.model = model_outputs  # tracked: the model's variables are saved with it
        self._config = config
        self._labels = tf.constant(config.labels)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_NAME)])
    def serve(self, image_bytes):
        """{"probabilities": [N, C] float32, "classid": [N] int64, "class": [N] string}."""
        # Converted by autograph (docs/development.md): it calls the model's function.
        images = model_inputs(image_bytes, self._config)
        # An empty request skips the model: oneDNN's kernels (TensorFlow's CPU default on
        # AVX-512 machines) fail on an empty batch ("Matrix size-incompatible: In[0]: [0,3]").
        outputs = tf.cond(
            tf.size(image_bytes) > 0,
            lambda: tf.cast(self.model.outputs(images), tf.float32),
            lambda: tf.zeros([0, len(self._config.labels)], tf.float32),
        )
        probabilities = tf.nn.softmax(outputs) if self._config.from_logits else outputs
        classid = tf.argmax(probabilities, axis=-1)
        return {
            "probabilities": probabilities,
            "classid": classid,
            "class": tf.gather(self._labels, classid),
        }


@tf.autograph.experimental.do_not_convert
def model_inputs(image_bytes: tf.Tensor, config: ServingConfig) -> tf.Tensor:
    """The model's input for each file in `image_bytes` ([N] strings): [N, size, size, 3].

    Raises (when run) InvalidArgumentError naming the first item that cannot be served and why.
    """
    image_bytes = tf.convert_to_tensor(image_bytes)
    if image_bytes.dtype != tf.string or image_bytes.shape.rank not in (None, 1):
        raise ValueError(
            f"{INPUT_NAME} must be a vector of encoded files ([N] strings, one file each: "
            f"tf.constant([data])), got {image_bytes.dtype.name} of shape {image_bytes.shape}"
        )
    if tf.executing_eagerly():
        # (The answers do not depend on labels or from_logits: one trace for all of them.)
        pixels_only = dataclasses.replace(config, labels=("",), from_logits=True)
        return _traced_model_inputs(pixels_only)(image_bytes)
    return _model_inputs(image_bytes, config)


@functools.lru_cache(maxsize=4)  # a traced graph holds about 75 MiB
def _traced_model_inputs(config: ServingConfig):
    """`model_inputs` for eager calls with `config`, traced once: its graph is large, and an
    eager call built and ran it op by op each time (benchmarks/RESULTS.md). Traced with the
    module's constants of the first call: a test that patches them must not call it eagerly.
    (Under tf.data's debug mode a map inside a tf.function fails, so this does too; so did the
    reader, and `model_inputs` inside a user's tf.function, before it.)"""
    return tf.function(
        functools.partial(_model_inputs, config=config),
        input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_NAME)],
        autograph=False,
    )


@tf.autograph.experimental.do_not_convert
def _model_inputs(image_bytes: tf.Tensor, config: ServingConfig) -> tf.Tensor:
    fmt = graph_normalise.format_of(image_bytes)
    names = tf.gather(graph_normalise.FORMAT_NAMES, fmt)
    checks = [
        _first_item(tf.equal(fmt, graph_normalise.TIFF),
                    "is a TIFF file, which TensorFlow cannot decode; send it as PNG or JPEG"),
        _first_item(tf.equal(fmt, graph_normalise.UNKNOWN),
                    "is not an image serving can decode: send JPEG, PNG, GIF, WebP or BMP bytes"),
    ]  # fmt: skip
    with tf.control_dependencies(checks):
        height, width, refusal, turn, components = _each_item(
            image_bytes, (fmt,), graph_normalise.header,
            (tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int32),
             tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int64)),
            [names, "header cannot be read: the file is cut short or damaged"],
        )  # fmt: skip
    pixels = height * width
    checks = [
        _first_item(tf.equal(refusal, code), reason)
        for code, reason in enumerate(graph_normalise.REFUSALS) if code
    ] + [
        _first_item(pixels > config.max_pixels,
                    f"pixels, more than the cap of {config.max_pixels} "
                    "(ServingConfig.max_pixels); send a smaller image",
                    ["declares", height, "x", width]),
    ]  # fmt: skip
    size = config.image_size

    def model_input(encoded, *read):  # (format, turn, components): header's, not read again
        return graph_normalise.eval_input(
            encoded, *read, size, config.dtype, config.max_side, config.jpeg_quality
        )

    with tf.control_dependencies(checks):
        return _each_item(
            image_bytes, (fmt, turn, components), model_input,
            tf.TensorSpec([size, size, 3], tf.as_dtype(config.dtype)),
            [names, "image data cannot be decoded: the file is damaged or cut short"],
        )  # fmt: skip


def _first_item(bad: tf.Tensor, problem: str, details=()) -> tf.Operation:
    """An assertion that no item is `bad`; its message names the first that is."""
    first = tf.argmax(tf.cast(tf.concat([bad, [False]], 0), tf.int32), output_type=tf.int64)
    said = [_at(detail, first) if isinstance(detail, tf.Tensor) else detail for detail in details]
    return tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [_item(first, *said, problem)])


def _item(index: tf.Tensor, *parts) -> tf.Tensor:
    """One message line: "image_bytes[3]: " and the parts, numbers written out."""
    words = [
        part if isinstance(part, str) or part.dtype == tf.string else tf.strings.as_string(part)
        for part in parts
    ]
    return tf.strings.join(
        [
            f"{INPUT_NAME}[",
            tf.strings.as_string(index),
            "]:",
            *[tf.strings.join([" ", w]) for w in words],
        ]
    )


def _at(values: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """values[index], or a default value past the end (assertion data is computed even when
    the assertion holds)."""
    return tf.gather(tf.concat([values, tf.zeros([1], values.dtype)], 0), index)


def _each_item(image_bytes, facts, fn, signature, problem):
    """fn(encoded, *facts) of every item (each of `facts` a vector of one per item), stacked;
    fails naming the first item it fails on.

    Errors inside `fn` (a decoder's, an assertion's) cannot be caught in a graph, so the items
    run as a tf.data pipeline that drops failed items, and the gap names the item.
    """
    count = tf.size(image_bytes, out_type=tf.int64)

    @tf.autograph.experimental.do_not_convert
    def item(i):
        return i, fn(image_bytes[i], *(fact[i] for fact in facts))

    done = (
        tf.data.Dataset.range(count)
        .map(
            item,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        .ignore_errors()
    )
    end = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), signature)
    done = done.concatenate(tf.data.Dataset.from_tensors((tf.constant(-1, tf.int64), end)))
    index, values = done.batch(count + 1).get_single_element()
    index = index[:-1]
    values = tf.nest.map_structure(lambda value: value[:-1], values)
    gap = tf.not_equal(index, tf.range(tf.size(index, out_type=tf.int64)))
    first = tf.where(
        tf.reduce_any(gap),
        tf.argmax(tf.cast(tf.concat([gap, [False]], 0), tf.int32), output_type=tf.int64),
        tf.size(index, out_type=tf.int64),
    )
    names, text = problem
    complete = tf.debugging.Assert(
        tf.equal(tf.size(index, out_type=tf.int64), count),
        [_item(first, "the", _at(names, first), text)],
    )
    with tf.control_dependencies([complete]):
        return tf.nest.map_structure(tf.identity, values)


def export(model: tf.keras.Model, export_dir: str, config: ServingConfig) -> str:
    """Saves `model` as a SavedModel whose `serving_default` takes `image_bytes`.

    Any Keras 3 backend: Keras's `ExportArchive` turns the model into a TensorFlow function
    (under JAX, through jax2tf), which the signature then calls after the preprocessing.

    Returns:
      export_dir, for chaining.
    """
    if tf.io.gfile.exists(export_dir) and not tf.io.gfile.isdir(export_dir):
        raise ValueError(f"{export_dir} is a file: give the folder to write the SavedModel "
                         "into (it is made where missing).")  # fmt: skip
    _check_inputs(model, config)
    size = config.image_size
    archive = tf.keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "outputs",
        lambda images: model(images, training=False),
        input_signature=[tf.TensorSpec([None, size, size, 3], tf.as_dtype(config.dtype))],
    )
    with tempfile.TemporaryDirectory() as scratch:
        archive.write_out(scratch, verbose=False)
        loaded = tf.saved_model.load(scratch)
        _check_outputs(loaded, config)
        module = ServingModule(loaded, config)
        # jax2tf's functions carry custom gradients that cannot be saved again; serving needs
        # no gradients.
        options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
        tf.saved_model.save(
            module, export_dir, signatures={SIGNATURE: module.serve}, options=options
        )
    return export_dir


def _check_inputs(model, config: ServingConfig) -> None:
    """Refuses a config whose pixels the model cannot take, where the model says what it
    takes: another size, or float pixels for a model of integer inputs (Keras casts them, so
    a uint8 model given normalised floats saw black, and answered). A float input may take
    uint8 pixels (cast, then `preprocess.Normalize` in the model), and any float type the
    model casts (bfloat16)."""
    inputs = getattr(model, "inputs", None) or []
    if not inputs:
        return  # a subclassed model: nothing said to compare
    if len(inputs) != 1 or len(inputs[0].shape) != 4:
        shapes = ", ".join(str(tuple(one.shape)) for one in inputs)
        raise ValueError(
            f"The model takes {len(inputs)} input(s) of shape {shapes}: serving gives it one, "
            "a batch of images [batch, size, size, 3]. Export the model that takes the images "
            "(a model of several inputs: one that takes the images alone, around it)."
        )
    _, height, width, channels = inputs[0].shape
    takes = tf.as_dtype(inputs[0].dtype)
    problems = []
    if channels not in (None, 3):
        problems.append(f"images of {channels} channel(s), and serving gives RGB images (3): "
                        "a model trained on this dataset's records takes 3")  # fmt: skip
    if None not in (height, width) and (height, width) != (config.image_size,) * 2:
        problems.append(f"{height} x {width} images, and the config gives {config.image_size} "
                        f"x {config.image_size}: ServingConfig(image_size={height})")  # fmt: skip
    if takes.is_integer and not tf.as_dtype(config.dtype).is_integer:
        problems.append(f"{takes.name} pixels, and the config gives {config.dtype}: "
                        f"ServingConfig(dtype={takes.name!r}), as it was trained")  # fmt: skip
    if problems:
        raise ValueError("The model takes " + "; it takes ".join(problems) + ". Export with the "
                         "settings the model was trained with.")  # fmt: skip


def _check_outputs(loaded, config: ServingConfig) -> None:
    """Refuses a model whose scores are not one per label: with fewer labels a request whose
    best class has no name failed ("indices[0] = 2 is not in [0, 2)"), with more every
    answer named classes by the wrong labels. And one whose scores are probabilities where
    the config takes logits: softmax twice squashed every answer's probabilities."""
    size = config.image_size
    scores = loaded.outputs(tf.zeros([1, size, size, 3], tf.as_dtype(config.dtype)))
    shape = getattr(scores, "shape", None)
    if shape is None or shape.rank != 2 or shape[-1] != len(config.labels):
        gives = f"scores of shape {tuple(shape)}" if shape is not None else type(scores).__name__
        raise ValueError(
            f"The model gives {gives} for one image, and the config has "
            f"{len(config.labels)} labels: serving needs one "
            "score per label, [batch, labels]. Export the model trained on this dataset, with "
            "its labels (ServingConfig.for_dataset)."
        )
    # Logits of two images (black, and grey at 128) that are both probabilities would be
    # a coincidence; a softmax's always are.
    grey = loaded.outputs(tf.fill([1, size, size, 3], tf.constant(128, tf.as_dtype(config.dtype))))
    probabilities = tf.cast(tf.concat([scores, grey], 0), tf.float64)
    if config.from_logits and len(config.labels) > 1 and bool(
        tf.reduce_all(probabilities >= 0) & tf.reduce_all(probabilities <= 1)
        & tf.reduce_all(tf.abs(tf.reduce_sum(probabilities, -1) - 1) < 1e-2)  # (bfloat16's)
    ):  # fmt: skip
        raise ValueError(
            "The model's scores for an image are probabilities (each in [0, 1], summing to 1: "
            "a softmax at its end), and the config takes them for logits (from_logits=True, "
            "the default): serving would apply softmax again, and every answer's "
            "probabilities would be squashed towards equal. Export with "
            "ServingConfig(..., from_logits=False)."
        )
