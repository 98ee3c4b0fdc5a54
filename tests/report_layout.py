"""Layout checks on rendered matplotlib figures (the report's pages, or any figure).

Each checker draws the figure on the Agg canvas (unless given the ``renderer`` of a figure already
drawn), measures artists in display pixels with ``get_window_extent`` and returns a list of
problems, one string each, naming the page and the axes; an empty list means the figure is clean.

- ``legend_overlaps``: a legend box (axes or figure legend) on top of plotted data: more than
  ``LEGEND_LIMIT`` of one artist's points, line length or area inside the legend's box;
- ``tick_label_overlaps``: two visible tick labels of one axis that overlap (rotated labels are
  compared as rotated rectangles, not as their axis-aligned boxes);
- ``text_overflows``: text (titles, axis labels, figure texts, tick labels, legends, tables) that
  leaves the canvas by more than ``OVERFLOW_PX`` pixels;
- ``block_collisions``: parts of the page overlapping one another: the figure title, the figure
  texts (the caption), figure legends, and each panel's data area, titles, axis and tick labels,
  texts, legend and tables against those of other panels (a colorbar is a panel of its own).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.container import BarContainer
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.path import Path
from matplotlib.text import Text
from matplotlib.transforms import Bbox

LEGEND_LIMIT = 0.02  # share of one artist's data allowed under a legend box
TICK_OVERLAP_PX = 1.0  # labels may touch by this much in each direction
OVERFLOW_PX = 3.0  # text may leave the canvas by this much
BLOCK_OVERLAP_PX = 1.0
LINE_SAMPLES = 20000  # points sampled along a drawn line (by arc length)


# --------------------------------------------------------------------------------------- helpers


def draw(fig) -> Any:
    """Draw ``fig`` on an Agg canvas; returns the renderer the measurements use."""
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _renderer(fig, renderer):
    return draw(fig) if renderer is None else renderer


def axes_name(fig, ax) -> str:
    """How a problem names an axes: its title, else its position and axis labels."""
    for loc in ("center", "left", "right"):
        title = ax.get_title(loc)
        if title:
            return f"axes '{title}'"
    colorbar = getattr(ax, "_colorbar", None)
    parent = getattr(getattr(colorbar, "mappable", None), "axes", None)
    if parent is not None and parent is not ax:
        return f"the colorbar of {axes_name(fig, parent)}"
    index = fig.axes.index(ax) if ax in fig.axes else -1
    labels = ", ".join(f"{k} '{v}'" for k, v in (("xlabel", ax.get_xlabel()), ("ylabel", ax.get_ylabel())) if v)
    kind = "colorbar axes" if colorbar is not None else "axes"
    return f"{kind} #{index}" + (f" ({labels})" if labels else " (untitled)")


def _prefix(page: str) -> str:
    return f"page '{page}': " if page else ""


def _overlap(a: Bbox, b: Bbox) -> tuple[float, float]:
    """Width and height of the intersection of two boxes (<= 0 when they do not meet)."""
    return min(a.x1, b.x1) - max(a.x0, b.x0), min(a.y1, b.y1) - max(a.y0, b.y0)


def _intersection(a: Bbox, b: Bbox) -> Bbox | None:
    w, h = _overlap(a, b)
    if w <= 0 or h <= 0:
        return None
    return Bbox.from_extents(max(a.x0, b.x0), max(a.y0, b.y0), min(a.x1, b.x1), min(a.y1, b.y1))


def _area(box: Bbox | None) -> float:
    return 0.0 if box is None else max(box.width, 0.0) * max(box.height, 0.0)


def _inside(points: np.ndarray, box: Bbox) -> np.ndarray:
    return ((points[:, 0] >= box.x0) & (points[:, 0] <= box.x1)
            & (points[:, 1] >= box.y0) & (points[:, 1] <= box.y1))


def _finite_rows(points: np.ndarray) -> np.ndarray:
    points = np.asarray(np.ma.filled(np.ma.asarray(points, dtype=float), np.nan), dtype=float).reshape(-1, 2)
    return points[np.isfinite(points).all(axis=1)]


def _clip_box(artist, ax) -> Bbox:
    """The region where ``artist`` can show: its axes' box when it is clipped, else everything."""
    if artist.get_clip_on():
        box = artist.get_clip_box()
        return box if box is not None else ax.bbox
    return Bbox.from_extents(-np.inf, -np.inf, np.inf, np.inf)


def _polyline_samples(points: np.ndarray, n: int) -> np.ndarray:
    """Points evenly spaced along the polyline through ``points`` (rows may be NaN: breaks)."""
    good = np.isfinite(points).all(axis=1)
    runs, start = [], None
    for i, ok in enumerate(np.append(good, False)):
        if ok and start is None:
            start = i
        elif not ok and start is not None:
            if i - start >= 2:
                runs.append(points[start:i])
            start = None
    if not runs:
        return np.empty((0, 2))
    lengths = [np.hypot(*np.diff(r, axis=0).T) for r in runs]
    total = sum(float(seg.sum()) for seg in lengths)
    if total <= 0:
        return np.empty((0, 2))
    out = []
    for run, seg in zip(runs, lengths):
        cum = np.concatenate([[0.0], np.cumsum(seg)])
        k = max(2, int(round(n * cum[-1] / total)))
        s = np.linspace(0.0, cum[-1], k)
        out.append(np.column_stack([np.interp(s, cum, run[:, 0]), np.interp(s, cum, run[:, 1])]))
    return np.concatenate(out)


def _drawn_linestyle(line: Line2D) -> bool:
    return line.get_linestyle() not in ("None", "none", " ", "") and line.get_linewidth() > 0


def _polygon_area(poly: np.ndarray) -> float:
    x, y = poly[:, 0], poly[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def _path_area_in(path: Path, box: Bbox) -> float:
    if not np.isfinite(box.extents).all():
        return sum(_polygon_area(p) for p in path.to_polygons(closed_only=True))
    clipped = path.clip_to_bbox(box, inside=True)
    return sum(_polygon_area(p) for p in clipped.to_polygons(closed_only=True) if len(p) >= 3)


def _bounded(box: Bbox, limit: Bbox) -> Bbox | None:
    """``box`` cut to ``limit`` (which may be unbounded)."""
    if not np.isfinite(limit.extents).all():
        return box
    return _intersection(box, limit)


# ------------------------------------------------------------------------------- legend overlaps


def _legends(fig) -> list[tuple[str, Any]]:
    out = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is not None and legend.get_visible():
            out.append((f"the legend of {axes_name(fig, ax)}", legend))
    for k, legend in enumerate(fig.legends):
        if legend.get_visible():
            out.append(("the figure legend" + (f" #{k + 1}" if len(fig.legends) > 1 else ""), legend))
    return out


def _label(artist, kind: str, index: int) -> str:
    label = artist.get_label() if hasattr(artist, "get_label") else ""
    return f"{kind} '{label}'" if label and not label.startswith("_") else f"{kind} #{index + 1}"


def _data_shares(ax, box: Bbox, renderer) -> Iterable[tuple[str, float]]:
    """(artist, share of its visible data inside ``box``) for each data artist of ``ax``."""
    for k, line in enumerate(ax.lines):
        if not line.get_visible():
            continue
        points = np.asarray(line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float)))
        if points.size == 0 or not np.isfinite(points).all(axis=1).any():
            continue
        clip = _clip_box(line, ax)
        shares = []
        if line.get_marker() not in (None, "None", "none", "", " ") or not _drawn_linestyle(line):
            vertices = _finite_rows(points)
            vertices = vertices[_inside(vertices, clip)]
            if len(vertices):
                shares.append(float(_inside(vertices, box).mean()))
        if _drawn_linestyle(line):
            samples = _polyline_samples(points, LINE_SAMPLES)
            samples = samples[_inside(samples, clip)] if len(samples) else samples
            if len(samples):
                shares.append(float(_inside(samples, box).mean()))
        if shares:
            yield _label(line, "line", k), max(shares)
    bars = {id(p): c for c in ax.containers if isinstance(c, BarContainer) for p in c.patches}
    for k, coll in enumerate(ax.collections):
        if not coll.get_visible():
            continue
        clip = _clip_box(coll, ax)
        if isinstance(coll, PathCollection):
            offsets = np.asarray(np.ma.filled(np.ma.asarray(coll.get_offsets(), dtype=float), np.nan), dtype=float)
            if offsets.size == 0:
                continue
            points = _finite_rows(coll.get_offset_transform().transform(offsets.reshape(-1, 2)))
            points = points[_inside(points, clip)]
            if len(points):
                yield _label(coll, "scatter", k), float(_inside(points, box).mean())
        elif isinstance(coll, LineCollection):
            transform = coll.get_transform()
            samples = [_polyline_samples(transform.transform(np.asarray(seg, dtype=float)), 200)
                       for seg in coll.get_segments() if len(seg) >= 2]
            samples = [s for s in samples if len(s)]
            if samples:
                points = np.concatenate(samples)
                points = points[_inside(points, clip)]
                if len(points):
                    yield _label(coll, "lines", k), float(_inside(points, box).mean())
        elif isinstance(coll, PolyCollection):
            transform = coll.get_transform()
            total = under = 0.0
            target = _bounded(box, clip)
            for path in coll.get_paths():
                shown = path.transformed(transform)
                total += _path_area_in(shown, clip)
                if target is not None:
                    under += _path_area_in(shown, target)
            if total >= 1.0:
                yield _label(coll, "filled area", k), under / total
    for k, patch in enumerate(ax.patches):
        if not (isinstance(patch, Rectangle) and patch.get_visible()):
            continue
        extent = patch.get_window_extent(renderer)
        if not np.isfinite(extent.extents).all():
            continue
        shown = _bounded(extent, _clip_box(patch, ax))
        if _area(shown) < 1.0:
            continue
        container = bars.get(id(patch))
        if container is not None:
            index = list(container.patches).index(patch)
            name = _label(container, "bars", 0).replace(" #1", "") + f", bar {index + 1}"
        else:
            name = _label(patch, "rectangle", k)
        yield name, _area(_intersection(shown, box)) / _area(shown)
    for k, image in enumerate(ax.images):
        if isinstance(image, AxesImage) and image.get_visible():
            shown = _bounded(image.get_window_extent(renderer), ax.bbox)
            if _area(shown) >= 1.0:
                yield _label(image, "image", k), _area(_intersection(shown, box)) / _area(shown)
    for k, text in enumerate(ax.texts):
        if text.get_visible() and text.get_text().strip():
            extent = text.get_window_extent(renderer)
            if _area(extent) >= 1.0:
                yield f"text '{_short(text.get_text())}'", _area(_intersection(extent, box)) / _area(extent)


def legend_overlaps(fig, page: str = "", *, renderer=None, limit: float = LEGEND_LIMIT) -> list[str]:
    """Problems where a legend's box covers more than ``limit`` of one artist's plotted data
    (points and line length of lines, scatter points, bar and filled areas, images, texts)."""
    renderer = _renderer(fig, renderer)
    problems = []
    for where, legend in _legends(fig):
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            if not ax.get_visible() or _intersection(box, ax.bbox) is None:
                continue
            for name, share in _data_shares(ax, box, renderer):
                if share > limit:
                    problems.append(f"{_prefix(page)}{where} covers {share:.0%} of {name} in {axes_name(fig, ax)}")
    return problems


# --------------------------------------------------------------------------- tick label overlaps


def visible_tick_labels(axis) -> list[Text]:
    """The tick labels ``axis`` draws: visible, non-empty, at ticks inside the view interval."""
    ax = axis.axes
    if not (ax.get_visible() and ax.axison and axis.get_visible()):
        return []
    lo, hi = sorted(axis.get_transform().transform(np.asarray(axis.get_view_interval(), dtype=float)))
    eps = 1e-6 * max(hi - lo, 1e-300)
    labels = []
    for ticks, locs in ((axis.get_major_ticks, axis.get_majorticklocs()),
                        (axis.get_minor_ticks, axis.get_minorticklocs())):
        for tick, loc in zip(ticks(len(locs)), locs):
            if not tick.get_visible():
                continue
            where = float(axis.get_transform().transform(np.asarray([loc], dtype=float))[0])
            if not (lo - eps <= where <= hi + eps):
                continue
            labels += [t for t in (tick.label1, tick.label2) if t.get_visible() and t.get_text().strip()]
    return labels


def _text_corners(text: Text, renderer) -> np.ndarray:
    """The four corners of ``text``'s (possibly rotated) box in display pixels."""
    extent = text.get_window_extent(renderer)
    angle = text.get_rotation() % 180.0
    if angle in (0.0, 90.0):
        return _box_corners(extent)
    rotation = text.get_rotation()
    try:
        text.set_rotation(0)
        flat = text.get_window_extent(renderer)
    finally:
        text.set_rotation(rotation)
    theta = np.deg2rad(rotation)
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    half = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * [flat.width / 2, flat.height / 2]
    centre = np.array([(extent.x0 + extent.x1) / 2, (extent.y0 + extent.y1) / 2])
    return half @ rot.T + centre


def _penetration(a: np.ndarray, b: np.ndarray) -> float:
    """How deep two convex quadrilaterals overlap: the smallest overlap of their projections on
    the edge normals (separating axes); <= 0 when they are apart."""
    depth = np.inf
    for poly in (a, b):
        for i in range(len(poly)):
            edge = poly[(i + 1) % len(poly)] - poly[i]
            norm = np.hypot(*edge)
            if norm == 0:
                continue
            normal = np.array([-edge[1], edge[0]]) / norm
            pa, pb = a @ normal, b @ normal
            depth = min(depth, min(pa.max(), pb.max()) - max(pa.min(), pb.min()))
    return float(depth)


def tick_label_overlaps(fig, page: str = "", *, renderer=None, tolerance: float = TICK_OVERLAP_PX) -> list[str]:
    """Problems where two tick labels of one axis (x or y, colorbars included) overlap by more than
    ``tolerance`` pixels in every direction."""
    renderer = _renderer(fig, renderer)
    problems = []
    for ax in fig.axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = visible_tick_labels(axis)
            corners = [_text_corners(t, renderer) for t in labels]
            pairs = []
            for i in range(len(labels)):
                for j in range(i + 1, len(labels)):
                    if _penetration(corners[i], corners[j]) > tolerance:
                        pairs.append((labels[i].get_text(), labels[j].get_text()))
            if pairs:
                shown = ", ".join(f"'{_short(a)}' / '{_short(b)}'" for a, b in pairs[:4])
                more = f" and {len(pairs) - 4} more pair(s)" if len(pairs) > 4 else ""
                problems.append(f"{_prefix(page)}{axes_name(fig, ax)}: {name} tick labels overlap: {shown}{more}")
    return problems


# -------------------------------------------------------------------------------- text overflows


def _figure_texts(fig) -> list[tuple[str, Text]]:
    out = [(f"figure {kind}", t) for kind in ("suptitle", "supxlabel", "supylabel")
           if (t := getattr(fig, f"_{kind}", None)) is not None]
    seen = {id(t) for _, t in out}  # the suptitle is in fig.texts too (matplotlib >= 3.10)
    out += [("figure text", t) for t in fig.texts if id(t) not in seen]
    return out


def _short(text: str, width: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def text_overflows(fig, page: str = "", *, renderer=None, tolerance: float = OVERFLOW_PX) -> list[str]:
    """Problems where text (figure title and texts, axes titles, axis labels, tick labels, axes
    texts, legends, tables) leaves the figure canvas by more than ``tolerance`` pixels."""
    renderer = _renderer(fig, renderer)
    canvas = fig.bbox
    items: list[tuple[str, Any]] = list(_figure_texts(fig))
    items += [(f"figure legend #{k + 1}", legend) for k, legend in enumerate(fig.legends)]
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        where = axes_name(fig, ax)
        titles = [ax.title, getattr(ax, "_left_title", None), getattr(ax, "_right_title", None)]
        items += [(f"title of {where}", t) for t in titles if t is not None]
        if ax.axison:
            items += [(f"x label of {where}", ax.xaxis.label), (f"y label of {where}", ax.yaxis.label)]
            items += [(f"x tick labels of {where}", t) for t in visible_tick_labels(ax.xaxis)]
            items += [(f"y tick labels of {where}", t) for t in visible_tick_labels(ax.yaxis)]
        items += [(f"text in {where}", t) for t in ax.texts]
        if ax.get_legend() is not None:
            items.append((f"legend of {where}", ax.get_legend()))
        items += [(f"table in {where}", t) for t in ax.tables]
    found: dict[str, tuple[list[str], dict[str, float]]] = {}  # tick labels of one axis: one problem
    for name, artist in items:
        if not artist.get_visible() or (isinstance(artist, Text) and not artist.get_text().strip()):
            continue
        box = artist.get_window_extent(renderer)
        out = {"left": canvas.x0 - box.x0, "right": box.x1 - canvas.x1,
               "bottom": canvas.y0 - box.y0, "top": box.y1 - canvas.y1}
        over = {side: px for side, px in out.items() if px > tolerance}
        if over:
            texts, sides = found.setdefault(name, ([], {}))
            if isinstance(artist, Text):
                texts.append(f"'{_short(artist.get_text())}'")
            for side, px in over.items():
                sides[side] = max(px, sides.get(side, 0.0))
    problems = []
    for name, (texts, sides) in found.items():
        what = (" " + ", ".join(texts[:5]) + (f" and {len(texts) - 5} more" if len(texts) > 5 else "")) if texts else ""
        past = ", ".join(f"{px:.0f} px past the {side}" for side, px in sides.items())
        problems.append(f"{_prefix(page)}{name}{what} leave{'s' if len(texts) <= 1 else ''} the page: {past}")
    return problems


# ------------------------------------------------------------------------------ block collisions


def _box_corners(box: Bbox) -> np.ndarray:
    return np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]])


def _elements(fig, renderer) -> list[tuple[str, str, np.ndarray]]:
    """(owner, name, corners) of what the page shows: the figure's title, texts and legends (each
    its own owner), and for each axes (colorbars are axes too) its data area when drawn, titles,
    axis labels, tick labels (rotated ones as rotated boxes), texts, legend and tables."""
    out = []
    for name, text in _figure_texts(fig):
        if text.get_visible() and text.get_text().strip():
            label = f"{name} '{_short(text.get_text())}'"
            out.append((label, label, _text_corners(text, renderer)))
    for k, legend in enumerate(fig.legends):
        if legend.get_visible():
            out.append((f"figure legend #{k + 1}", f"figure legend #{k + 1}",
                        _box_corners(legend.get_window_extent(renderer))))
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        owner = axes_name(fig, ax)
        texts = [("title", t) for t in (ax.title, getattr(ax, "_left_title", None), getattr(ax, "_right_title", None))
                 if t is not None]
        if ax.axison:
            out.append((owner, "plot area", _box_corners(ax.bbox)))
            texts += [("x label", ax.xaxis.label), ("y label", ax.yaxis.label)]
            texts += [("x tick label", t) for t in visible_tick_labels(ax.xaxis)]
            texts += [("y tick label", t) for t in visible_tick_labels(ax.yaxis)]
        texts += [("text", t) for t in ax.texts]
        for kind, text in texts:
            if text.get_visible() and text.get_text().strip():
                out.append((owner, f"{kind} '{_short(text.get_text())}'", _text_corners(text, renderer)))
        legend = ax.get_legend()
        if legend is not None and legend.get_visible():
            out.append((owner, "legend", _box_corners(legend.get_window_extent(renderer))))
        out += [(owner, "table", _box_corners(t.get_window_extent(renderer))) for t in ax.tables if t.get_visible()]
    return out


def block_collisions(fig, page: str = "", *, renderer=None, tolerance: float = BLOCK_OVERLAP_PX) -> list[str]:
    """Problems where what one part of the page shows overlaps what another part shows by more
    than ``tolerance`` pixels every way: the figure title, each figure text (the caption), each
    figure legend, and each axes (its data area, titles, axis and tick labels, texts, legend and
    tables; a colorbar is an axes of its own). Parts of one axes may overlap each other."""
    renderer = _renderer(fig, renderer)
    elements = _elements(fig, renderer)
    lows = np.array([c.min(axis=0) for _, _, c in elements]).reshape(-1, 2)
    highs = np.array([c.max(axis=0) for _, _, c in elements]).reshape(-1, 2)
    problems = []
    for i in range(len(elements)):
        near = np.flatnonzero((np.minimum(highs[i], highs[i + 1:]) - np.maximum(lows[i], lows[i + 1:]) > tolerance)
                              .all(axis=1)) + i + 1
        for j in near:
            (owner_a, a, corners_a), (owner_b, b, corners_b) = elements[i], elements[j]
            if owner_a == owner_b:
                continue
            depth = _penetration(corners_a, corners_b)
            if depth > tolerance:
                first = a if a == owner_a else f"{a} of {owner_a}"
                second = b if b == owner_b else f"{b} of {owner_b}"
                problems.append(f"{_prefix(page)}{first} and {second} overlap ({depth:.0f} px deep)")
    return problems


CHECKS = {
    "legend overlaps": legend_overlaps,
    "tick label overlaps": tick_label_overlaps,
    "text overflows": text_overflows,
    "block collisions": block_collisions,
}


def layout_problems(fig, page: str = "") -> dict[str, list[str]]:
    """Every check's problems for ``fig``, drawing it once."""
    renderer = draw(fig)
    return {name: check(fig, page, renderer=renderer) for name, check in CHECKS.items()}
