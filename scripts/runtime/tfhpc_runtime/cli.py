"""Command lines of the shipped scripts: argparse with one-line errors and the RESULT line every rank prints.

Imports neither numpy nor TensorFlow: bad input is reported in well under a second, before any framework starts and
before anything is written. The training flags are in trainflags, errors in errors.
"""
import argparse
import json

from .errors import fail


class Parser(argparse.ArgumentParser):
    """argparse with defaults in --help and usage errors on a single line."""

    def __init__(self, description, **kwargs):
        super().__init__(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter, **kwargs)

    def error(self, message):
        fail(f"{self.prog}: {message} (see {self.prog} --help)")


def report(result, sort_keys=True):
    """One machine-readable line per rank; the tests and users' scripts parse it."""
    print("RESULT " + json.dumps(result, sort_keys=sort_keys), flush=True)


def log(enabled, *parts):
    if enabled:
        print(*parts, flush=True)
