"""messages.one_line: an error as the one line a person needs."""

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
