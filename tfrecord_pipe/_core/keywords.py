"""Keyword arguments that do not exist name the closest one that does: `batchsize=` is a
TypeError that says "did you mean 'batch_size'?", as the command's flags do."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable


def check(where: str, given: Iterable[str], known: Iterable[str]) -> None:
    """Raises TypeError for the first name in `given` that is not in `known`, with the closest
    known names, or all of them when none is close."""
    known = sorted(known)
    for name in given:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=2, cutoff=0.6)
            hint = (
                f"did you mean {' or '.join(map(repr, close))}?"
                if close
                else f"the options are: {', '.join(known)}"
            )
            raise TypeError(f"{where} got an unexpected keyword argument {name!r}; {hint}")


def suggest_on_typo(cls):
    """Class decorator for a dataclass: an unknown keyword names the closest field.

    Put it above @dataclasses.dataclass. `help(cls)` still shows the generated signature.
    """
    init = cls.__init__
    names = {field for field in cls.__dataclass_fields__}

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        check(f"{cls.__name__}()", kwargs, names)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls
