"""What the CLI prints on a terminal: the rich console, tables whose numbers are never cut, and stage lines.

Rich shrinks a table that is wider than the terminal by cutting cells with an ellipsis, numbers included
(`1.369e-…` in an 80-column terminal). `Table` here keeps every numeric column at the width of its longest cell
(no wrapping) and lets the text columns fold instead.
"""
from __future__ import annotations

import os
import sys
from typing import Callable

from rich.console import Console
from rich.table import Table as _RichTable
from rich.text import Text


def console(quiet: bool = False, stderr: bool = False) -> Console:
    """The console commands print to. When stdout is not a terminal (CI logs, pipes) rich would wrap at 80 columns,
    too narrow for the report tables, so it gets 140; COLUMNS, when set, wins as usual."""
    stream = sys.stderr if stderr else sys.stdout
    wide = not stream.isatty() and not os.environ.get("COLUMNS")
    return Console(stderr=stderr, quiet=quiet, highlight=False, width=140 if wide else None)


class Table(_RichTable):
    """A rich Table whose `numeric` columns are never wrapped or cut: rich's collapse leaves them alone (no_wrap) and
    their longest cell's width is their minimum (restored should rich still shrink them); the other columns fold
    (break inside long words) to make room, and a table still too wide loses its outer border."""

    def __init__(self, *headers: str, title: str | None = None, numeric=(), **kwargs):
        super().__init__(title=title, **kwargs)
        self._numeric = set(numeric)
        for h in headers:  # numeric columns: not shrunk by rich's collapse (no_wrap), which then folds the text ones
            self.add_column(h, overflow="fold", no_wrap=h in self._numeric)

    def __rich_console__(self, console, options):
        for col in self.columns:
            if col.header in self._numeric:
                cells = [Text.from_markup(c).cell_len if isinstance(c, str) else len(str(c)) for c in col._cells]
                col.min_width = max(cells, default=1)
        if self.show_edge and self._natural_width(console, options) > options.max_width:
            self.show_edge = False  # a narrow terminal: the outer border's 4 columns go before any text folds
        yield from super().__rich_console__(console, options)

    def _natural_width(self, console, options) -> int:
        widths = [self._measure_column(console, options.update_width(10_000), c).maximum for c in self.columns]
        return sum(widths) + self._extra_width


class Stages:
    """Numbered stage lines on stderr (`onnxfuse verify [2/3] onnxruntime session: ...`), like `onnxfuse build`'s;
    nothing when disabled (-q, --json). Pass it as the API's `progress` callback."""

    def __init__(self, command: str, enabled: bool = True):
        self.command, self.enabled = command, enabled

    def __call__(self, index: int, total: int, stage: str, detail: str = "") -> None:
        if self.enabled:
            print(f"onnxfuse {self.command} [{index}/{total}] {stage}{': ' + detail if detail else ''}",
                  file=sys.stderr, flush=True)


Progress = Callable[[int, int, str, str], None]


def checks_table(title: str, outputs) -> Table:
    """verify's table: one row per checked output (verify.OutputCheck: name, shape, errors, tolerance, passed)."""
    t = Table("output", "shape", "max abs err", "max rel err", "rel L2 err", "tolerance", "result", title=title,
              numeric=("shape", "max abs err", "max rel err", "rel L2 err", "tolerance", "result"))
    for o in outputs:
        t.add_row(o.name, "x".join(map(str, o.shape)), f"{o.max_abs_err:.3e}", f"{o.max_rel_err:.3e}",
                  f"{o.rel_l2_err:.3e}", f"{o.tolerance:.0e}", "[green]PASS[/]" if o.passed else "[red]FAIL[/]")
    return t


def human_size(n: int) -> str:
    """Bytes as "512 B", "3.4 MB"."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def human_age(seconds: float) -> str:
    """Seconds as "42 s", "7 min", "3 h", "2 d"."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"
