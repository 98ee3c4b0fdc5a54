"""The HTML report: every page, one all-runs table with every run, self-contained, and its script runs."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from pagesim.reports.execute import run_study
from pagesim.reports.pdf import build_report
from pagesim.reports.results import load_study
from pagesim.reports.spec import parse_spec
from tests.test_study import SMALL

# vLLM 0.6.3's swap with no swap space, under load: a run that fails while it runs (one that cannot be
# built, such as a max_model_len past the context, is refused before the study starts)
FAILS_WHILE_RUNNING = ("[[grid]]\nswap_space_gb = [0.0]\nrate_scale = [5.0]\nkv_cache_gb = [0.5]\npolicy = ['vllm-v0']\n"
                       "preemption = ['swap']\nprefix_caching = [false]\n")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    run_study(parse_spec(SMALL + FAILS_WHILE_RUNNING), out, workers=2, progress=False)  # one run fails
    path = out / "report" / "report.html"
    titles = build_report(out, None, html=path)
    prefixes = [r["id"][:8] for r in load_study(out).records]
    return path, titles, prefixes


def _all_runs_rows(text: str) -> list[list[str]]:
    tables = re.findall(r'<table class="sortable">.*?</table>', text, flags=re.S)
    runs = [t for t in tables if re.search(r"<thead><tr><th[^>]*>run</th>", t) and re.search(r"<th[^>]*>load</th>", t)]
    assert len(runs) == 1, "one all-runs table"
    return [re.findall(r"<td>([^<]*)</td>", row) for row in re.findall(r"<tr><td>.*?</tr>", runs[0])]


def _number(cell: str) -> float:
    return float(cell.split(" ±")[0].replace(",", "").replace("%", ""))


def test_every_page_and_every_run(report):
    path, titles, prefixes = report
    text = path.read_text(encoding="utf-8")
    assert not path.with_name(path.name + ".tmp").exists()
    assert "<title>pagesim study: small</title>" in text
    for title in titles:
        assert title.replace("&", "&amp;") in text, title
    rows = [row[0] for row in _all_runs_rows(text)]
    assert sorted(rows) == sorted(prefixes) and len(rows) == len(prefixes) > 0
    assert "Failed runs" in titles
    assert text.count("<section") == len(text.split("<nav>")[1].split("</nav>")[0].split("<li>")) - 1


def test_self_contained(report):
    text = report[0].read_text(encoding="utf-8")
    for bad in ("<script src", "<link", 'src="http', "@import", "<?xml", "<!DOCTYPE svg"):
        assert bad not in text, bad
    assert "<svg" in text or "data:image/png;base64" in text
    ids = re.findall(r'\bid="([^"]+)"', text)
    assert len(ids) == len(set(ids)), "an id used twice"


def test_split_all_runs_pages_become_one_table(tmp_path):
    from pagesim.reports import html as report_html
    from pagesim.reports.style import Page, Table

    header = ["run", "block_\nsize", "load", "throughput\n(tok/s)"]
    pages = [Page("All runs (1 of 2)", "Every run: rows 1-2 of 3.", None, Table(header, [["aa", "8", "past", "1,200"], ["bb", "16", "failed", "-"]])),
             Page("All runs (2 of 2)", "Every run: rows 3-3 of 3.", None, Table(header, [["cc", "8", "near", "900 ± 12"]]))]
    report_html.write_html(pages, tmp_path / "r.html", {"name": "x<y"})
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert [row[0] for row in _all_runs_rows(text)] == ["aa", "bb", "cc"]
    assert "rows 1-3 of 3" in text and "All runs (2 of 2)" in text and "pagesim study: x&lt;y" in text
    assert "block_<br>size" in text
    assert len(pages[0].table.rows) == 2, "the caller's pages are left as they were"


CLICK = """<script>
(function () {
  var table = document.querySelector("table.sortable"), th = table.tHead.rows[0].cells[COL], out = [];
  for (var k = 0; k < 2; k++) {
    th.click();
    out.push(Array.prototype.map.call(table.tBodies[0].rows, function (r) { return r.cells[0].textContent; }).join(","));
  }
  document.body.dataset.sorted = out.join(";");
})();
</script>
</body>"""


def _dom(path) -> str:
    return subprocess.run([shutil.which("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                           path.resolve().as_uri()], capture_output=True, text=True, timeout=60).stdout


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium to run the page's script")
def test_headless_browser_runs_the_script_and_sorts(report, tmp_path):
    path, _, prefixes = report
    # the report as written plus a script after its own that clicks the throughput header twice:
    # ascending by number with "-" (the failed run) last, then descending, "-" still last
    text = path.read_text(encoding="utf-8")
    rows = _all_runs_rows(text)
    header = re.search(r'<table class="sortable">.*?</thead>', text, flags=re.S).group(0)
    col = [h.split("<br>")[0] for h in re.findall(r"<th[^>]*>(.*?)</th>", header)].index("throughput")
    clicked = tmp_path / "clicked.html"
    clicked.write_text(text.replace("</body>", CLICK.replace("COL", str(col))), encoding="utf-8")
    dom = _dom(clicked)
    assert 'data-ready="1"' in dom, "the report's script did not run to its end"
    for prefix in prefixes:
        assert prefix in dom, prefix
    up, down = re.search(r'data-sorted="([^"]*)"', dom).group(1).split(";")
    done = [r for r in rows if r[col] != "-"]
    failed = [r[0] for r in rows if r[col] == "-"]
    assert failed, "the failing run shows '-'"
    assert up.split(",")[-len(failed):] == failed and down.split(",")[-len(failed):] == failed
    values = {r[0]: _number(r[col]) for r in done}
    ups = [values[i] for i in up.split(",")[:len(done)]]
    downs = [values[i] for i in down.split(",")[:len(done)]]
    assert ups == sorted(ups) and downs == sorted(downs, reverse=True) and ups[0] < ups[-1]
