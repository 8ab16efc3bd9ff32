"""The small model of the JAX examples: an MLP on the images shrunk to 16x16, in plain JAX, with
the pipelines' normalisation done on the device (uint8 batches in). Enough to show a training
loop, not a recipe for accuracy. Imports no TensorFlow, so the Grain example starts without it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tfrecord_pipe import grain

IMAGE_SIZE = 32
POOLED = 16
HIDDEN = 64

# numpy, not JAX, arrays: made at import, JAX ones would start JAX's backend before a
# program could join other hosts (jax.distributed.initialize must come first).
_SCALE = np.asarray([1 / s for s in grain.STDDEV_RGB], np.float32)
_SHIFT = np.asarray([-m / s for m, s in zip(grain.MEAN_RGB, grain.STDDEV_RGB)], np.float32)


def normalize(images):
    """The pipelines' normalisation (`preprocess.normalize`, `grain.normalize`) on the
    device: uint8 batches in, normalised float32 out."""
    return images.astype(jnp.float32) * _SCALE + _SHIFT


def init(key, classes: int) -> dict:
    first, second = jax.random.split(key)
    inputs = POOLED * POOLED * 3
    return {
        "w1": jax.random.normal(first, (inputs, HIDDEN)) * (2 / inputs) ** 0.5,
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(second, (HIDDEN, classes)) * (1 / HIDDEN) ** 0.5,
        "b2": jnp.zeros(classes),
    }


def logits(params: dict, images) -> jax.Array:
    x = normalize(images)
    batch = x.shape[0]
    x = x.reshape(batch, POOLED, IMAGE_SIZE // POOLED, POOLED, IMAGE_SIZE // POOLED, 3)
    x = x.mean(axis=(2, 4)).reshape(batch, -1)
    x = jax.nn.relu(x @ params["w1"] + params["b1"])
    return x @ params["w2"] + params["b2"]


def loss(params: dict, images, labels) -> jax.Array:
    log_probabilities = jax.nn.log_softmax(logits(params, images))
    return -jnp.mean(jnp.take_along_axis(log_probabilities, labels[:, None], axis=1))


@jax.jit
def train_step(params: dict, images, labels, learning_rate: float = 0.05):
    value, grads = jax.value_and_grad(loss)(params, images, labels)
    return jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads), value


@jax.jit
def correct(params: dict, images, labels, weights) -> tuple[jax.Array, jax.Array]:
    """(right answers, images) in a padded batch: filler (weight 0) counts for nothing."""
    real = weights > 0
    right = (jnp.argmax(logits(params, images), axis=-1) == labels) & real
    return right.sum(), real.sum()
