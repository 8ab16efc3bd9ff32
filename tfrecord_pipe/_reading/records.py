"""Records of the format in tf.data: the parse spec, and shard files read with their record
counts checked.

TensorFlow's own error for a bad shard ("truncated record at 5085") does not say which file.
`shard_reader` reads each file with errors caught, counts its records, and at its end compares the
count with the manifest's: short means corrupt or truncated, and the error (or the warning,
with skip_corrupt) names the file.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

import tensorflow as tf

from tfrecord_pipe._core import array_records, messages, naming, paths, schema

_DTYPES = {schema.BYTES: tf.string, schema.INT64: tf.int64}


def parse_spec(*keys: str) -> dict[str, tf.io.FixedLenFeature]:
    """The spec for `tf.io.parse_example` of `keys` (default: every key of the format).

    Every key is required: a record missing one is not ours and should fail loudly.
    """
    return {
        key: tf.io.FixedLenFeature([], _DTYPES[schema.FEATURES[key]])
        for key in keys or schema.FEATURES
    }


def present(skip_corrupt: bool):
    """A filter for (file name, count) pairs: True for a file that exists; for a missing one,
    an error naming it, or with skip_corrupt a warning and False.

    TensorFlow's own reader retries opening a missing file without end when errors are
    ignored (the count check below ignores them, to count a truncated file's records).
    """

    @tf.autograph.experimental.do_not_convert
    def exists(filename, expected):
        # matching_files takes a pattern: "[", "*" and "?" in a name are written as classes.
        literal = tf.strings.regex_replace(filename, r"([\[\*\?])", r"[\1]")
        found = tf.size(tf.io.matching_files(literal)) > 0
        problem = tf.strings.join(["TFRecord file ", filename, " is missing"])
        if skip_corrupt:
            return tf.cond(found, lambda: True, lambda: _warn_false(problem, "skipped it"))
        check = tf.debugging.Assert(found, [problem])
        with tf.control_dependencies([check]):
            return tf.identity(found)

    return exists


def shard_reader(
    compression: str, buffer_size: int, skip_corrupt: bool, counted: bool, catch: bool = True
):
    """A function from (file name, expected record count) to that file's records, for an
    interleave over shard files.

    Args:
      compression: "" or "GZIP".
      buffer_size: read buffer per file, in bytes.
      skip_corrupt: a corrupt or short file ends with a warning instead of an error.
      counted: the expected counts are known (from a manifest) and checked; without them a
        read error ends the file (skip_corrupt) or stops the pipeline with TensorFlow's error.
      catch: read errors are caught, to name the file (and to skip the rest of it with
        skip_corrupt). False for pipelines checkpointed as positions, which TensorFlow's
        error catcher does not support: a damaged record then stops the pipeline with
        TensorFlow's own error ("corrupted record at 5085"), and a file cut short between
        records still with the count check's, naming it.
    """
    if not catch and skip_corrupt:
        raise ValueError("skip_corrupt needs read errors caught")

    @tf.autograph.experimental.do_not_convert
    def read(filename: tf.Tensor, expected: tf.Tensor, skip=None, numbered_from=None):
        """`skip`: records at the file's start to pass over unread (TensorFlow seeks past
        them); counted in the check. `numbered_from` (counted files only): the number of the
        file's first record; each record then comes as (its number, record)."""
        records = tf.data.TFRecordDataset(
            filename, compression_type=compression, buffer_size=buffer_size
        )
        if skip is not None:
            records = records.skip(skip)
        if numbered_from is not None and (catch or not counted):
            raise ValueError("records are numbered by the count check's count of what was read")
        if counted:  # (a caught error would drop a record from the count, and shift the rest)
            return _checked(records, filename, expected, skip_corrupt, skip, catch, numbered_from)
        return records.ignore_errors(log_warning=True) if skip_corrupt else records

    return read


def _checked(records, filename, expected, skip_corrupt, skipped=None, catch=True,
             numbered_from=None):  # fmt: skip
    """`records` with read errors caught (`catch`) and the count checked when the file ends,
    and at each record past it (the `skipped` records before them counted in); numbered from
    `numbered_from` by the same count (a count of its own, a scan beside it, cost about 15% of
    a seeded pipeline's speed: benchmarks/RESULTS.md)."""
    end = tf.data.Dataset.from_tensors((tf.constant(b""), tf.constant(True)))
    records = records.ignore_errors() if catch else records
    tagged = records.map(lambda r: (r, tf.constant(False))).concatenate(end)

    @tf.autograph.experimental.do_not_convert
    def count(seen, element):
        record, is_end = element
        seen = seen + tf.cast(tf.logical_not(is_end), tf.int64)
        return seen, (record, is_end, seen)

    @tf.autograph.experimental.do_not_convert
    def keep(record, is_end, seen):
        # A record past the count is stopped as it comes: evaluation reads as many records
        # as the manifest lists, and may never reach the file's end.
        return tf.cond(
            tf.logical_or(is_end, seen > expected),
            lambda: _miscounted(filename, seen, expected, is_end, skip_corrupt),
            lambda: True,
        )

    initial = tf.constant(0, tf.int64) if skipped is None else tf.cast(skipped, tf.int64)
    counted = tagged.scan(initial, count)
    kept = counted.filter(keep)
    if numbered_from is None:
        return kept.map(lambda record, is_end, seen: record)
    return kept.map(lambda record, is_end, seen: (numbered_from + seen - 1, record))


def _miscounted(filename, seen, expected, is_end, skip_corrupt):
    """At a file's end (False: the end marker is dropped) or a record past its count (False
    with skip_corrupt): an error unless the count is the manifest's; with skip_corrupt, one
    warning, at the first record past the count or at the end of a short file."""
    complete = tf.logical_and(is_end, tf.equal(seen, expected))
    more = seen > expected  # not a cut file: read while a conversion replaced the dataset?
    problem = tf.strings.join(
        [
            tf.where(more, "TFRecord file with more records than listed ",
                     "Corrupt or truncated TFRecord file "),
            filename,
            ": read ",
            tf.strings.as_string(seen),
            " records, the manifest lists ",
            tf.strings.as_string(expected),
            tf.where(more, " (another file by its name, or the dataset converted again while "
                           "it was read: read it again once the conversion is done)", ""),
        ]
    )
    if skip_corrupt:
        short = tf.logical_and(is_end, seen < expected)
        first_past = tf.logical_and(tf.logical_not(is_end), tf.equal(seen, expected + 1))
        return tf.cond(
            tf.logical_or(short, first_past),
            lambda: _warn_false(problem, "skipped the rest of it"),
            lambda: False,
        )
    check = tf.debugging.Assert(complete, [problem])
    with tf.control_dependencies([check]):
        return tf.constant(False)


def repeat_while_nonempty(one_pass: tf.data.Dataset, problem: str) -> tf.data.Dataset:
    """`one_pass` repeated for ever, stopping with `problem` as the error when a whole pass
    gives no record: a plain `repeat()` would spin on nothing, at full CPU, without a word.

    The stream ends at the empty pass, so no later pass is read (and warned about again).
    """
    end = tf.data.Dataset.from_tensors((tf.constant(b""), tf.constant(True)))
    marked = one_pass.map(lambda record: (record, tf.constant(False))).concatenate(end)

    @tf.autograph.experimental.do_not_convert
    def count(seen, element):
        record, is_end = element
        return tf.where(is_end, tf.constant(0, tf.int64), seen + 1), (record, is_end, seen)

    @tf.autograph.experimental.do_not_convert
    def fail(record, is_end, seen):
        check = tf.debugging.Assert(False, [problem])
        with tf.control_dependencies([check]):
            return tf.identity(record), is_end, seen

    counted = marked.repeat().scan(tf.constant(0, tf.int64), count)
    healthy = counted.take_while(lambda record, is_end, seen: ~(is_end & tf.equal(seen, 0)))
    failed = tf.data.Dataset.from_tensors((b"", True, tf.constant(0, tf.int64))).map(fail)
    stream = healthy.concatenate(failed)
    return stream.filter(lambda record, is_end, seen: ~is_end).map(lambda r, is_end, seen: r)


def _warn_false(problem, done: str):
    # One joined string: tf.print would quote a string tensor printed among others.
    text = tf.strings.join(["WARNING tfrecord-pipe: ", problem, f"; {done} (skip_corrupt=True)"])
    warn = tf.print(text, output_stream=sys.stderr)
    with tf.control_dependencies([warn]):
        return tf.constant(False)


_FRAME_BYTES = 16  # a TFRecord's length (8 bytes) and two CRCs (4 each) around its data


def shard_records(path, compression: str = "", file_format: str = naming.TFRECORD) -> tf.data.Dataset:
    """The records of one shard file (a string or a string tensor), in order, in
    `file_format`. Read errors are tf.errors.OpError whatever the format."""
    if file_format == naming.TFRECORD:
        return tf.data.TFRecordDataset(path, compression_type=compression)
    return tf.data.Dataset.from_generator(
        lambda name: array_record_records(name.decode() if isinstance(name, bytes) else name),
        output_signature=tf.TensorSpec([], tf.string),
        args=(path,),
    )


def array_record_records(path: str) -> Iterator[bytes]:
    """The records of one ArrayRecord file, local or remote, in order.

    Raises:
      tf.errors.DataLossError: the file is not a whole ArrayRecord file; the message names it.
    """
    try:
        with _local_copy(path) as local:
            yield from array_records.records(local)
    except (OSError, RuntimeError) as err:  # RuntimeError: the package's, for damaged chunks
        raise tf.errors.DataLossError(None, None, f"{path}: {messages.one_line(err)}") from err


@contextlib.contextmanager
def _local_copy(path: str):
    """`path` on local disk: itself, or a temporary copy of a remote file (the array-record
    package reads local files only)."""
    if not paths.is_remote(path):
        yield path
        return
    handle, local = tempfile.mkstemp(suffix="." + naming.ARRAY_RECORD)
    os.close(handle)
    try:
        tf.io.gfile.copy(path, local, overwrite=True)
        yield local
    finally:
        os.remove(local)


@tf.function(input_signature=[tf.TensorSpec([], tf.string)] * 2, autograph=False)
def _records_and_bytes(path, compression):
    """The records of a TFRecord file, and the bytes they take framed: traced once for every
    file, not a reduce built for each (benchmarks/RESULTS.md, "inspect --check")."""
    dataset = tf.data.TFRecordDataset(path, compression_type=compression)
    start = (tf.constant(0, tf.int64), tf.constant(0, tf.int64))
    framed = lambda r: tf.cast(tf.strings.length(r), tf.int64) + _FRAME_BYTES  # noqa: E731
    return dataset.reduce(start, lambda acc, r: (acc[0] + 1, acc[1] + framed(r)))


def count(path: str, compression: str) -> int:
    """The records in one file, read to its end.

    An uncompressed file must also be exactly its records: TensorFlow reads a tail shorter
    than a record's header (a file cut there, or a few bytes that are no TFRecord at all) as
    a clean end.

    Raises:
      tf.errors.OpError: a record that cannot be read, or bytes after the last whole record.
    """
    if naming.file_format_of(path) == naming.ARRAY_RECORD:
        try:
            with _local_copy(path) as local:
                return array_records.count(local)
        except OSError as err:
            raise tf.errors.DataLossError(None, None, str(err)) from err
    n, used = _records_and_bytes(path, compression)
    if not compression:
        size = tf.io.gfile.stat(path).length
        if int(used) != size:
            raise tf.errors.DataLossError(
                None, None, f"{size - int(used)} bytes after its last whole record ({int(n)}): "
                "a truncated file, or not a TFRecord file"
            )  # fmt: skip
    return int(n)


DOES_NOT_DECODE = "image does not decode"  # how image_problem's worst answer begins


def image_problem(record: schema.ImageRecord) -> str | None:
    """What is wrong with a record's image as the reader will decode it (`tf.io.decode_jpeg`,
    3 channels): it does not decode, or not to the height and width the record says."""
    try:
        shape = tuple(tf.io.decode_jpeg(record.encoded, channels=3).shape)
    except tf.errors.OpError as err:
        return f"{DOES_NOT_DECODE}: {messages.one_line(err)}"
    if shape != (record.height, record.width, 3):
        return f"image decodes to {shape}, the record says {record.height}x{record.width}x3"
    return None

