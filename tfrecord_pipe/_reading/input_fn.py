"""The `input_fn` training code calls, in each of the ways it is called (InputContext, params,
nothing), and `make_input_fn`, whose options are ReaderConfig's fields."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping

import tensorflow as tf

from tfrecord_pipe._core import arguments, keywords
from tfrecord_pipe._reading import hosts, resume
from tfrecord_pipe._reading.reader import build_dataset
from tfrecord_pipe._reading.reader_config import ReaderConfig


class InputFn:
    """The `input_fn` returned by `make_input_fn`: call it the way your training code does.

    - `input_fn(input_context)`, from `strategy.distribute_datasets_from_function`: this
      pipeline's share of the files, per-replica batches from `config.batch_size`.
    - `input_fn(params)`: TPUEstimator-era code; `params["batch_size"]` is the batch of this
      pipeline, which reads every file (TPUEstimator itself left TensorFlow in 2.16).
    - `input_fn()`: this host's share when a host position is given or JAX is in use
      (`hosts`), with batches of config.batch_size / host count; else one pipeline, batches
      of `config.batch_size`. For JAX, `input_fn().as_numpy_iterator()` yields numpy batches.
    """

    def __init__(self, config: ReaderConfig, host_index=None, host_count=None):
        # (An int, not a numpy one: a position state holds the host as JSON.)
        host_index = arguments.count("host_index", host_index, optional=True)
        host_count = arguments.count("host_count", host_count, optional=True)
        if host_index is not None or host_count is not None:
            hosts.position(host_index, host_count)  # refuses a wrong position now, not later
        self.config = config
        self.host_index, self.host_count = host_index, host_count

    def __call__(self, context=None, *, start_batches: int = 0) -> tf.data.Dataset:
        """`start_batches`: seeded training: batches this pipeline has trained on already."""
        if isinstance(context, tf.distribute.InputContext):
            if self.host_count is not None:
                raise ValueError(
                    "This input_fn was given host_index/host_count, and tf.distribute's "
                    "InputContext gives a position too. Use one of the two."
                )
            return build_dataset(self.config, context, start_batches=start_batches)
        if context is not None and not isinstance(context, Mapping):
            raise TypeError(
                "input_fn takes a tf.distribute.InputContext, a params dict with 'batch_size', "
                f"or nothing; got {type(context).__name__}"
            )
        if hosts.jax_in_use():
            hosts.keep_tensorflow_off_accelerators()
        host = hosts.position(self.host_index, self.host_count)
        config = self.config
        if host and host[1] > 1 and not config.is_training and config.eval_remainder == "drop":
            raise ValueError(
                "eval_remainder='drop' with several hosts: each host drops its own remainder, "
                "so hosts would run different numbers of batches and one would wait in a "
                "collective for ever. Use eval_remainder='pad' (the default)."
            )
        host_context = hosts.input_context(*host) if host else None
        if context is None:
            return build_dataset(self.config, host_context, start_batches=start_batches)
        if "batch_size" not in context:
            raise ValueError(
                f"input_fn(params) needs params['batch_size']; got keys {sorted(context)}"
            )
        return build_dataset(
            self.config, host_context, batch_size=context["batch_size"],
            start_batches=start_batches,
        )  # fmt: skip

    def host_context(self) -> tf.distribute.InputContext | None:
        """This host's InputContext when a host position is given or JAX is in use."""
        host = hosts.position(self.host_index, self.host_count)
        return hosts.input_context(*host) if host else None

    def numpy_batches(self) -> resume.BatchIterator:
        """This host's batches as numpy arrays, for JAX, with a small state to save beside the
        model and restore after a preemption (`get_state` / `set_state`, as Grain's
        iterators have): seeded training only."""
        return resume.BatchIterator(self)

    def __repr__(self):
        return (
            f"InputFn({self.config!r}, host_index={self.host_index}, host_count={self.host_count})"
        )


def make_input_fn(
    data: str,
    split: str | None = None,
    *,
    is_training: bool | None = None,
    mode: str | None = None,
    host_index: int | None = None,
    host_count: int | None = None,
    **options,
) -> InputFn:
    """An `input_fn` for training or evaluation, in the style of the Cloud TPU reference models.

    Args:
      data: a dataset folder (with manifest.json) or a file pattern.
      split: which split of a dataset folder (default "train" or "validation" by mode).
      is_training: training (shuffle, repeat, augment) or evaluation. Give this or `mode`.
      mode: "train" or "eval" (what `tf.estimator.ModeKeys` held), instead of is_training.
      host_index, host_count: this host's position, for programs that feed each host
        themselves (JAX); default: JAX's process index and count when JAX is in use, else
        one host (`hosts`). Not with tf.distribute, whose InputContext gives the position.
      **options: every other ReaderConfig field (batch_size, image_size, dtype, seed, ...),
        shown with its default in this function's signature; `help(ReaderConfig)` says what
        each does. A name that is not one is a TypeError naming the closest.

    Returns:
      An InputFn: `input_fn(input_context)`, `input_fn(params)` or `input_fn()`.
    """
    keywords.check("make_input_fn()", options, [*_OPTIONS, *_OWN_KEYWORDS])
    if (is_training is None) == (mode is None):
        raise ValueError("Pass exactly one of is_training=True/False or mode='train'/'eval'.")
    if mode is not None:
        modes = {"train": True, "training": True, "eval": False, "evaluation": False}
        if mode not in modes:
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        is_training = modes[mode]
    config = ReaderConfig(data=data, split=split, is_training=is_training, **options)
    return InputFn(config, host_index, host_count)


# make_input_fn's options are ReaderConfig's fields; its signature lists them, with their
# defaults, for help() and editors, from the one definition above.
_OPTIONS = {
    field.name: field
    for field in dataclasses.fields(ReaderConfig)
    if field.name not in ("data", "split", "is_training")
}
_own = inspect.signature(make_input_fn)
_OWN_KEYWORDS = [p.name for p in _own.parameters.values() if p.kind == inspect.Parameter.KEYWORD_ONLY]
make_input_fn.__signature__ = _own.replace(
    parameters=[
        *(p for p in _own.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD),
        *(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=field.default,
                              annotation=field.type)
            for name, field in _OPTIONS.items()
        ),
    ]
)  # fmt: skip
del _own
