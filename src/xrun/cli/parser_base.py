"""The argparse parser class every command's subparser uses: a mistake is a UsageError (one line
on stderr, exit 2), not argparse's usage text and exit."""

from __future__ import annotations

import argparse
from typing import NoReturn

from xrun.errors import UsageError


class Parser(argparse.ArgumentParser):
    """argparse whose mistakes are UsageErrors: one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")
