"""preprocess.py: the training crop, the evaluation centre crop, dtypes and normalisation."""

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tfrecord_pipe._reading import preprocess

from helpers import ODD_IMAGES, encode

SIZE = 32


def halves_jpeg(width, height, left=(230, 20, 20), right=(20, 20, 230), split=None) -> bytes:
    """A JPEG whose columns left of `split` have one colour and the rest another."""
    image = Image.new("RGB", (width, height), right)
    image.paste(left, (0, 0, split if split is not None else width // 2, height))
    return encode(image, quality=95)


@pytest.mark.parametrize("dtype", preprocess.DTYPES)
def test_both_paths_give_a_static_square_of_the_requested_dtype(dtype):
    encoded = tf.constant(halves_jpeg(60, 40))
    for image in (
        preprocess.train_image(encoded, SIZE, dtype),
        preprocess.eval_image(encoded, SIZE, dtype),
    ):
        assert image.shape == (SIZE, SIZE, 3)
        assert image.dtype == tf.as_dtype(dtype)


def test_eval_crop_keeps_the_centre_and_leaves_out_the_sides_of_a_wide_image():
    # 200 x 50: the centre crop is 43 px of the 50 px height, columns 78..121; the outer 60
    # columns on each side are red and must not appear.
    image = Image.new("RGB", (200, 50), (230, 20, 20))
    image.paste((20, 20, 230), (60, 0, 140, 50))
    pixels = preprocess.eval_image(tf.constant(encode(image, quality=95)), SIZE, "uint8").numpy()
    red, blue = pixels[..., 0].astype(int), pixels[..., 2].astype(int)
    assert (blue - red).min() > 150, "red from the sides leaked into the centre crop"


def test_eval_image_keeps_colours():
    encoded = tf.constant(halves_jpeg(64, 64, left=(200, 60, 30), right=(200, 60, 30)))
    pixels = preprocess.eval_image(encoded, SIZE, "uint8").numpy()
    np.testing.assert_allclose(pixels.reshape(-1, 3).mean(axis=0), (200, 60, 30), atol=4)


def test_train_crops_differ_between_calls_and_flip_both_ways():
    encoded = tf.constant(halves_jpeg(96, 64))
    crops = [preprocess.train_image(encoded, SIZE, "uint8").numpy() for _ in range(24)]
    assert len({crop.tobytes() for crop in crops}) > 1, "every random crop was the same"
    # Red on the left half unless flipped: both orientations must occur.
    red_left = [crop[:, : SIZE // 2, 0].mean() > crop[:, SIZE // 2 :, 0].mean() for crop in crops]
    assert any(red_left) and not all(red_left)


def test_uint8_then_normalize_on_the_accelerator_matches_the_float_path():
    encoded = tf.constant(halves_jpeg(50, 70))
    on_host = preprocess.eval_image(encoded, SIZE, "float32").numpy()
    on_device = preprocess.normalize(preprocess.eval_image(encoded, SIZE, "uint8")).numpy()
    # uint8 rounds each pixel by at most 0.5 of 255 levels; divided by a std dev of ~57.
    np.testing.assert_allclose(on_device, on_host, atol=0.5 / 57 + 1e-6)


def test_float_output_is_normalised_with_the_imagenet_statistics():
    gray = tf.constant(halves_jpeg(40, 40, left=(124, 116, 104), right=(124, 116, 104)))
    pixels = preprocess.eval_image(gray, SIZE, "float32").numpy()
    assert abs(pixels.mean()) < 0.05, "the ImageNet mean colour should normalise to about 0"


def test_color_jitter_changes_pixels_within_range():
    encoded = tf.constant(halves_jpeg(64, 64))
    plain = preprocess.train_image(encoded, SIZE, "uint8").numpy()
    jittered = [preprocess.train_image(encoded, SIZE, "uint8", 1.0).numpy() for _ in range(8)]
    assert any(abs(image.astype(int).mean() - plain.astype(int).mean()) > 2 for image in jittered)


def test_an_unknown_dtype_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="float32"):
        preprocess.eval_image(tf.constant(halves_jpeg(8, 8)), SIZE, "float16")


def full_decode_eval(image: tf.Tensor) -> tf.Tensor:
    """The evaluation crop of an already decoded image, resized and rounded to uint8: what
    `eval_image` does without libjpeg's DCT scaling."""
    shape = tf.shape(image)
    top, left, height, width = tf.unstack(preprocess.centre_window(shape[0], shape[1], SIZE))
    crop = tf.image.crop_to_bounding_box(image, top, left, height, width)
    return tf.cast(tf.image.resize(tf.cast(crop, tf.float32), [SIZE, SIZE]) + 0.5, tf.uint8)


def test_large_crops_decoded_at_reduced_scale_match_a_full_decode():
    # A 600 x 400 gradient: the 32 px evaluation crop is 200 px, so libjpeg decodes it at 1/4
    # scale; a full decode then crop and resize must give nearly the same pixels.
    y, x = np.mgrid[0:400, 0:600].astype(np.float32)
    pixels = np.stack([x / 600 * 255, y / 400 * 255, (x + y) / 1000 * 255], axis=-1)
    encoded = tf.constant(encode(pixels.astype(np.uint8), quality=95))
    fast = preprocess.eval_image(encoded, SIZE, "uint8").numpy().astype(int)
    full = full_decode_eval(tf.io.decode_jpeg(encoded, channels=3)).numpy()
    assert np.abs(fast - full.astype(int)).mean() < 3


def test_eval_pixels_equal_the_plain_recipe_exactly():
    # Centre crop of 32/64 of the shorter side decoded by libjpeg, bilinear resize of the uint8
    # crop, ImageNet normalisation: the speed-ups (float resize, a crop decoded from its MCU
    # boundary: the left edge here is column 24) must not change a bit. (A full
    # decode then crop differs at the crop's edges, where libjpeg upsamples chroma without the
    # neighbours outside the crop: up to 19 levels on this noise, in 6% of the values.)
    rng = np.random.default_rng(3)
    noisy = rng.integers(0, 256, (45, 70, 3), dtype=np.uint8)
    encoded = tf.constant(encode(noisy, quality=90))
    side = int(SIZE / (SIZE + preprocess.CROP_PADDING) * 45)
    window = [(45 - side + 1) // 2, (70 - side + 1) // 2, side, side]
    crop = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
    resized = tf.image.resize(crop, [SIZE, SIZE]).numpy()
    mean, std = np.array(preprocess.MEAN_RGB), np.array(preprocess.STDDEV_RGB)
    expected = (resized - mean) / std
    actual = preprocess.eval_image(encoded, SIZE, "float32").numpy()
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("left", [0, 5, 15, 16, 17, 40])
def test_crops_decoded_from_the_mcu_boundary_equal_libjpegs_own_crops(left):
    # _decode_crop asks libjpeg for the crop from the MCU column to its left and slices the
    # extra columns off (faster): the pixels must be exactly decode_and_crop_jpeg's, for every
    # chroma subsampling (MCUs 8 or 16 px wide), grayscale and CMYK.
    rng = np.random.default_rng(left)
    noisy = rng.integers(0, 256, (48, 80, 3), dtype=np.uint8)
    # 4:4:4, 4:2:2, 4:2:0 and grayscale
    jpegs = [encode(noisy, quality=90, subsampling=subsampling) for subsampling in (0, 1, 2)]
    jpegs.append(encode(noisy[..., 0], quality=90, subsampling=0))
    jpegs.append((ODD_IMAGES / "pil_sample_cmyk.jpg").read_bytes())
    for data in jpegs:
        encoded = tf.constant(data)
        window = tf.constant([3, left, 20, 31])
        expected = tf.image.decode_and_crop_jpeg(encoded, window, channels=3).numpy()
        actual = preprocess._decode_crop(encoded, window, SIZE).numpy()
        np.testing.assert_array_equal(actual, expected)
