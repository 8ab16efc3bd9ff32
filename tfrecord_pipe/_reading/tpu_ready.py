"""Whether a dataset's elements can go to a TPU as they are.

`check` is for tests (ours and users'): XLA compiles one program per input shape, so a dynamic
dimension, a batch that is not the requested size, or a dtype the TPU cannot take would fail
far from the input pipeline, or recompile every step. It lists every problem at once.
"""

from __future__ import annotations

import tensorflow as tf

# What TPU infeed and XLA on TPU take. int64 and float64 are not among them (cast to int32 /
# float32), nor float16 (use bfloat16), nor strings (decode on the host).
TPU_DTYPES = (tf.float32, tf.bfloat16, tf.int32, tf.uint32, tf.int8, tf.uint8, tf.bool)
_DTYPE_ADVICE = {
    tf.int64: "cast to int32",
    tf.float64: "cast to float32",
    tf.float16: "use bfloat16",
    tf.string: "decode on the host",
}
IMAGE_LAYOUTS = ("NHWC", "HWCN")


class NotTpuReadyError(ValueError):
    """A dataset's elements cannot go to a TPU as they are; the message lists why."""


def check(
    dataset: tf.data.Dataset | object, batch_size: int, image_layout: str = "NHWC"
) -> None:
    """Raises NotTpuReadyError unless every component is static, batched and TPU-typed.

    Args:
      dataset: a tf.data.Dataset, or its `element_spec`.
      batch_size: the batch every component must have: dimension 0, or the last dimension of
        rank-4 images when `image_layout` is "HWCN".
      image_layout: "NHWC", or "HWCN" for transposed image batches.

    Raises:
      NotTpuReadyError: listing each component that has a dynamic dimension, the wrong batch
        size, or a dtype TPUs do not take.
    """
    if image_layout not in IMAGE_LAYOUTS:
        raise ValueError(f"image_layout must be one of {IMAGE_LAYOUTS}, got {image_layout!r}")
    if hasattr(dataset, "element_spec"):  # a Dataset, its iterator, a distributed one
        dataset = dataset.element_spec
    elif callable(dataset) or hasattr(dataset, "__next__"):  # an input_fn, numpy batches
        raise ValueError(
            f"tpu_ready.check takes a tf.data.Dataset (or its element_spec), got "
            f"{type(dataset).__name__}: call the input_fn, as in check(train_fn(), batch_size)."
        )
    paths_and_specs = _flatten_with_paths(dataset)
    problems, unshaped, batches = [], False, set()
    if not paths_and_specs:
        problems.append("the elements have no tensors")
    for path, component in paths_and_specs:
        if not isinstance(component, tf.TensorSpec):
            problems.append(f"{path}: {type(component).__name__} is not a dense tensor")
            continue
        shape = component.shape
        if shape.rank is None:
            problems.append(f"{path}: unknown rank")
            continue
        if not shape.is_fully_defined():
            problems.append(f"{path}: shape {shape} has dynamic dimensions (None)")
            unshaped = True
        if shape.rank == 0:
            problems.append(f"{path}: a scalar has no batch dimension; batch the dataset")
            unshaped = True
        else:
            axis = -1 if (image_layout == "HWCN" and shape.rank == 4) else 0
            if shape[axis] is not None and shape[axis] != batch_size:
                where = "last" if axis == -1 else "first"
                transposed = axis == 0 and shape.rank == 4 and shape[-1] == batch_size
                if not transposed:  # (said where it is)
                    batches.add(shape[axis])
                problems.append(
                    f"{path}: {where} (batch) dimension is {shape[axis]}, expected {batch_size}"
                    + (" (its last is: HWCN batches, from transpose_input=True? Check them "
                       "with image_layout='HWCN')" if transposed else "")
                )  # fmt: skip
        if component.dtype not in TPU_DTYPES:
            advice = _DTYPE_ADVICE.get(component.dtype, "cast to a TPU type")
            problems.append(f"{path}: dtype {component.dtype.name} is not TPU-ready ({advice})")
    if problems:
        # The advice for what was found: a batch of another size was told to batch with
        # drop_remainder (a helper's trial).
        advice = ["Batch with drop_remainder=True and give every image a fixed size."] if (
            unshaped) else []  # fmt: skip
        if batches:
            advice.append(
                f"Batches of {', '.join(map(str, sorted(batches)))}: check batch_size against "
                "the batch the pipeline makes (under a strategy, the reader's batches are each "
                "replica's: the global batch over the replicas in sync)."
            )
        raise NotTpuReadyError("Dataset is not TPU-ready:\n  " + "\n  ".join(problems)
                               + "".join(f"\n{line}" for line in advice))  # fmt: skip


def _flatten_with_paths(spec, path="element"):
    """(path, leaf) pairs of a nested element spec: element[0], element['image'], ..."""
    if isinstance(spec, dict):
        items = [(f"{path}[{key!r}]", value) for key, value in sorted(spec.items())]
    elif isinstance(spec, (tuple, list)):
        items = [(f"{path}[{index}]", value) for index, value in enumerate(spec)]
    else:
        return [(path, spec)]
    return [pair for sub_path, value in items for pair in _flatten_with_paths(value, sub_path)]
