"""The sweep report: recommendation rules and the files a person reads.

Rows are synthetic but follow the batching cost model T(B) = C_fixed + B * C_per: one execution of a batch
of B costs T(B), so throughput is B / T(B) and latency grows with B. They are the input of a pure function,
not a stand-in for a server.
"""

from __future__ import annotations

import csv
import json
import math

import pytest

from tritonkit.loadtests import report
from tritonkit.loadtests.report import recommend, write_sweep_report

C_FIXED_MS = 1.5
C_PER_MS = 0.3
BATCHES = (1, 2, 4, 8, 16, 32, 64)
REQUESTS = 2000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_row(batch: int, delay_us: int = 0, errors: dict | None = None, rss_mb: float | None = None) -> dict:
    t_ms = C_FIXED_MS + batch * C_PER_MS
    server = {"queue_ms": 0.5 * t_ms + 0.5 * delay_us / 1000,  # wait for the batch in flight, and to fill one
              "compute_input_ms": 0.05 * t_ms, "compute_infer_ms": 0.9 * t_ms, "compute_output_ms": 0.05 * t_ms}
    overhead = 0.4
    mean = sum(server.values()) + overhead
    errors = errors or {}
    throughput = batch / t_ms * 1000
    full = int(REQUESTS * 0.9) // batch  # most executions are full batches, the tail is smaller
    rest = REQUESTS - full * batch
    half = max(1, batch // 2)
    histogram = {batch: full, half: rest // half} if half != batch else {batch: full + rest}
    if half != batch and rest % half:
        histogram[1] = histogram.get(1, 0) + rest % half
    return {"max_batch_size": batch, "max_queue_delay_us": delay_us, "requests": REQUESTS,
            "ok": REQUESTS - sum(errors.values()), "errors": errors, "duration_s": REQUESTS / throughput,
            "throughput_rps": throughput, "mean_ms": mean, "p50_ms": 0.95 * mean, "p95_ms": 1.5 * mean,
            "p99_ms": 1.8 * mean, "max_ms": 2.5 * mean, "server": server,
            "peak_rss_mb": rss_mb if rss_mb is not None else 300 + 6 * batch, "client_overhead_ms": overhead,
            "batch_histogram": histogram}


@pytest.fixture
def rows() -> list[dict]:
    return [make_row(b) for b in BATCHES]


def by_batch(rows: list[dict], batch: int) -> dict:
    return next(r for r in rows if r["max_batch_size"] == batch)


# ---------------------------------------------------------------- recommend


def test_model_rows_are_realistic(rows):
    # Throughput rises with B and flattens; P95 rises with B: the trade-off the sweep measures.
    tput = [r["throughput_rps"] for r in rows]
    p95 = [r["p95_ms"] for r in rows]
    assert tput == sorted(tput) and p95 == sorted(p95)
    assert all(sum(k * v for k, v in r["batch_histogram"].items()) == REQUESTS for r in rows)


def test_picks_highest_throughput_under_slo(rows):
    slo = 20.0
    best, why = recommend(rows, slo)
    under = [r for r in rows if r["p95_ms"] <= slo]
    assert best is max(under, key=lambda r: r["throughput_rps"])
    assert best["max_batch_size"] == 16  # B=32 has P95 25.6 ms
    assert "max batch size 16" in why and "P95 <= 20 ms" in why


def test_none_when_no_row_meets_slo(rows):
    best, why = recommend(rows, slo_p95_ms=1.0)
    assert best is None
    assert why.startswith("No setting qualifies") and "P95 SLO of 1 ms" in why
    assert f"{min(r['p95_ms'] for r in rows):.1f} ms" in why  # says how close the best row came


def test_memory_budget_keeps_headroom(rows):
    # RSS is 300 + 6*B MB. Budget 450 MB with 20% headroom allows 360 MB: B=16 (396 MB) is out, B=8 (348 MB) in.
    best, why = recommend(rows, slo_p95_ms=20.0, max_rss_mb=450)
    assert best["max_batch_size"] == 8
    assert all(r["peak_rss_mb"] > 360 for r in rows if r["throughput_rps"] > best["throughput_rps"])
    assert "360 MB" in why
    best_no_headroom, _ = recommend(rows, slo_p95_ms=20.0, max_rss_mb=450, headroom=0.0)
    assert best_no_headroom["max_batch_size"] == 16


def test_memory_budget_excluding_everything_says_so(rows):
    best, why = recommend(rows, slo_p95_ms=None, max_rss_mb=100)
    assert best is None and "peak RSS" in why


def test_errors_above_one_percent_disqualify(rows):
    by_batch(rows, 16)["errors"] = {"queue_full": 21}  # 1.05% of 2000
    assert recommend(rows, 20.0)[0]["max_batch_size"] == 8
    by_batch(rows, 16)["errors"] = {"queue_full": 20}  # exactly 1% is allowed
    assert recommend(rows, 20.0)[0]["max_batch_size"] == 16


def test_tie_goes_to_lower_p95(rows):
    a, b = make_row(8), make_row(8, delay_us=2000)
    assert a["throughput_rps"] == b["throughput_rps"] and a["p95_ms"] < b["p95_ms"]
    assert recommend([b, a], 20.0)[0] is a


def test_no_slo_takes_highest_throughput_and_says_so(rows):
    best, why = recommend(rows, None)
    assert best["max_batch_size"] == 64
    assert "No P95 SLO" in why


def test_no_rows():
    assert recommend([], 10.0) == (None, "No sweep rows to choose from.")


# ---------------------------------------------------------------- files


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 10_000, f"{path} is suspiciously small ({len(data)} bytes)"


def test_report_files(rows, tmp_path):
    paths = write_sweep_report(rows, tmp_path / "out", slo_p95_ms=20.0, max_rss_mb=1000,
                               title="edge_mlp sweep", load="2000 requests, 32 concurrent, closed loop")
    expected = {"sweep.csv", "sweep.json", *report.PLOTS, "report.md"}
    assert set(paths) == expected
    assert {p.name for p in (tmp_path / "out").iterdir()} == expected  # and no temp files left behind
    for name in report.PLOTS:
        assert_png(paths[name])
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in paths.values())  # readable by whoever reads reports

    with paths["sweep.csv"].open() as f:
        lines = f.read().splitlines()
    assert len(lines) == len(rows) + 1
    records = list(csv.DictReader(lines))
    for column in ("max_batch_size", "p95_ms", "errors", "errors_json", "server.queue_ms", "server.compute_infer_ms",
                   "client_overhead_ms", "batch_histogram_json", "recommended"):
        assert column in records[0], column
    assert [int(r["recommended"]) for r in records] == [int(b == 16) for b in BATCHES]
    assert math.isclose(float(records[0]["server.queue_ms"]), rows[0]["server"]["queue_ms"])

    doc = json.loads(paths["sweep.json"].read_text())
    assert doc["slo_p95_ms"] == 20.0 and len(doc["rows"]) == len(rows)
    assert doc["recommendation"]["max_batch_size"] == 16 and doc["recommendation"]["row"] == BATCHES.index(16)

    md = paths["report.md"].read_text()
    _, reason = recommend(rows, 20.0, 1000)
    assert md.startswith("# edge_mlp sweep")
    assert "2000 requests, 32 concurrent, closed loop" in md
    assert reason in md
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert len(table) == len(rows) + 2  # header, separator, one line per row
    marked = [line for line in table if report.RECOMMENDED_MARK in line]
    assert len(marked) == 1 and "| 16 |" in marked[0]
    for name in report.PLOTS:
        assert f"]({name})" in md


def test_report_errors_columns(rows, tmp_path):
    by_batch(rows, 4)["errors"] = {"queue_full": 3, "timeout": 2}
    paths = write_sweep_report(rows, tmp_path, slo_p95_ms=20.0)
    records = list(csv.DictReader(paths["sweep.csv"].open()))
    row4 = next(r for r in records if r["max_batch_size"] == "4")
    assert row4["errors"] == "5" and json.loads(row4["errors_json"]) == {"queue_full": 3, "timeout": 2}


def test_report_with_several_queue_delays_and_no_recommendation(tmp_path):
    rows = [make_row(b, delay_us=d) for d in (0, 500, 2000) for b in BATCHES]
    paths = write_sweep_report(rows, tmp_path, slo_p95_ms=1.0, load="2000 requests per setting")
    for name in report.PLOTS:
        assert_png(paths[name])
    doc = json.loads(paths["sweep.json"].read_text())
    assert doc["recommendation"]["row"] is None and doc["recommendation"]["reason"].startswith("No setting qualifies")
    md = paths["report.md"].read_text()
    assert report.RECOMMENDED_MARK not in md and "No setting qualifies" in md


def test_failed_render_writes_nothing(rows, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("renderer failed")

    monkeypatch.setattr(report, "plot_batch_histograms", broken)
    with pytest.raises(RuntimeError):
        write_sweep_report(rows, tmp_path / "out", slo_p95_ms=20.0)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_rejects_rows_missing_fields(tmp_path):
    with pytest.raises(ValueError, match="at least one row"):
        write_sweep_report([], tmp_path)
    row = make_row(4)
    del row["p95_ms"]
    with pytest.raises(ValueError, match="row 0: missing p95_ms"):
        write_sweep_report([row], tmp_path)
