"""How the commands' `--help` reads: every option with its default, written by argparse from
the default itself (so the text cannot drift from the value), examples kept as written."""

from __future__ import annotations

import argparse


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
