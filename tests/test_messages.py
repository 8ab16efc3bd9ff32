"""messages: an error as the one line a person needs, and what a full disk has left."""

import pytest

from tfrecord_pipe._core import messages


def test_one_line_of_an_error_a_tensorflow_message_and_a_traceback_sent_as_text():
    assert messages.one_line(ValueError("first\nsecond")) == "first"
    assert messages.one_line("  \n") == ""
    said = ("{{function_node __inference_f_12}} Input is empty. [Op:IteratorGetNext] name: x\n"
            "more")  # fmt: skip
    assert messages.one_line(said) == "Input is empty."
    # Beam's workers send a failed step's traceback as the text of a RuntimeError.
    sent = (
        "Traceback (most recent call last):\n  File \"w.py\", line 3, in process\n"
        "    raise OSError('disk full')\nOSError: disk full [while running 'WriteShards']\n"
    )
    assert messages.one_line(RuntimeError(sent)) == "OSError: disk full [while running 'WriteShards']"
    assert len(messages.one_line("x" * 10_000)) == messages.LIMIT
    # A graph function's error names the reason after where the function was defined (this
    # line alone was shown: `inspect --check` said a shard "cannot be read to its end: Graph
    # execution error:").
    graph = ("Graph execution error:\n\nDetected at node ReduceDataset defined at (most recent "
             "call last):\n  File \"<stdin>\", line 5, in <module>\n\n  File \"records.py\", "
             "line 247, in count\n\ncorrupted record at 4195\n\t [[{{node ReduceDataset}}]] "
             "[Op:__inference_count_37]")  # fmt: skip
    assert messages.one_line(graph) == "corrupted record at 4195"
    # A reader's own assertion, inside a map (`bench` printed the whole of it).
    mapped = ("Error in user-defined function passed to MapDataset:11 transformation with "
              "iterator: Iterator::Root::Prefetch::Map: assertion failed: [A pass over this "
              "pipeline\\'s 1 file(s) gave no record.] [[{{node Assert}}]]")  # fmt: skip
    assert messages.one_line(mapped) == "A pass over this pipeline's 1 file(s) gave no record."
    # tf.debugging.assert_less's: the message, then the condition and values as more items.
    several = ("assertion failed: [Label not below 3 [of 0..2]] [Condition x < y did not hold "
               "element-wise:] [x (args_0:0) = ] [3] [y (Const:0) = ] [3]")  # fmt: skip
    assert messages.one_line(several) == "Label not below 3 [of 0..2]"


def test_a_full_disk_is_told_from_its_error_or_a_worker_s_text_and_its_space_said(tmp_path):
    import errno

    assert messages.disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert messages.disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))  # a user's quota
    assert messages.disk_full(RuntimeError("OSError: [Errno 28] No space left on device"))
    assert not messages.disk_full(OSError(errno.ENOENT, "No such file or directory"))
    assert not messages.disk_full(RuntimeError("OSError: [Errno 2] No such file"))
    full = OSError(errno.ENOSPC, "No space left on device", "/o/a b")
    assert messages.path_named(full) == "/o/a b"
    sent = "OSError: [Errno 28] No space left on device: '/tmp/x/run-1'"  # a worker's
    assert messages.path_named(RuntimeError(sent)) == "/tmp/x/run-1"
    assert messages.path_named(RuntimeError("OSError: [Errno 28] No space left")) is None
    said = messages.space_left(str(tmp_path / "not made" / "yet"))  # its disk's
    assert said.endswith(" free") and said[0].isdigit(), said


def test_a_refused_configuration_keeps_its_problems_apart_and_crosses_processes_whole():
    import pickle

    from tfrecord_pipe._core import arguments, images

    with pytest.raises(arguments.Invalid) as refused:
        images.ImagePolicy(max_side=0, jpeg_quality=101)
    err = refused.value
    assert str(err) == ("Invalid ImagePolicy: max_side must be >= 1 or None, got 0; "
                        "jpeg_quality must be in 1..100, got 101")  # fmt: skip
    assert err.problems == ("max_side must be >= 1 or None, got 0",
                            "jpeg_quality must be in 1..100, got 101")  # fmt: skip
    back = pickle.loads(pickle.dumps(err))  # as a worker process's error comes back
    assert (type(back), str(back), back.problems) == (type(err), str(err), err.problems)
    assert isinstance(back, ValueError)
