"""Report pages for a paper preset: the paper's numbers beside this study's (``paper = "kwon2023"``).

PagedAttention (Kwon et al., SOSP 2023): Fig. 2 (share of allocated KV memory holding tokens,
ShareGPT at 2 req/s), Fig. 13 (average batched requests, ShareGPT at 2 and Alpaca at 30 req/s),
Fig. 15 (memory saved by sharing with parallel sampling and beam search), and two plots the paper
gives without numbers: Fig. 18b (normalized latency vs block size) and Fig. 19 (swap vs
recompute). The paper's values are ``pagesim.sim.paper.PAPER``; what the runs mean is in ``pagesim/sim/paper.py``.
"""

from __future__ import annotations

from pagesim.reports.results import Study, metric
from pagesim.reports.style import Page, Table, from_zero, new_page

SYSTEMS = (("Orca (Max)", "max"), ("Orca (Pow2)", "pow2"), ("Orca (Oracle)", "oracle"), ("vLLM / pagesim", "paged"))
WORKLOADS = {"ShareGPT @ 2 req/s": {}, "Alpaca @ 30 req/s": {"workload": "kwon2023-alpaca", "rate": 30.0}}


def _one(study: Study, vary: tuple[str, ...] = (), **fixed) -> dict | None:
    runs = study.slice(*vary, **fixed)
    match = [r for r in runs if all(r["config"].get(k) == v for k, v in fixed.items())]
    return match[0] if match else None


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def comparison_rows(study: Study) -> list[list[str]]:
    from pagesim.sim.paper import PAPER

    rows = []
    for label, allocator in SYSTEMS:
        r = _one(study, ("allocator",), allocator=allocator)
        rows.append(["Fig. 2 memory holding tokens (of allocated), ShareGPT @ 2", label,
                     _cell(PAPER["fig2_memory_utilization"][allocator], ".1%"),
                     _cell(metric(r, "memory_utilization") if r else None, ".1%")])
    for (wl_label, fixed), key in zip(WORKLOADS.items(), ("sharegpt@2", "alpaca@30")):
        vary = ("allocator", *fixed)
        for label, allocator in SYSTEMS:
            r = _one(study, vary, allocator=allocator, **fixed)
            rows.append([f"Fig. 13 batched requests, {wl_label}", label,
                         _cell(PAPER["fig13_batched_requests"][key][allocator], ".2f"),
                         _cell(metric(r, "avg_running_requests") if r else None, ".2f")])
    for kind, field in (("parallel n", "n"), ("beam width", "beam_width")):
        for k in (2, 4, 6):
            runs = [r for r in study.ok if r["config"].get(field) == k]
            value = metric(runs[0], "sharing_saved") if runs else None
            rows.append(["Fig. 15 memory saved by sharing, Alpaca", f"{kind}={k}",
                         _cell(PAPER["fig15_sharing_saved"][f"{kind}={k}"], ".1%"), _cell(value, ".1%")])
    return rows


def paper_pages(study: Study) -> list[Page]:
    if study.meta.get("paper") != "kwon2023":
        raise ValueError(f"no comparison pages for paper {study.meta.get('paper')!r} (known: kwon2023)")
    return [_table_page(study), _plots_page(study)]


TABLE_CAPTION = ("OPT-13B on one A100 40 GB with 12 GiB of KV cache; vLLM is pagesim's vllm-v0 preset, the Orca "
                 "baselines reserve the maximum, the next power of two or the true length. The per-step engine "
                 "overhead is fitted to one value (vLLM, ShareGPT @ 2, Fig. 13); every other number is a prediction "
                 "(see pagesim/sim/paper.py).")
PLOTS_CAPTION = (
    "The paper plots these without numbers: normalized latency is lowest for block sizes 16 to 128 "
    "(small blocks use the GPU poorly, large ones waste memory and share less); swapping is costly at "
    "small block sizes, where it moves many small blocks, while recomputation's cost does not depend on "
    "block size, and for block sizes 16 to 64 the two perform comparably end to end. Ours, from this "
    "study's runs:")


def _table_page(study: Study) -> Page:
    title = "Paper comparison: PagedAttention (Kwon et al., SOSP 2023), the paper's numbers beside ours"
    fig, (ax,) = new_page(title, TABLE_CAPTION, ncols=1)
    ax.axis("off")
    rows = comparison_rows(study)
    table = ax.table(cellText=rows, colLabels=["figure", "system / setting", "paper", "pagesim"], loc="upper center",
                     cellLoc="left", colWidths=[0.5, 0.2, 0.12, 0.12])
    table.auto_set_font_size(False)
    table.set_fontsize(8.5)
    table.scale(1, 1.25)
    return Page(title, TABLE_CAPTION, fig, Table(["figure", "system / setting", "paper", "pagesim"], rows))


def _plots_page(study: Study) -> Page:
    title = "Paper comparison: block size (Fig. 18b) and swap vs recompute (Fig. 19)"
    fig, (a, b) = new_page(title, PLOTS_CAPTION, legend_rows=3)
    for wl_label, fixed in WORKLOADS.items():
        runs = sorted(study.slice("block_size", *fixed, **fixed), key=lambda r: r["config"]["block_size"])
        runs = [r for r in runs if all(r["config"].get(k) == v for k, v in fixed.items())]
        if runs:
            a.plot([r["config"]["block_size"] for r in runs],
                   [metric(r, "normalized_latency_s_per_token") for r in runs], marker="o", label=wl_label)
    a.set_xscale("log", base=2)
    a.set_xticks([1, 2, 4, 8, 16, 32, 64, 128, 256], ["1", "2", "4", "8", "16", "32", "64", "128", "256"])
    a.set(xlabel="block size (tokens)", ylabel="normalized latency (s/token)", title="Fig. 18b: block size")
    a.grid(alpha=0.3)
    a.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, frameon=False)
    runs = study.slice("block_size", "preemption", "rate")  # the Fig. 19 grid runs at its own rate
    for mode in ("swap", "recompute"):
        pts = sorted((r["config"]["block_size"], metric(r, "normalized_latency_s_per_token"))
                     for r in runs if r["config"]["preemption"] == mode)
        if pts:
            b.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
    b.set_xscale("log", base=2)
    b.set_xticks([8, 16, 32, 64, 128, 256], ["8", "16", "32", "64", "128", "256"])
    b.set(xlabel="block size (tokens)", ylabel="normalized latency (s/token)",
          title="Fig. 19: preemption by swap vs recompute")
    b.grid(alpha=0.3)
    if b.lines:
        b.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, frameon=False)
    else:
        b.text(0.5, 0.5, "no preemption runs in this study", ha="center", transform=b.transAxes)
    for ax in (a, b):
        from_zero(ax)
    return Page(title, PLOTS_CAPTION, fig)
