"""How every report page looks: one A4-landscape figure, a title, a caption, panels, one legend.

Rules the pages follow (and ``tests/test_report_layout.py`` checks on rendered pages):

- a page is a ``Page``: its title and caption are plain text generated from the data, so the PDF,
  the HTML report and the tests read the same words;
- axes of magnitudes start at zero (``from_zero``); no offset or exponent notation on ticks;
- the legend sits outside the data: one legend per page, below the panels (``page_legend``);
- every axis label carries its unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

PAGE = (11.69, 8.27)  # A4 landscape, inches
plt.rcParams.update({"axes.formatter.useoffset": False, "axes.formatter.limits": (-9, 12),
                     "figure.max_open_warning": 0,  # a report holds its pages (figures) until written
                     "axes.spines.top": False, "axes.spines.right": False})


@dataclass
class Table:
    """A table a page shows: header and rows of strings (the HTML report makes it sortable)."""

    header: list[str]
    rows: list[list[str]]


@dataclass
class Page:
    title: str
    caption: str
    figure: Any  # matplotlib Figure
    table: Table | None = None
    notes: list[str] = field(default_factory=list)  # extra lines (findings), shown in HTML as a list


def new_page(title: str, sentence: str, nrows: int = 1, ncols: int = 2, *, legend_rows: int = 0):
    """A figure with a title, a caption and ``nrows x ncols`` panels; room below for a legend of
    ``legend_rows`` rows (``page_legend``)."""
    fig, axes = plt.subplots(nrows, ncols, figsize=PAGE, squeeze=False)
    fig.suptitle(title, fontsize=15, fontweight="bold", x=0.02, ha="left", y=0.975)
    fig.text(0.02, 0.925, sentence, fontsize=10, wrap=True, va="top")
    bottom = 0.10 + 0.032 * legend_rows
    fig.subplots_adjust(top=0.78, bottom=bottom, left=0.07, right=0.98, wspace=0.3, hspace=0.5)
    return fig, axes.ravel()


def from_zero(ax, *, x: bool = False, y: bool = True) -> None:
    """Start magnitude axes at zero (after plotting, so the top follows the data)."""
    if y:
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1e-9))
    if x:
        ax.set_xlim(left=0, right=max(ax.get_xlim()[1], 1e-9))


def plain_ticks(ax, axis: str = "y") -> None:
    """Tick labels as plain numbers with thousands separators (never 1e3 or an offset)."""
    def fmt(value, _pos):
        if value == int(value):
            return f"{int(value):,}"
        return f"{value:,.6g}"
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(FuncFormatter(fmt))
    target.set_major_locator(MaxNLocator(nbins=6))


def page_legend(fig, axes, *, ncol: int | None = None, title: str | None = None) -> None:
    """One legend for the page, below the panels, with each label once."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if not label.startswith("_"):
                handles.setdefault(label, handle)
    if not handles:
        return
    ncol = ncol or min(len(handles), 5)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=8.5,
               frameon=False, title=title, title_fontsize=8.5, bbox_to_anchor=(0.5, 0.005))


def legend_rows(count: int, ncol: int = 5) -> int:
    return -(-count // ncol)


def short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
