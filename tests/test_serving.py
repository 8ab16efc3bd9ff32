"""serving.py: the exported SavedModel takes image bytes, runs the evaluation preprocessing,
and refuses what is not an image or is too large."""

import dataclasses
import io
import json
import os
import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tfrecord_pipe._core import images as core_images
from tfrecord_pipe._reading import graph_normalise, preprocess, serving

from helpers import encode, with_scans
from helpers import jpeg_bytes as jpeg
from helpers import png_bytes as png

ROOT = pathlib.Path(__file__).resolve().parents[1]
LABELS = ("red", "green", "blue")
SIZE = 32


def turned_jpeg(width: int, height: int, colour, orientation: int) -> bytes:
    """A JPEG whose EXIF block says to turn it (`orientation`, 2 to 8) to be upright."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(Image.new("RGB", (width, height), colour), "JPEG", exif=exif.tobytes())


def small_model(dtype="float32"):
    """A fixed random CNN: untrained weights are enough to compare two ways of calling it."""
    tf.keras.utils.set_random_seed(1)
    inputs = tf.keras.Input((SIZE, SIZE, 3), dtype=dtype)
    x = preprocess.Normalize()(inputs) if dtype == "uint8" else inputs
    x = tf.keras.layers.Conv2D(8, 3, activation="relu")(x)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(len(LABELS))(x))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = small_model()
    export_dir = str(tmp_path_factory.mktemp("serving") / "export")
    serving.export(model, export_dir, serving.ServingConfig(labels=LABELS, image_size=SIZE))
    return model, export_dir


# TensorFlow's CPU kernels differ by CPU: oneDNN's are the default on AVX-512 CPUs, and failed
# on an empty batch. Both are forced here, in a fresh server process each, on any CPU.
@pytest.mark.slow
@pytest.mark.parametrize("onednn", ["0", "1"], ids=["oneDNN-off", "oneDNN-on"])
def test_a_fresh_process_gets_the_same_answers_as_the_model_in_memory(exported, tmp_path, onednn):
    model, export_dir = exported
    images = {  # different sizes and aspect ratios, a PNG, and one to turn upright
        "wide.jpg": jpeg(90, 40, (200, 30, 30)),
        "tall.jpg": jpeg(33, 120, (30, 30, 200)),
        "square.png": png(50, 50, (30, 200, 30)),
        "turned.jpg": turned_jpeg(90, 40, (200, 200, 30), orientation=6),
    }
    for name, data in images.items():
        (tmp_path / name).write_bytes(data)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_ENABLE_ONEDNN_OPTS=onednn)
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "serve_check.py"), export_dir,
         *(str(tmp_path / name) for name in images)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(li for li in done.stdout.splitlines() if li.startswith("RESULT "))[7:])
    assert result["inputs"] == {"image_bytes": "string"}
    # No error line from the serving graph itself: oneDNN's for a transpose of integers
    # ("oneDNN supports DT_UINT8 / DT_INT32 only on platforms with AVX-512", logged on an
    # AVX-512 Xeon too) came in every serving process that turned an image.
    assert "oneDNN supports" not in done.stderr, done.stderr[-3000:]

    # In memory: the reader's evaluation preprocessing of what the converter would store (the
    # PNG becomes a JPEG), then the model and a softmax.
    pixels = [
        preprocess.eval_image(tf.constant(core_images.normalise(data).encoded), SIZE)
        for data in images.values()
    ]
    expected = tf.nn.softmax(model(tf.stack(pixels))).numpy()
    np.testing.assert_allclose(result["probabilities"], expected, atol=1e-5)
    assert result["classid"] == expected.argmax(axis=1).tolist()
    assert result["class"] == [LABELS[i] for i in expected.argmax(axis=1)]
    assert result["empty"] == {"probabilities": [], "class": []}  # oneDNN's kernels failed on it


@pytest.mark.slow  # exports or traces the whole signature again
def test_png_and_jpeg_of_the_same_pixels_give_the_same_input_and_eager_calls_trace_once():
    serving._traced_model_inputs.cache_clear()  # (other tests of this process may fill it)
    config = serving.ServingConfig(labels=LABELS, image_size=SIZE, max_pixels=123_456)
    files = tf.constant([png(40, 30, (10, 200, 90)), jpeg(40, 30, (10, 200, 90))])
    as_png, as_jpeg = serving.model_inputs(files, config).numpy()
    np.testing.assert_allclose(as_png, as_jpeg, atol=0.1)
    # Each eager call built and ran the whole graph op by op, ~3.7 CPU-s a call: now its
    # graph is traced once per config, for requests of any length.
    # One trace also for configs that differ only where the pixels do not (75 MiB each).
    other_labels = dataclasses.replace(config, labels=("a", "b"), from_logits=False)
    [again] = serving.model_inputs(files[1:], other_labels).numpy()
    np.testing.assert_array_equal(again, as_jpeg)
    assert serving._traced_model_inputs.cache_info().currsize == 1
    traced = serving._traced_model_inputs(dataclasses.replace(config, labels=("",)))
    assert traced.experimental_get_tracing_count() == 1


def test_a_jpeg_of_more_scans_than_encoders_write_is_refused_undecoded():
    # 300 repeats of a progressive file's last scan held a server's core 10 s at 4,000 px,
    # 1,000 repeats 19 s (a helper's trial); the converter refuses the same files.
    config = serving.ServingConfig(labels=LABELS, image_size=SIZE)
    progressive = encode(Image.new("RGB", (40, 30), (10, 200, 30)), progressive=True)
    inputs = tf.function(serving.model_inputs)
    assert inputs(tf.constant([with_scans(progressive, 100)]), config).shape == (1, SIZE, SIZE, 3)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"image_bytes\[0\]: is a JPEG of more than 100 scans"):  # fmt: skip
        inputs(tf.constant([with_scans(progressive, 101)]), config)
    # What follows the image is not counted: a phone's motion photo appends megabytes of
    # video, in which 0xFF 0xDA stands about every 64 KiB (refused at first: a reviewer).
    trailed = with_scans(progressive, 100) + b"\xff\xda\x00" * 200
    assert inputs(tf.constant([trailed]), config).shape == (1, SIZE, SIZE, 3)


@pytest.fixture(scope="module")
def serve(exported):
    return tf.saved_model.load(exported[1]).signatures["serving_default"]


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_bytes_that_are_not_an_image_are_refused_clearly(serve):
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"image_bytes\[1\]: is not an image"):
        serve(image_bytes=tf.constant([jpeg(20, 20, (1, 2, 3)), b"hello, this is text"]))


@pytest.mark.parametrize(
    "bad, said",
    [(png(30, 30, (1, 2, 3))[:8], "the PNG header cannot be read"),
     (png(30, 30, (1, 2, 3))[:60], "the PNG image data cannot be decoded"),
     (jpeg(30, 30, (1, 2, 3))[:200], "the JPEG header cannot be read"),
     (jpeg(300, 300, (1, 2, 3))[:900], "the JPEG image data cannot be decoded"),  # crop cut off
     (b"", "is not an image")],
)  # fmt: skip
@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_one_bad_file_in_a_batch_fails_the_request_naming_it(serve, bad, said):
    good = jpeg(20, 20, (1, 2, 3))
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"image_bytes\[2\]: {said}"):
        serve(image_bytes=tf.constant([good, good, bad, good]))


def test_a_request_that_is_not_a_vector_of_files_is_refused_saying_the_shape():
    # A single file's bytes, not in a list, failed inside with "Can't concatenate scalars".
    config = serving.ServingConfig(labels=LABELS, image_size=SIZE)
    for wrong in (tf.constant(jpeg(20, 20, (1, 2, 3))), tf.constant([[b"a"]]), tf.zeros([2])):
        with pytest.raises(ValueError, match=r"image_bytes must be a vector of encoded files"):
            serving.model_inputs(wrong, config)


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_an_empty_request_gets_an_empty_answer(serve):
    out = serve(image_bytes=tf.constant([], tf.string))
    assert out["probabilities"].shape == (0, len(LABELS)) and out["class"].shape == (0,)


def with_declared_size(data: bytes, height: int, width: int) -> bytes:
    """A JPEG whose SOF header claims another size (a decompression-bomb shape)."""
    sof = data.index(b"\xff\xc0")
    return data[: sof + 5] + struct.pack(">HH", height, width) + data[sof + 9 :]


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_an_image_declaring_too_many_pixels_is_refused_before_decoding(serve):
    bomb = with_declared_size(jpeg(16, 16, (1, 2, 3)), 60000, 60000)  # 3.6 gigapixels
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than the cap of 40000000"):
        serve(image_bytes=tf.constant([bomb]))


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_a_gif_whose_image_is_larger_than_its_canvas_is_capped_by_the_image(serve):
    # A 1 x 1 canvas over a 8000 x 8000 image (26 KB of LZW) took 3.4 GB to serve, past the
    # cap, which read the canvas only (a reviewer); one of 16000 x 16000 took 7 GB.
    gif = bytearray(encode(Image.new("P", (20, 20)), "GIF"))
    gif[6:10] = struct.pack("<HH", 1, 1)  # the canvas
    descriptor = gif.index(b"\x2c", 13 + 3 * (2 << (gif[10] & 7)))  # after the colour table
    gif[descriptor + 5 : descriptor + 9] = struct.pack("<HH", 9000, 8000)  # width, height
    with pytest.raises(tf.errors.InvalidArgumentError, match="declares 8000 x 9000 pixels"):
        serve(image_bytes=tf.constant([bytes(gif)]))


@pytest.mark.slow  # exports or traces the whole signature again
def test_a_uint8_model_gets_uint8_pixels_and_the_pixel_cap_is_configurable(tmp_path):
    model = small_model("uint8")
    export_dir = str(tmp_path / "export")
    config = serving.ServingConfig(labels=LABELS, image_size=SIZE, dtype="uint8", max_pixels=4000)
    serving.export(model, export_dir, config)
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    data = jpeg(64, 48, (200, 100, 50))
    out = serve(image_bytes=tf.constant([data]))
    pixels = preprocess.eval_image(tf.constant(data), SIZE, "uint8")
    expected = tf.nn.softmax(model(pixels[None])).numpy()
    np.testing.assert_allclose(out["probabilities"].numpy(), expected, atol=1e-5)
    # The cap, for a PNG too (64 x 48 = 3,072 pixels is within it).
    assert serve(image_bytes=tf.constant([png(60, 60, (1, 2, 3))]))["class"].shape == (1,)
    with pytest.raises(tf.errors.InvalidArgumentError, match="declares 61 x 66 pixels, more"):
        serve(image_bytes=tf.constant([png(66, 61, (1, 2, 3))]))


def test_config_errors_are_listed():
    with pytest.raises(ValueError, match="labels is empty.*dtype"):
        serving.ServingConfig(labels=(), dtype="int8")
    # A str of labels was taken letter by letter, and a float size failed in a trace.
    with pytest.raises(ValueError, match="labels must be label names in index order"):
        serving.ServingConfig(labels="abc")
    with pytest.raises(ValueError,
                       match="Invalid ServingConfig: image_size must be an int, got 16.0"):
        serving.ServingConfig(labels=LABELS, image_size=16.0)
    assert serving.ServingConfig(labels=list(LABELS), image_size=np.int64(16)).labels == LABELS
    # The conversion's policy fields, checked by its own rules, said as this config's.
    with pytest.raises(ValueError, match=r"^Invalid ServingConfig: image_size must be >= 1, "
                                         r"got 0; jpeg_quality must be in 1..100, got 0$"):
        serving.ServingConfig(labels=LABELS, image_size=0, jpeg_quality=0)
    with pytest.raises(ValueError, match=r"labels lists these more than once: \['a'\]"):
        serving.ServingConfig(labels=("a", "b", "a"))  # answers named two classes alike


@pytest.mark.slow  # exports twice
def test_a_model_without_one_score_per_label_is_not_exported(tmp_path):
    # Fewer labels than scores: a request whose best class had no name failed, cryptically
    # ("indices[0] = 2 is not in [0, 2)"), and only then; more: every answer was named by
    # the wrong labels (a dataset converted again with one more label), without a word.
    for labels in (LABELS[:2], (*LABELS, "white")):
        with pytest.raises(ValueError, match=f"scores of shape \\(1, 3\\) for one image, and the "
                                             f"config has {len(labels)} labels"):  # fmt: skip
            serving.export(small_model(), str(tmp_path / "export"),
                           serving.ServingConfig(labels=labels, image_size=SIZE))  # fmt: skip
        assert not (tmp_path / "export").exists()
    # A model ending in softmax, with the config's default from_logits=True: softmax twice
    # squashed every answer's probabilities towards equal, without a word (a helper's trial).
    softmax = tf.keras.Sequential([small_model(), tf.keras.layers.Softmax()])
    with pytest.raises(ValueError, match=r"are probabilities .* Export with "
                                         r"ServingConfig\(\.\.\., from_logits=False\)"):  # fmt: skip
        serving.export(softmax, str(tmp_path / "export"),
                       serving.ServingConfig(labels=LABELS, image_size=SIZE))  # fmt: skip
    config = serving.ServingConfig(labels=LABELS, image_size=SIZE, from_logits=False)
    serving.export(softmax, str(tmp_path / "export"), config)
    # An export folder that is a file: TensorFlow's "FailedPreconditionError: ... is not a
    # directory", after the export's work.
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="afile is a file: give the folder"):
        serving.export(small_model(), str(tmp_path / "afile"), config)


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_a_config_giving_other_pixels_than_the_model_takes_is_not_exported(tmp_path):
    # A uint8 model (Normalize inside) exported with the default float32 config answered up
    # to 0.52 off in probability; one trained at 32 px and exported at 224 answered too.
    for model, options, said in (
        (small_model("uint8"), {}, r"uint8 pixels, and the config gives float32: "
                                   r"ServingConfig\(dtype='uint8'\)"),
        (small_model(), {"image_size": 224}, r"32 x 32 images, and the config gives 224 x 224"),
        # Keras's own errors, deep in the export, before (a helper's trial):
        (tf.keras.Sequential([tf.keras.Input((SIZE, SIZE, 1)), tf.keras.layers.Flatten(),
                              tf.keras.layers.Dense(3)]), {},
         r"images of 1 channel\(s\), and serving gives RGB images \(3\)"),
        (tf.keras.Sequential([tf.keras.Input((SIZE * SIZE * 3,)), tf.keras.layers.Dense(3)]), {},
         r"1 input\(s\) of shape \(None, 3072\): serving gives it one, a batch of images"),
    ):  # fmt: skip
        config = serving.ServingConfig(labels=LABELS, **{"image_size": SIZE, **options})
        with pytest.raises(ValueError, match=said):
            serving.export(model, str(tmp_path / "export"), config)
        assert not (tmp_path / "export").exists()
    # A float input given uint8 pixels, cast, then normalised in the model: as docs/serving.md
    # shows (a reviewer: the first version refused it, and advised float32, normalising twice).
    inputs = tf.keras.Input((SIZE, SIZE, 3))
    pooled = tf.keras.layers.GlobalAveragePooling2D()(preprocess.Normalize()(inputs))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(len(LABELS))(pooled))
    config = serving.ServingConfig(labels=LABELS, image_size=SIZE, dtype="uint8")
    assert serving.export(model, str(tmp_path / "export"), config) == str(tmp_path / "export")


@pytest.mark.slow  # traces the signature twice
def test_files_crafted_to_make_the_header_walk_long_are_served_or_refused_promptly(monkeypatch):
    # The EXIF and transparency checks walk a file's segments, chunks or blocks; a walk is
    # capped, so thousands of JPEG fill bytes or GIF comment blocks cannot hold the server
    # (the caps are lowered here, so that the test walks to them quickly).
    monkeypatch.setattr(graph_normalise, "_MAX_STEPS", 50)
    monkeypatch.setattr(graph_normalise, "_MAX_GIF_STEPS", 50)
    config = serving.ServingConfig(labels=LABELS, image_size=SIZE)
    good = jpeg(40, 30, (10, 200, 30))
    filled = good[:2] + b"\xff" * 5_000 + good[2:]
    commented = io.BytesIO()
    Image.new("P", (20, 20)).save(commented, "GIF", comment=b"x" * 20_000)  # 80 sub-blocks
    inputs = tf.function(serving.model_inputs)
    # Refused, not served from what the walk found so far: a cut walk had lost the frame's
    # colour components (an upright colour JPEG was re-encoded) and any turn after the cut.
    with pytest.raises(tf.errors.InvalidArgumentError, match="more segments or chunks than"):
        inputs(tf.constant([filled]), config)
    assert inputs(tf.constant([good[:2] + b"\xff" * 40 + good[2:]]), config).shape == (
        1, SIZE, SIZE, 3)  # fmt: skip
    with pytest.raises(tf.errors.InvalidArgumentError, match="too many blocks to check"):
        inputs(tf.constant([commented.getvalue()]), config)
