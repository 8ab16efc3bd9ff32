"""What a path holds (a dataset folder, its splits and files, or a file pattern), read once for
the reader and every tool. See docs/api.md; the implementation is
`tfrecord_pipe._reading.dataset`."""

from tfrecord_pipe._reading.dataset import (
    Dataset,
    Split,
    label_names,
    label_offset,
    read_manifest,
    resolve,
)

__all__ = ["Dataset", "Split", "label_names", "label_offset", "read_manifest", "resolve"]
