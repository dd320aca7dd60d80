"""argparse value types shared by the CLI commands: one-line errors that say what was expected.

Every list flag takes one syntax: comma-separated values (`--patterns swiglu,linear_act`, `--bottom-mlp
512,256,64,16`, `--sizes 16,128`). Layer sizes also accept the paper's dashes (512-256-64-16) for old scripts."""
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
        values = tuple(int(v) for v in text.replace("-", ",").split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated sizes like 512,256,64,16")
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be positive, like 512,256,64,16")
    return values


def name_list(text: str) -> list[str]:
    """Comma-separated names (`gate_proj,up_proj`)."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated names like gate_proj,up_proj")
    return names


def option_key(pair: str) -> str:
    """KEY of a KEY=VALUE pair, as genai's builder reads it (stripped)."""
    return pair.split("=", 1)[0].strip()


def option_list(text: str) -> list[str]:
    """Comma-separated KEY=VALUE pairs (`block_size=32,accuracy_level=4`)."""
    pairs = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in pairs if "=" not in v or not option_key(v)]
    if not pairs or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated KEY=VALUE pairs like "
                                         "block_size=32,accuracy_level=4")
    return pairs


def window_size(text: str) -> tuple[int, int]:
    """WIDTHxHEIGHT in pixels, each 200-8000 (`--window 1600x1000`)."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected WIDTHxHEIGHT, like 1600x1000")
    if not (200 <= w <= 8000 and 200 <= h <= 8000):
        raise argparse.ArgumentTypeError(f"{text!r}: width and height must be 200-8000 pixels")
    return w, h


def port(text: str) -> int:
    """A TCP port, 0-65535 (0: any free port)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number")
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"{v}: a port is 1-65535 (0: any free port)")
    return v


def choice_list(choices, what: str):
    """A type for `--FLAG a,b`: comma-separated names, each one of `choices` (a sequence, or a function returning
    one, for choices that are expensive to import)."""
    def parse(text: str) -> list[str]:
        allowed = choices() if callable(choices) else choices
        names = [t.strip() for t in text.split(",") if t.strip()]
        bad = [n for n in names if n not in allowed]
        if not names or bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(bad) or repr(text)}; choose from "
                                             f"{','.join(allowed)}, comma-separated")
        return names
    return parse
