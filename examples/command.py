"""How an example ends on a user's mistake: the library refuses it with an error that says
what to do, and a traceback above that line tells the user nothing more."""

from __future__ import annotations

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
