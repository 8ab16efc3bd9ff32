"""How the commands' `--help` reads: every option with its default, written by argparse from
the default itself (so the text cannot drift from the value), examples kept as written; and
how their mistakes read (`Parser`)."""

from __future__ import annotations

import argparse

# Said where a command got more paths than it takes (the stray word is a path that exists):
# a shell expands an unquoted pattern. The readers read a pattern themselves, quoted; the
# conversion's and verify's SOURCE is one folder or list, taken as written.
EXPANDED_PATTERN = ("a shell pattern such as data/train-* gives one argument per file it "
                    "matches: quote it, 'data/train-*', for the command to read it")
EXPANDED_FOLDERS = ("a shell pattern such as data/* gives one argument per folder it matches; "
                    "give the one folder above them")


def expanded(word: str) -> bool:
    """Whether a stray `word` may be one of the paths a shell pattern expanded into: one that
    exists (a value given to a switch, a flag's value left without its flag, are not)."""
    import os

    return not word.startswith("-") and os.path.exists(word)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends "(default: X)" to an option's help, unless there is none to show (an unset
    option, a switch that is off): those help texts say what happens without the option."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or default is None
            or default is False
            or default == argparse.SUPPRESS
            or "%(default)" in text
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose mistakes are one `error:` line, as the commands' other errors
    are: argparse printed its usage first (15 lines for convert). An option it does not know
    is answered with the closest one it, or one of its commands, has."""

    def parse_args(self, args=None, namespace=None):
        # As argparse's, keeping the words it did not take: its message joins them with
        # spaces, and a path holding one was read as two (no hint, and a wrong count).
        parsed, self._strays = self.parse_known_args(args, namespace)
        if self._strays:
            self.error(f"unrecognized arguments: {' '.join(self._strays)}")
        return parsed

    def error(self, message: str):
        hint = ""
        if message.startswith("unrecognized arguments: "):
            strays = getattr(self, "_strays", None) or message.split(": ", 1)[1].split()
            given = strays[0].split("=", 1)[0]
            import difflib  # only for a mistake

            close = difflib.get_close_matches(given.lower(), sorted(flags_of(self)), n=1,
                                              cutoff=0.75)  # fmt: skip
            hint = f" Did you mean {close[0]}?" if close else ""
            if expanded(given):
                from tfrecord_pipe._core import messages

                # The files of a pattern, first: a page of names before the hint (a helper's
                # 127 shards).
                message = f"unrecognized arguments: {messages.some(strays, 3)}"
                hint = f" {EXPANDED_PATTERN[0].upper()}{EXPANDED_PATTERN[1:]}."
        commands = any(isinstance(a, argparse._SubParsersAction) for a in self._actions)
        listed = f"`{self.prog} COMMAND --help` lists a command's" if commands else (
            f"`{self.prog} --help` lists the")  # fmt: skip
        self.exit(2, f"error: {message}.{hint} {listed} options.\n")


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of `parser` and of its commands' parsers."""
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                found |= flags_of(command)
    return found
