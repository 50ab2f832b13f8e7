"""Human-readable reports of a batch-size sweep: CSV, JSON, four plots and a Markdown summary.

A sweep runs the same load for max batch sizes 1, 2, 4, ... (optionally several queue delays) and records
one row per setting (schema in `ROW_KEYS` and the module's callers). `recommend` picks the setting to deploy;
`write_sweep_report` writes everything a person reads. Both are pure functions of the rows.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from tritonkit.files import write_bytes_atomic
from tritonkit.input_rules import edges_text
from tritonkit.plots import pyplot
from tritonkit.slo import ERROR_BOUND, meets

MAX_ERROR_RATE = ERROR_BOUND  # a setting that drops more of its requests is not a candidate
REQUIRED_KEYS = ("max_batch_size", "max_queue_delay_us", "requests", "throughput_rps", "p95_ms", "p99_ms")
SERVER_PARTS = ("queue_ms", "compute_input_ms", "compute_infer_ms", "compute_output_ms")
PLOTS = ("throughput.png", "latency.png", "decomposition.png", "batch_histograms.png")

Row = dict


# ---------------------------------------------------------------- recommendation


def error_count(row: Row) -> int:
    return int(sum((row.get("errors") or {}).values()))


def _error_rate_ok(row: Row) -> bool:
    requests = row.get("requests") or 0
    return requests > 0 and error_count(row) <= MAX_ERROR_RATE * requests


def _padding(row: Row, lead: str = ", padded to ") -> str:
    """A row that swept bucket edges: what its requests were padded to, after `lead`."""
    return "" if row.get("bucket_edges") is None else f"{lead}{edges_text(row['bucket_edges'])}"


def _swept_padding(rows: Sequence[Row]) -> bool:
    return any("bucket_edges" in r for r in rows)


def _setting(row: Row) -> str:
    return f"max batch size {row['max_batch_size']} with a {row['max_queue_delay_us']} µs queue delay{_padding(row)}"


def recommend(rows: Sequence[Row], slo_p95_ms: float | None, max_rss_mb: float | None = None,
              headroom: float = 0.2) -> tuple[Row | None, str]:
    """The highest-throughput row meeting the P95 SLO, the error limit and the memory budget.

    Ties go to the lower P95. Returns (row, why) or (None, why no row qualifies).
    """
    if not rows:
        return None, "No sweep rows to choose from."
    rss_limit = max_rss_mb * (1 - headroom) if max_rss_mb is not None else None
    checks = {
        "errors": _error_rate_ok,
        "slo": lambda r: meets(r["p95_ms"], slo_p95_ms),
        # A row without a memory reading cannot be shown to fit, so it does not.
        "memory": lambda r: rss_limit is None or (r.get("peak_rss_mb") is not None and r["peak_rss_mb"] <= rss_limit),
    }
    candidates = [r for r in rows if all(check(r) for check in checks.values())]
    if not candidates:
        return None, _why_none(rows, checks, slo_p95_ms, rss_limit)
    best = max(candidates, key=lambda r: (r["throughput_rps"], -r["p95_ms"]))
    return best, _why_best(best, len(candidates), len(rows), slo_p95_ms, max_rss_mb, rss_limit)


def _constraints_text(slo_p95_ms: float | None, max_rss_mb: float | None, rss_limit: float | None) -> str:
    parts = [f"P95 <= {slo_p95_ms:g} ms"] if slo_p95_ms is not None else []
    parts.append(f"errors <= {MAX_ERROR_RATE:.0%} of requests")
    if rss_limit is not None:
        parts.append(f"peak RSS <= {rss_limit:.0f} MB ({rss_limit / max_rss_mb:.0%} of the {max_rss_mb:g} "
                     "MB budget)")
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


def _why_best(best: Row, n_ok: int, n_rows: int, slo_p95_ms: float | None, max_rss_mb: float | None,
              rss_limit: float | None) -> str:
    head = (f"Recommended: {_setting(best)}: {best['throughput_rps']:.0f} req/s at P95 {best['p95_ms']:.1f} ms, "
            f"the highest throughput of the {n_ok} of {n_rows} settings with "
            f"{_constraints_text(slo_p95_ms, max_rss_mb, rss_limit)}.")
    if slo_p95_ms is None:
        head += " No P95 SLO was given, so latency did not limit the choice."
    return head


def _why_none(rows: Sequence[Row], checks: dict, slo_p95_ms: float | None, rss_limit: float | None) -> str:
    reasons = []
    if slo_p95_ms is not None and not any(checks["slo"](r) for r in rows):
        low = min(rows, key=lambda r: r["p95_ms"])
        reasons.append(f"no setting meets the P95 SLO of {slo_p95_ms:g} ms (the lowest P95 was {low['p95_ms']:.1f} ms "
                       f"at {_setting(low)})")
    if not any(checks["errors"](r) for r in rows):
        reasons.append(f"every setting failed more than {MAX_ERROR_RATE:.0%} of its requests")
    if rss_limit is not None and not any(checks["memory"](r) for r in rows):
        reasons.append(f"every setting used more than {rss_limit:.0f} MB peak RSS (the limit less headroom)")
    if not reasons:  # each constraint alone is met by some row, but never all by the same one
        reasons.append("no single setting meets the P95 SLO, the error limit and the memory budget together")
    return "No setting qualifies: " + "; ".join(reasons) + "."


# ---------------------------------------------------------------- tables (CSV, JSON, Markdown)


def flatten(row: Row) -> dict:
    """One CSV record: nested dicts become `parent.key`, errors a total plus JSON, the histogram JSON."""
    flat: dict = {}
    for key, value in row.items():
        if key == "errors":
            flat["errors"] = error_count(row)
            flat["errors_json"] = json.dumps(value or {}, sort_keys=True)
        elif key == "batch_histogram":
            flat["batch_histogram_json"] = json.dumps({str(k): v for k, v in sorted((value or {}).items())})
        elif key == "steps":  # a pipeline's row: each step's queue and compute
            for step in value:
                flat.update({f"{step['model']}.{k}": step[k] for k in ("queue_ms", "compute_ms", "mean_batch")})
        elif isinstance(value, dict):
            flat.update({f"{key}.{sub}": v for sub, v in value.items()})
        else:
            flat[key] = value
    return flat


def sweep_csv(rows: Sequence[Row], recommended: Row | None) -> str:
    records = [{**flatten(r), "recommended": int(r is recommended)} for r in rows]
    columns = list(dict.fromkeys(k for rec in records for k in rec))  # union, in first-seen order
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return buf.getvalue()


def _json_safe(value):
    # JSON has no NaN; a missing measurement becomes null rather than an unparseable file.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def sweep_json(rows: Sequence[Row], recommended: Row | None, reason: str, slo_p95_ms: float | None,
               max_rss_mb: float | None, headroom: float) -> str:
    index = _index_of(rows, recommended)
    rec = {"row": index, "reason": reason,
           "max_batch_size": recommended["max_batch_size"] if recommended else None,
           "max_queue_delay_us": recommended["max_queue_delay_us"] if recommended else None}
    if _swept_padding(rows):
        rec["bucket_edges"] = recommended["bucket_edges"] if recommended else None
    doc = {"rows": list(rows), "recommendation": rec, "slo_p95_ms": slo_p95_ms,
           "max_rss_mb": max_rss_mb, "headroom": headroom}
    return json.dumps(_json_safe(doc), indent=2, allow_nan=False) + "\n"


def _index_of(rows: Sequence[Row], row: Row | None) -> int | None:
    return next((i for i, r in enumerate(rows) if r is row), None)


def _num(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}"


TABLE_COLUMNS = (  # (header, how to show a row)
    ("", lambda r: ""),  # filled with the recommendation marker
    ("max batch", lambda r: str(r["max_batch_size"])),
    ("queue delay (µs)", lambda r: str(r["max_queue_delay_us"])),
    ("requests", lambda r: str(r["requests"])),
    ("errors", lambda r: str(error_count(r))),
    ("throughput (req/s)", lambda r: _num(r["throughput_rps"], 0)),
    ("P50 (ms)", lambda r: _num(r.get("p50_ms"))),
    ("P95 (ms)", lambda r: _num(r["p95_ms"])),
    ("P99 (ms)", lambda r: _num(r["p99_ms"])),
    ("max (ms)", lambda r: _num(r.get("max_ms"))),
    ("peak RSS (MB)", lambda r: _num(r.get("peak_rss_mb"), 0)),
    ("server queue (ms)", lambda r: _num((r.get("server") or {}).get("queue_ms"), 2)),
    ("server infer (ms)", lambda r: _num((r.get("server") or {}).get("compute_infer_ms"), 2)),
    ("client overhead (ms)", lambda r: _num(r.get("client_overhead_ms"), 2)),
)
PADDING_COLUMNS = (  # where the sweep padded to bucket edges
    ("padded to", lambda r: edges_text(r["bucket_edges"])),
    ("padding waste", lambda r: _num(r.get("padding_waste"), 2)),
)
RECOMMENDED_MARK = "**→ recommended**"


def markdown_table(rows: Sequence[Row], recommended: Row | None) -> str:
    columns = TABLE_COLUMNS
    if _swept_padding(rows):
        columns = (*TABLE_COLUMNS[:3], *PADDING_COLUMNS, *TABLE_COLUMNS[3:])
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + " --- |" * len(columns)]
    for r in rows:
        cells = [show(r) for _, show in columns]
        cells[0] = RECOMMENDED_MARK if r is recommended else ""
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_markdown(rows: Sequence[Row], recommended: Row | None, reason: str, title: str, load: str,
                    slo_p95_ms: float | None, max_rss_mb: float | None, headroom: float) -> str:
    limits = f"P95 SLO: {f'{slo_p95_ms:g} ms' if slo_p95_ms is not None else 'none'}"
    if max_rss_mb is not None:
        limits += f"; peak RSS limit: {max_rss_mb:g} MB with {headroom:.0%} headroom"
    parts = [f"# {title}", f"Load: {load}" if load else "Load: (not described)", limits,
             "## Results", markdown_table(rows, recommended), "## Recommendation", reason, "## Plots"]
    captions = {"throughput.png": "Throughput vs max batch size",
                "latency.png": "P95 and P99 latency vs max batch size",
                "decomposition.png": "Where the time of a request goes",
                "batch_histograms.png": "Batch sizes Triton executed"}
    parts += [f"![{captions[name]}]({name})" for name in PLOTS]
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------- plots


def _order(r: Row) -> tuple:
    edges = r.get("bucket_edges") or []
    return len(edges), edges, r["max_queue_delay_us"], r["max_batch_size"]


def _series(r: Row) -> str:
    """A line in the plots: one queue delay (and, swept, one padding), over the batch sizes."""
    return f"queue delay {r['max_queue_delay_us']} µs{_padding(r, ', pad ')}"


def _by_series(rows: Iterable[Row]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = {}
    for r in sorted(rows, key=_order):
        groups.setdefault(_series(r), []).append(r)
    return groups


def _row_label(r: Row) -> str:
    pad = _padding(r, "\npad ")
    return f"B={r['max_batch_size']}\n{r['max_queue_delay_us']} µs{pad}"


def _log2_batch_axis(ax, rows: Sequence[Row]) -> None:
    sizes = sorted({r["max_batch_size"] for r in rows})
    ax.set_xscale("log", base=2)
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.xaxis.set_major_locator(FixedLocator(sizes))  # label the sizes swept, not powers the sweep skipped
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(s) for s in sizes])
    ax.set_xlabel("max batch size (log2 scale)")
    ax.grid(True, which="major", alpha=0.3)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    finally:
        pyplot().close(fig)
    return buf.getvalue()


def plot_throughput(rows: Sequence[Row], recommended: Row | None, title: str) -> bytes:
    fig, ax = pyplot().subplots(figsize=(8, 5))
    for series, group in _by_series(rows).items():
        ax.plot([r["max_batch_size"] for r in group], [r["throughput_rps"] for r in group], marker="o",
                label=series)
    if recommended is not None:
        ax.plot(recommended["max_batch_size"], recommended["throughput_rps"], marker="*", markersize=18,
                color="crimson", linestyle="none", zorder=5,
                label=f"recommended: B={recommended['max_batch_size']}, {recommended['max_queue_delay_us']} µs"
                      f"{_padding(recommended)}")
    _log2_batch_axis(ax, rows)
    ax.set_ylabel("throughput (requests/s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title}: throughput")
    ax.legend()
    return _png(fig)


def plot_latency(rows: Sequence[Row], recommended: Row | None, slo_p95_ms: float | None, title: str) -> bytes:
    fig, ax = pyplot().subplots(figsize=(8, 5))
    colors = pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (series, group) in enumerate(_by_series(rows).items()):
        sizes = [r["max_batch_size"] for r in group]
        color = colors[i % len(colors)]
        ax.plot(sizes, [r["p95_ms"] for r in group], marker="o", color=color, label=f"P95, {series}")
        ax.plot(sizes, [r["p99_ms"] for r in group], marker="s", linestyle=":", color=color,
                label=f"P99, {series}")
    if slo_p95_ms is not None:
        ax.axhline(slo_p95_ms, color="crimson", linestyle="--", label=f"P95 SLO {slo_p95_ms:g} ms")
    if recommended is not None:
        ax.plot(recommended["max_batch_size"], recommended["p95_ms"], marker="*", markersize=18, color="crimson",
                linestyle="none", zorder=5, label="recommended")
    _log2_batch_axis(ax, rows)
    ax.set_ylabel("latency (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title}: tail latency")
    ax.legend(fontsize="small")
    return _png(fig)


def plot_decomposition(rows: Sequence[Row], title: str) -> bytes:
    ordered = sorted(rows, key=_order)
    parts = [(p.removesuffix("_ms").replace("_", " "), lambda r, p=p: (r.get("server") or {}).get(p))
             for p in SERVER_PARTS]
    parts.append(("client overhead", lambda r: r.get("client_overhead_ms")))
    fig, ax = pyplot().subplots(figsize=(max(8, 0.6 * len(ordered) + 2), 5))
    x = list(range(len(ordered)))
    bottom = [0.0] * len(ordered)
    for label, part in parts:
        # Negative overhead is clock noise between client and server means; it cannot be stacked.
        heights = [max(0.0, _finite_or_zero(part(r))) for r in ordered]
        ax.bar(x, heights, bottom=bottom, label=label, width=0.7)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.plot(x, [r.get("mean_ms", math.nan) for r in ordered], marker="_", markersize=20, markeredgewidth=2,
            color="black", linestyle="none", label="client mean latency")
    ax.set_xticks(x)
    ax.set_xticklabels([_row_label(r) for r in ordered], fontsize="small")
    ax.set_xlabel("setting (max batch size, queue delay)")
    ax.set_ylabel("mean time per request (ms)")
    ax.set_title(f"{title}: latency decomposition")
    ax.grid(True, axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize="small", loc="upper left")  # same top-to-bottom order as the stack
    return _png(fig)


def _finite_or_zero(value: float | None) -> float:
    return float(value) if value is not None and math.isfinite(value) else 0.0


def plot_batch_histograms(rows: Sequence[Row], recommended: Row | None, title: str) -> bytes:
    ordered = sorted(rows, key=_order)
    ncols = min(4, len(ordered))
    nrows = math.ceil(len(ordered) / ncols)
    # Constrained layout leaves room for the suptitle, which tight_layout lets overlap the first row.
    fig, axes = pyplot().subplots(nrows, ncols, figsize=(3.2 * ncols, 2.6 * nrows + 0.6), squeeze=False,
                             layout="constrained")
    for i, (ax, r) in enumerate(zip(axes.flat, ordered)):
        _histogram_panel(ax, r, r is recommended)
        if i + ncols >= len(ordered):  # axis titles on the outer panels only, to keep small multiples readable
            ax.set_xlabel("executed batch size", fontsize="small")
        if i % ncols == 0:
            ax.set_ylabel("executions", fontsize="small")
    for ax in list(axes.flat)[len(ordered):]:
        ax.set_visible(False)
    fig.suptitle(f"{title}: batch sizes Triton executed (executions per batch size)")
    return _png(fig)


def _histogram_panel(ax, row: Row, is_recommended: bool) -> None:
    hist = {int(k): int(v) for k, v in (row.get("batch_histogram") or {}).items()}
    if hist:
        sizes = sorted(hist)
        # Categorical x: executed sizes are sparse (e.g. 1, 7, 16), so equal spacing reads better.
        ax.bar([str(s) for s in sizes], [hist[s] for s in sizes], color="tab:blue")
    else:
        ax.text(0.5, 0.5, "no executions\nrecorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    mark = " (recommended)" if is_recommended else ""
    ax.set_title(f"max batch {row['max_batch_size']}, {row['max_queue_delay_us']} µs{_padding(row)}{mark}",
                 fontsize="medium",
                 color="crimson" if mark else "black")
    ax.tick_params(labelsize="small")


# ---------------------------------------------------------------- the report


def _check_rows(rows: Sequence[Row]) -> None:
    if not rows:
        raise ValueError("a sweep report needs at least one row")
    for i, r in enumerate(rows):
        missing = [k for k in REQUIRED_KEYS if k not in r]
        if missing:
            raise ValueError(f"sweep row {i}: missing {', '.join(missing)}")


def write_sweep_report(rows: Sequence[Row], out_dir: Path, slo_p95_ms: float | None = None,
                       max_rss_mb: float | None = None, title: str = "Batch-size sweep", load: str = "",
                       headroom: float = 0.2) -> dict[str, Path]:
    """Write sweep.csv, sweep.json, the four plots and report.md into out_dir; returns {file name: path}.

    Everything is rendered in memory first and then written file by file atomically, so a failure while
    rendering leaves out_dir untouched and no file is ever half written.
    """
    _check_rows(rows)
    recommended, reason = recommend(rows, slo_p95_ms, max_rss_mb, headroom)
    contents: dict[str, bytes] = {
        "sweep.csv": sweep_csv(rows, recommended).encode(),
        "sweep.json": sweep_json(rows, recommended, reason, slo_p95_ms, max_rss_mb, headroom).encode(),
        "throughput.png": plot_throughput(rows, recommended, title),
        "latency.png": plot_latency(rows, recommended, slo_p95_ms, title),
        "decomposition.png": plot_decomposition(rows, title),
        "batch_histograms.png": plot_batch_histograms(rows, recommended, title),
        "report.md": report_markdown(rows, recommended, reason, title, load, slo_p95_ms, max_rss_mb,
                                     headroom).encode(),
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, data in contents.items():
        write_bytes_atomic(out_dir / name, data)
        paths[name] = out_dir / name
    return paths
