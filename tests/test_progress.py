"""progress.py: a redrawn line on a terminal, plain lines in a log."""

import io

from tfrecord_pipe._core import progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_gets_plain_lines_and_never_a_carriage_return(monkeypatch):
    log = io.StringIO()
    line = progress.StatusLine(log, log_every_s=0)
    for i in range(3):
        line.update(f"step {i}")
    line.finish("done")
    assert log.getvalue() == "step 0\nstep 1\nstep 2\ndone\n"


def test_a_log_gets_a_line_per_interval_not_per_update():
    log = io.StringIO()
    line = progress.StatusLine(log, log_every_s=3600)
    for i in range(1000):
        line.update(f"step {i}")
    line.finish("done")
    assert log.getvalue() == "done\n"


def test_a_terminal_line_is_redrawn_in_place(monkeypatch):
    monkeypatch.setattr(progress, "REDRAW_EVERY_S", 0)
    screen = Terminal()
    line = progress.StatusLine(screen)
    line.update("a longer text")
    line.finish("short")
    assert screen.getvalue() == "\ra longer text\x1b[K\rshort\x1b[K\n"


def test_bar_shows_the_fraction_done():
    assert progress.bar(0.5, width=4) == "[##..]"
    assert progress.bar(2.0, width=4) == "[####]"
    assert progress.bar(-1, width=4) == "[....]"
