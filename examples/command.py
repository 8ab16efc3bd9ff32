"""How an example ends on a user's mistake: the library refuses it with an error that says
what to do, and a traceback above that line tells the user nothing more."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable


def run(main: Callable[[], object]) -> None:
    """Runs `main`; a ValueError or FileNotFoundError (a changed --batch_size on resume, a
    folder that holds no dataset) is one `error:` line and exit 2, as `tfrecord-pipe` says it."""
    try:
        main()
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


@contextlib.contextmanager
def argument_as_flag(argument: str, flag: str):
    """A refusal that names the library's `argument` (`split=`) names the example's `flag`
    instead (`--eval_split`): the user of an example gave the flag."""
    try:
        yield
    except ValueError as err:
        raise ValueError(str(err).replace(f"pass {argument}", f"pass {flag}")) from None
