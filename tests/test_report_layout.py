"""The report's pages are readable: no legend on the data, no overlapping tick labels, no text
off the page, no blocks (title, caption, legend, panels) on top of one another; every page draws.

The checks (``tests/report_layout.py``) measure the drawn matplotlib figures of
``pagesim.reports.pdf.report_pages`` for two studies: the demo preset with fewer requests (every kind of
page: 3-axis small multiples, 2-axis heatmaps, 1-axis bars, load curves, time series, stack plots,
preemption bars, prefix-cache lines, tables) and a study with one 2-D grid. The checkers are
themselves tested on figures built to fail and to pass.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from tests.report_layout import (  # noqa: E402
    _text_corners,
    block_collisions,
    draw,
    layout_problems,
    legend_overlaps,
    text_overflows,
    tick_label_overlaps,
    visible_tick_labels,
)

TWO_AXES = 'block_size = [8, 16, 32]\neviction = ["lru", "fifo"]\n'


def _spec(name: str):
    from pagesim.reports.spec import parse_spec

    if name == "demo":
        from pagesim.reports.presets import DEMO

        return parse_spec(DEMO, ["source.num_requests=120", "source.rate=6.0"], origin="demo")  # rate 6: preempts
    from tests.test_study import SMALL

    return parse_spec(SMALL.split("[[grid]]")[0] + "[[grid]]\n" + TWO_AXES)


@dataclass
class Checked:
    """A study's report pages, checked and drawn: (title, {check: problems}, PNG bytes) each."""

    study: str
    pages: list[tuple[str, dict[str, list[str]], bytes]] = field(default_factory=list, repr=False)
    legends: int = 0
    tick_labels: int = 0
    moved: dict[str, list[str]] = field(default_factory=dict)  # legend overlaps with the legend moved

    def problems(self, check: str) -> list[str]:
        return [p for _, problems, _ in self.pages for p in problems[check]]


def _data_point(fig):
    """A point (display pixels) on the page's data: the middle point of the first line with points,
    else the centre of the first bar with a height, else the middle of a filled area's panel."""
    for ax in fig.axes:
        for line in ax.lines:
            xy = np.asarray(line.get_xydata(), dtype=float)
            xy = xy[np.isfinite(xy).all(axis=1)]
            if len(xy) >= 2:
                return line.get_transform().transform(xy[len(xy) // 2])
    for ax in fig.axes:
        for bar in ax.patches:
            if isinstance(bar, Rectangle) and np.isfinite(bar.get_height()) and bar.get_height() > 0:
                return ax.transData.transform((bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height() / 2))
    for ax in fig.axes:
        if any(isinstance(c, PolyCollection) for c in ax.collections):
            return ax.bbox.corners().mean(axis=0)
    return None


def _legend_onto_data(fig) -> bool:
    """Centre the page's (first) figure legend on a point of its data; False when it has none."""
    where = _data_point(fig)
    if where is None:
        return False
    fig.legends[0].set_bbox_to_anchor(tuple(fig.transFigure.inverted().transform(where)))
    fig.legends[0].set_loc("center")
    return True


@pytest.fixture(scope="module", params=["demo", "two-axes"])
def checked(request, tmp_path_factory) -> Checked:
    """Build the study, make its report pages, check and draw each page once, close the figures."""
    from pagesim.reports.execute import run_study
    from pagesim.reports.pdf import report_pages
    from pagesim.reports.results import load_study

    out = tmp_path_factory.mktemp(request.param)
    run_study(_spec(request.param), out, workers=2, progress=False)
    study = load_study(out)
    assert study.ok and not study.failed, [r.get("error") for r in study.failed]
    pages = report_pages(study)
    result = Checked(request.param)
    try:
        for page in pages:
            fig = page.figure
            problems = layout_problems(fig, page.title)
            result.legends += len(fig.legends) + sum(ax.get_legend() is not None for ax in fig.axes)
            result.tick_labels += sum(len(visible_tick_labels(axis)) for ax in fig.axes
                                      for axis in (ax.xaxis, ax.yaxis))
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=50)
            result.pages.append((page.title, problems, buf.getvalue()))
            if fig.legends and _legend_onto_data(fig):  # last, as it spoils the page
                result.moved[page.title] = legend_overlaps(fig, page.title, renderer=fig.canvas.get_renderer())
    finally:
        for page in pages:
            plt.close(page.figure)
    return result


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
def test_every_page_draws_to_png(checked):
    assert len(checked.pages) >= 4
    for title, _, png in checked.pages:
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000, title
    if checked.study == "demo":  # the checks below would pass vacuously on pages without these
        assert checked.legends >= 5 and checked.tick_labels >= 200
        titles = [title for title, _, _ in checked.pages]
        for kind in ("All runs", "Findings", "per Preemption mode", "Block size × Rate scale", "per allocator",
                     "Throughput vs tail latency", "Goodput vs request rate", "Latency distributions",
                     "Queue, batch and memory", "KV-cache memory over time", "Preemptions: swap vs recompute",
                     "Prefix hit rate and throughput vs cache size"):
            assert any(kind in title for title in titles), kind


def test_a_page_legend_moved_onto_the_data_is_found(checked):
    """The legend check measures the pages' own artists (lines, scatters, bars, stacks)."""
    if checked.study == "demo":
        assert len(checked.moved) >= 5
    missed = [title for title, problems in checked.moved.items() if not problems]
    assert not missed, missed


def test_no_legend_covers_data(checked):
    problems = checked.problems("legend overlaps")
    assert not problems, "legends on top of data:\n" + "\n".join(problems)


def test_no_tick_labels_overlap(checked):
    problems = checked.problems("tick label overlaps")
    assert not problems, "overlapping tick labels:\n" + "\n".join(problems)


def test_no_text_leaves_the_page(checked):
    problems = checked.problems("text overflows")
    assert not problems, "text off the page:\n" + "\n".join(problems)


def test_no_blocks_collide(checked):
    problems = checked.problems("block collisions")
    assert not problems, "title, caption, legend or panels on top of one another:\n" + "\n".join(problems)


# ------------------------------------------------------------------- the checkers find what they should


@pytest.fixture
def fig():
    figure = plt.figure(figsize=(6, 4))
    yield figure
    plt.close(figure)


def test_legend_on_a_line_through_the_centre_is_found(fig):
    ax = fig.add_subplot()
    ax.plot(range(10))
    ax.legend(["x"], loc="center")
    ax.set_title("diagonal")
    problems = legend_overlaps(fig, "P")
    assert len(problems) == 1, problems
    assert problems[0].startswith("page 'P': the legend of axes 'diagonal' covers")
    assert problems[0].endswith("of line #1 in axes 'diagonal'")


def test_legend_on_dense_points_is_found(fig):
    ax = fig.add_subplot()
    x = np.linspace(0, 9, 500)
    ax.plot(x, x, "o", ms=2, label="points")
    ax.legend(loc="center")
    assert legend_overlaps(fig)


@pytest.mark.parametrize("kind", ["scatter", "bars", "stack", "image", "figure legend"])
def test_legend_on_other_kinds_of_data_is_found(fig, kind):
    ax = fig.add_subplot()
    rng = np.random.default_rng(0)
    if kind == "scatter":
        ax.scatter(rng.normal(0, 1, 400), rng.normal(0, 1, 400), label="s")  # dense at the centre
    elif kind == "bars":
        ax.bar(range(8), [5] * 8, yerr=[1] * 8, label="b")  # error bars: a LineCollection, measured too
    elif kind == "stack":
        t = np.linspace(0, 1, 50)
        ax.stackplot(t, t, 1 - t, np.ones_like(t), labels=["a", "b", "c"])
    elif kind == "image":
        ax.imshow(rng.uniform(size=(4, 4)))
        ax.plot([], [], label="nothing")
    elif kind == "figure legend":
        ax.plot(np.linspace(0, 1, 200), np.linspace(0, 1, 200), label="d")
    if kind == "figure legend":
        fig.legend(loc="center")
    else:
        ax.legend(loc="center")
    assert legend_overlaps(fig), kind


def test_legend_outside_or_clear_of_the_data_is_not_reported(fig):
    a, b = fig.subplots(1, 2)
    x = np.linspace(0, 10, 300)
    a.plot(x, x / 10, label="low line")  # stays in the bottom tenth; the legend sits at the top
    a.set_ylim(0, 10)
    a.plot([np.nan, np.nan], [np.nan, np.nan], label="_nothing")  # no points: skipped
    a.scatter([], [], label="empty handle")  # legend-only handle: skipped
    a.legend(loc="upper left")
    b.bar(range(4), [1, 2, 3, 4], label="bars")
    b.stackplot(x, np.ones_like(x) * 0.2, labels=["band"])
    fig.subplots_adjust(bottom=0.3)
    fig.legend(loc="lower center", ncol=3)
    assert legend_overlaps(fig, "clean") == []


def test_crowded_tick_labels_are_found(fig):
    ax = fig.add_axes([0.1, 0.3, 0.35, 0.6])
    ax.bar(range(40), np.arange(40))
    ax.set_xticks(range(40), [f"a long category name {i}" for i in range(40)])
    ax.set_title("crowded")
    problems = tick_label_overlaps(fig, "P")
    assert len(problems) == 1 and "axes 'crowded'" in problems[0] and ": x tick labels overlap" in problems[0]


def test_rotated_tick_labels_are_compared_as_rotated_boxes(fig):
    wide, crowded = fig.add_axes([0.05, 0.55, 0.9, 0.3]), fig.add_axes([0.05, 0.1, 0.25, 0.3])
    for ax, n in ((wide, 8), (crowded, 30)):
        ax.bar(range(n), np.ones(n))
        ax.set_xticks(range(n), [f"setting number {i} here" for i in range(n)], rotation=40, ha="right")
    wide.set_title("wide")
    crowded.set_title("crowded")
    renderer = draw(fig)
    # the labels of the wide axes are clear of each other, though their upright boxes intersect
    first, second = visible_tick_labels(wide.xaxis)[:2]
    a, b = first.get_window_extent(renderer), second.get_window_extent(renderer)
    assert a.overlaps(b)
    assert np.allclose(sorted(_text_corners(first, renderer)[:, 0])[::3], [a.x0, a.x1], atol=1)
    problems = tick_label_overlaps(fig, renderer=renderer)
    assert len(problems) == 1 and "axes 'crowded'" in problems[0], problems


def test_sparse_tick_labels_and_colorbars_are_not_reported(fig):
    ax = fig.add_subplot()
    image = ax.imshow(np.arange(12).reshape(3, 4))
    ax.set_xticks(range(4), ["lru", "fifo", "lfu", "radix-leaf"])
    fig.colorbar(image, ax=ax).set_label("value (units)")
    assert tick_label_overlaps(fig) == []


def test_text_off_the_page_is_found_and_wrapped_text_is_not(fig):
    ax = fig.add_subplot()
    ax.plot([0, 1])
    ax.set_title("panel")
    sentence = "a sentence long enough to run past the right edge of a six inch wide figure " * 2
    fig.text(0.05, 0.98, sentence, wrap=True, va="top")  # wrapped: stays on the page
    assert text_overflows(fig, "P") == []
    fig.text(0.6, 0.5, sentence)
    problems = text_overflows(fig, "P")
    assert len(problems) == 1 and "page 'P': figure text" in problems[0] and "past the right" in problems[0]


def test_colliding_blocks_are_found(fig):
    ax = fig.add_subplot()
    ax.plot([0, 1])
    ax.set_title("panel")
    fig.suptitle("title")
    assert block_collisions(fig) == []
    fig.text(0.3, 0.5, "a caption placed on the panel")
    problems = block_collisions(fig, "P")
    assert len(problems) == 1, problems
    assert problems[0].startswith("page 'P': figure text 'a caption placed on the panel' and plot area of axes 'panel'")


def test_layout_problems_runs_every_check(fig):
    ax = fig.add_subplot()
    ax.plot(range(10))
    ax.legend(["x"], loc="center")
    found = layout_problems(fig, "P")
    assert set(found) == {"legend overlaps", "tick label overlaps", "text overflows", "block collisions"}
    assert found["legend overlaps"] and not found["tick label overlaps"]


def test_neighbouring_panels_collide_only_where_their_parts_meet(fig):
    left, right = fig.add_axes([0.1, 0.25, 0.36, 0.65]), fig.add_axes([0.6, 0.25, 0.36, 0.65])
    for ax, name in ((left, "left"), (right, "right")):
        ax.plot([0, 1])
        ax.set_title(name)
    left.set_xlabel("a label wider than its panel, reaching past its edge")
    right.set_ylabel("value (units)")
    renderer = draw(fig)
    # the panels' outer boxes meet (the left x label is below the right y label), their parts do not
    assert left.get_tightbbox(renderer).x1 > right.get_tightbbox(renderer).x0
    assert block_collisions(fig, renderer=renderer) == []
    right.set_yticks([0, 0.5, 1], ["a tick label long enough to reach the left panel"] * 3)
    problems = block_collisions(fig, "P")
    assert problems and all("y tick label" in p and "of axes 'right'" in p and "axes 'left'" in p for p in problems)


def test_a_colorbar_label_off_the_right_edge_is_found(fig):
    ax = fig.add_subplot()
    fig.subplots_adjust(right=0.98)
    image = ax.imshow(np.arange(12).reshape(3, 4) * 100, aspect="auto")
    ax.set_title("heat")
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03).set_label("a colorbar label (units); higher is better")
    problems = text_overflows(fig, "P")
    assert problems and all("the colorbar of axes 'heat'" in p and "past the right" in p for p in problems), problems
