"""``pagesim report DIR --html report.html``: the report's pages as one self-contained HTML file.

The same ``Page`` list the PDF draws (``pagesim.reports.pdf.report_pages``), so both say the same words:
each page is a ``<section>`` with its title (an anchor the table of contents links to), its
caption, its figure inlined as SVG (a base64 PNG when the SVG would be huge), its table and its
notes (the findings) as a list. Invariants:

- nothing is fetched: no external script, style, font or image; the one script is inline;
- every piece of text is escaped (``html.escape``); header line breaks become ``<br>``;
- the all-runs table, which the PDF splits over pages ("All runs (1 of 2)", ...), is ONE table in
  the first such section, so sorting covers every run; the later pages' titles are named there.
  It is drawn as a table only (the PDF's picture of a table would repeat it), and so is a page
  whose figure is text only (no visible axes: the cover, the summary, the findings, the failed
  runs) and which has a table or notes;
- tables whose header starts with "run" are sortable: a click on a column header sorts by it
  (numbers numerically, after dropping "," and "%" and a trailing " ± x"; "-" last), another
  click reverses; the script ends by setting ``document.body.dataset.ready = "1"``;
- SVG ids are prefixed per figure, so figures inlined side by side never share an id;
- written to ``out + ".tmp"`` and renamed (none left after a failure); figures are left open (the
  caller closes them).
"""

from __future__ import annotations

import base64
import html
import io
import re
from pathlib import Path
from typing import Any, BinaryIO

from pagesim.engine.outputs import OutputFile
from pagesim.reports.style import Page, Table

ALL_RUNS = "All runs"
SVG_LIMIT = 3_000_000  # bytes of SVG per figure above which a PNG is inlined instead

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0 auto;max-width:1300px;
 padding:1em 2em;color:#212529;line-height:1.4}
h1{font-size:1.6em}h2{font-size:1.3em;border-top:1px solid #dee2e6;padding-top:1em;margin-top:2em}
nav ol{columns:2}figure{margin:0}svg,img.fig{max-width:100%;height:auto;display:block}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #dee2e6;padding:.25em .5em;vertical-align:top}
th{background:#e9ecef;text-align:left}
table.sortable td{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.sortable th{cursor:pointer;user-select:none}
table.sortable th[data-dir=asc]::after{content:" \\25B2"}table.sortable th[data-dir=desc]::after{content:" \\25BC"}
tbody tr:nth-child(even){background:#f8f9fa}.note{color:#6c757d;font-size:.9em}.wide{overflow-x:auto}
"""

SCRIPT = r"""
(function () {
  function key(text, asText) {
    var t = text.trim();
    if (t === "-" || t === "") return null;
    if (asText) return t;
    var s = t.replace(/\s*\u00b1.*$/, "").replace(/[,%]/g, "").trim();
    var n = Number(s);
    return s === "" || isNaN(n) ? t : n;
  }
  function order(a, b, dir) {
    if (a === null || b === null) return a === b ? 0 : (a === null ? 1 : -1);  // "-" last either way
    if (typeof a !== typeof b) return dir * (typeof a === "number" ? -1 : 1);  // numbers before words
    return dir * (a < b ? -1 : a > b ? 1 : 0);
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, col) {
      th.addEventListener("click", function () {
        var dir = th.dataset.dir === "asc" ? -1 : 1;
        Array.prototype.forEach.call(heads, function (h) { delete h.dataset.dir; });
        th.dataset.dir = dir === 1 ? "asc" : "desc";
        var body = table.tBodies[0], asText = th.dataset.type === "text";
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (r, s) {
          return order(key(r.cells[col].textContent, asText), key(s.cells[col].textContent, asText), dir);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  document.body.dataset.ready = "1";
})();
"""


def _save(fig, buf, **kwargs) -> None:
    """Save without the page's title and caption (the section's heading and paragraph say them),
    cropped to what is left; the figure is as it was afterwards."""
    hidden = [t for t in (*fig.texts, fig._suptitle) if t is not None and t.get_visible()]
    for t in hidden:
        t.set_visible(False)
    try:
        fig.savefig(buf, bbox_inches="tight", pad_inches=0.1, **kwargs)
    finally:
        for t in hidden:
            t.set_visible(True)


def _svg(fig, prefix: str) -> str:
    buf = io.StringIO()
    _save(fig, buf, format="svg")
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE
    ids = set(re.findall(r'\bid="([^"]+)"', text))
    if ids:
        text = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', text)
        text = re.sub(r'#([A-Za-z_][\w.\-]*)', lambda m: f"#{prefix}{m.group(1)}" if m.group(1) in ids else m.group(0),
                      text)
    return text


def _figure(fig, prefix: str) -> str:
    svg = _svg(fig, prefix)
    if len(svg.encode()) <= SVG_LIMIT:
        return f"<figure>{svg}</figure>"
    buf = io.BytesIO()
    _save(fig, buf, format="png", dpi=110)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<figure><img class="fig" alt="figure" src="data:image/png;base64,{data}"></figure>'


def _header_cell(text: str, col: int, sortable: bool) -> str:
    label = "<br>".join(html.escape(line) for line in text.split("\n"))
    kind = ' data-type="text"' if sortable and col == 0 else ""  # run ids are words, even all-digit ones
    title = ' title="click to sort"' if sortable else ""
    return f"<th{kind}{title}>{label}</th>"


def _table(table: Table) -> str:
    sortable = bool(table.header) and table.header[0].startswith("run")
    head = "".join(_header_cell(h, j, sortable) for j, h in enumerate(table.header))
    body = "\n".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in table.rows)
    cls = ' class="sortable"' if sortable else ""
    return f'<div class="wide"><table{cls}><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table></div>'


def _slug(k: int, title: str) -> str:
    return f"p{k}-" + (re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40] or "page")


def _section(k: int, page: Page, folded: list[str]) -> str:
    parts = [f'<section id="{_slug(k, page.title)}">']
    if page.title.startswith(ALL_RUNS):
        title = ALL_RUNS if len(folded) > 1 else page.title
        caption = page.caption
        if page.table is not None:  # the first PDF page's "rows 1-26 of 40" is now the whole table
            n = len(page.table.rows)
            caption = re.sub(r"rows \d+-\d+ of (\d+)", f"rows 1-{n} of {n}", caption, count=1)
        parts += [f"<h2>{html.escape(title)}</h2>", f"<p>{html.escape(caption)}</p>"]
        if len(folded) > 1:
            parts.append(f'<p class="note">One table here; in the PDF it spans the pages '
                         f'{html.escape(", ".join(folded))}. Click a column header to sort.</p>')
    else:
        parts += [f"<h2>{html.escape(page.title)}</h2>", f"<p>{html.escape(page.caption)}</p>"]
        drawn = any(ax.axison for ax in page.figure.axes)
        if drawn or (page.table is None and not page.notes):  # a text-only figure repeats the table or notes
            parts.append(_figure(page.figure, f"f{k}-"))
    if page.table is not None:
        parts.append(_table(page.table))
    if page.notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in page.notes) + "</ul>")
    parts.append("</section>")
    return "\n".join(parts)


class HtmlReport:
    """The report built a page at a time, so the caller can close each figure once it is drawn
    (``add`` renders the page's figure at once); consecutive "All runs" pages fold into one table."""

    def __init__(self, meta: dict[str, Any]):
        self.meta = meta
        self._sections: list[str] = []
        self._toc: list[str] = []
        self._runs: tuple[Page, list[str]] | None = None  # the all-runs table being gathered

    def add(self, page: Page) -> None:
        if page.title.startswith(ALL_RUNS) and page.table is not None:
            if self._runs is not None:
                self._runs[0].table.rows.extend(page.table.rows)
                self._runs[1].append(page.title)
                return
            # a copy (the caller's page stays as it was) without the figure: the table is drawn as HTML
            table = Table(list(page.table.header), list(page.table.rows))
            self._runs = (Page(page.title, page.caption, None, table, list(page.notes)), [page.title])
            return
        self._flush_runs()
        self._append(page, [page.title])

    def _flush_runs(self) -> None:
        if self._runs is not None:
            page, folded = self._runs
            self._runs = None
            self._append(page, folded)

    def _append(self, page: Page, folded: list[str]) -> None:
        k = len(self._sections)
        self._sections.append(_section(k, page, folded))
        self._toc.append(f'<li><a href="#{_slug(k, page.title)}">'
                         f'{html.escape(ALL_RUNS if len(folded) > 1 else page.title)}</a></li>')

    def render(self) -> str:
        self._flush_runs()
        name = self.meta.get("title") or f"pagesim study: {self.meta['name']}"
        toc, sections = "\n".join(self._toc), "\n".join(self._sections)
        return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
                f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
                f"<title>{html.escape(name)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
                f"<h1>{html.escape(name)}</h1>\n<nav><h2>Contents</h2><ol>\n{toc}\n</ol></nav>\n"
                f"{sections}\n<script>{SCRIPT}</script>\n</body>\n</html>\n")

    def write(self, out: str | Path | OutputFile) -> None:
        """Write the HTML file at ``out`` (atomically, a failure leaving no temporary file; or as a
        stream to a device or FIFO: ``pagesim.engine.outputs``)."""
        output = out if isinstance(out, OutputFile) else OutputFile(out)
        with output.open(text=False) as fh:
            self.save(fh)

    def save(self, dest: Path | BinaryIO) -> None:
        """Write the HTML file into ``dest``: a path itself, or a binary file open for writing
        (the caller puts it in place)."""
        data = self.render().encode("utf-8")
        if isinstance(dest, (str, Path)):
            Path(dest).write_bytes(data)
        else:
            dest.write(data)


def write_html(pages: list[Page], out: str | Path, meta: dict[str, Any]) -> None:
    """Write the report's pages as one HTML file at ``out`` (atomically)."""
    report = HtmlReport(meta)
    for page in pages:
        report.add(page)
    report.write(out)
