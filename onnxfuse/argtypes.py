"""argparse value types shared by the CLI commands: one-line errors that say what was expected."""
from __future__ import annotations

import argparse


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer")


def positive_int(text: str) -> int:
    v = _int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be positive")
    return v


def nonneg_int(text: str) -> int:
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return v


def layer_sizes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.replace(",", "-").split("-") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected sizes like 512-256-64-16")
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be positive, like 512-256-64-16")
    return values
