"""A dataset folder's manifest.json (`Manifest`, `SplitInfo`), without TensorFlow. See
docs/api.md; the implementation is `tfrecord_pipe._core.manifest`."""

from tfrecord_pipe._core.manifest import Manifest, SplitInfo, parse_labels

__all__ = ["Manifest", "SplitInfo", "parse_labels"]
