"""Exact per-class latencies for a Locust run, shown in the web UI and written out headless.

Locust keeps response times in buckets rounded to two significant digits, so its P95 of a 23.4 ms
latency reads 23 ms. This recorder keeps every sample and reports nearest-rank percentiles
(`tritonkit.stats.percentile`): each reported value is a latency some request really had.
Percentiles are over successful requests only; a rejected request (queue full, timeout) returns
at once and would otherwise pull them down. Errors are counted by kind instead.

One recorder per Locust process: with `--processes` or workers each process keeps its own.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonkit.loadtests.load import OVERALL
from tritonkit.stats import percentile

ROUTE = "/tritonkit/exact"
TAB_KEY = "tritonkit-exact"
TAB_TITLE = "Exact latency"
PERCENTILES = (50, 90, 95, 99)

# Columns of the web UI table; keys have no underscores because the UI camel-cases row keys.
_COLUMNS = [("name", "Class"), ("requests", "Requests"), ("ok", "OK"), ("errors", "Errors"),
            ("p50", "P50 ms"), ("p90", "P90 ms"), ("p95", "P95 ms"), ("p99", "P99 ms"),
            ("max", "Max ms"), ("mean", "Mean ms"), ("throughput", "OK req/s")]


@dataclass
class _Series:
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def summary(self, elapsed_s: float) -> dict[str, Any]:
        ms = self.latencies_ms
        ok = len(ms)

        def finite(x: float) -> float | None:  # JSON has no NaN; an empty class reports null
            return None if math.isnan(x) else x

        out: dict[str, Any] = {"requests": ok + sum(self.errors.values()), "ok": ok, "errors": dict(self.errors)}
        out.update({f"p{q}_ms": finite(percentile(ms, q)) for q in PERCENTILES})
        out["max_ms"] = max(ms) if ms else None
        out["mean_ms"] = sum(ms) / ok if ms else None
        out["throughput"] = ok / elapsed_s if elapsed_s > 0 else 0.0
        return out


class ExactRecorder:
    """Every latency per request class and overall, plus error counts by kind."""

    def __init__(self, classes: list[str] | None = None) -> None:
        self.classes = list(classes or [])  # listed (with zeros) before their first request
        self.reset()

    def reset(self) -> None:
        self._series: dict[str, _Series] = {name: _Series() for name in [*self.classes, OVERALL]}
        self._started = time.monotonic()
        self._stopped: float | None = None

    def stop(self) -> None:
        self._stopped = time.monotonic()

    def record(self, request_class: str, latency_ms: float, error_kind: str | None = None) -> None:
        for key in (request_class, OVERALL):
            series = self._series.setdefault(key, _Series())
            if error_kind is None:
                series.latencies_ms.append(latency_ms)
            else:
                series.errors[error_kind] += 1

    def elapsed_s(self) -> float:
        return (self._stopped or time.monotonic()) - self._started

    def snapshot(self) -> dict[str, Any]:
        elapsed = self.elapsed_s()
        classes = {k: s.summary(elapsed) for k, s in sorted(self._series.items()) if k != OVERALL}
        return {"elapsed_s": elapsed, "classes": classes, OVERALL: self._series[OVERALL].summary(elapsed)}

    def table_rows(self) -> list[dict[str, Any]]:
        """The snapshot as web UI rows: one per class, then overall; times to 2 decimals."""
        snap = self.snapshot()
        rows = []
        for name, s in [*snap["classes"].items(), (OVERALL, snap[OVERALL])]:
            row: dict[str, Any] = {"name": name, "requests": s["requests"], "ok": s["ok"],
                                   "errors": ", ".join(f"{k}: {n}" for k, n in sorted(s["errors"].items())) or "0",
                                   "throughput": f"{s['throughput']:.1f}"}
            for key in ("p50", "p90", "p95", "p99", "max", "mean"):
                value = s[f"{key}_ms"]
                row[key] = "" if value is None else f"{value:.2f}"
            rows.append(row)
        return rows


def register(events: Any, recorder: ExactRecorder | None = None) -> ExactRecorder:
    """Hook a recorder into Locust's events (pass `locust.events`); returns it.

    Headless runs write the final snapshot to the file named by TRITONKIT_EXACT_OUT, if set.
    """
    recorder = recorder or ExactRecorder()

    @events.test_start.add_listener
    def _on_test_start(**_kw: Any) -> None:
        recorder.reset()

    @events.reset_stats.add_listener
    def _on_reset_stats(**_kw: Any) -> None:
        recorder.reset()

    @events.test_stop.add_listener
    def _on_test_stop(**_kw: Any) -> None:
        recorder.stop()
        if out := os.environ.get("TRITONKIT_EXACT_OUT"):
            Path(out).write_text(json.dumps(recorder.snapshot(), indent=2))

    @events.init.add_listener
    def _on_init(environment: Any, **_kw: Any) -> None:
        if environment.web_ui is not None:
            _extend_web_ui(environment.web_ui, recorder)

    return recorder


def _extend_web_ui(web_ui: Any, recorder: ExactRecorder) -> None:
    from flask import jsonify, request

    @web_ui.app.route(ROUTE)
    @web_ui.auth_required_if_enabled
    def _exact() -> Any:
        return jsonify(recorder.snapshot())

    # Locust's React UI renders an extra tab from these template args; its rows come from the
    # `extended_stats` list in the /stats/requests answer the UI polls every 2 s.
    web_ui.template_args["extended_tabs"] = [{"title": TAB_TITLE, "key": TAB_KEY}]
    web_ui.template_args["extended_tables"] = [
        {"key": TAB_KEY, "structure": [{"key": k, "title": t} for k, t in _COLUMNS]}]

    @web_ui.app.after_request
    def _add_rows(response: Any) -> Any:
        # Locust memoizes that response object, so set the key (idempotent) rather than append.
        if request.path.endswith("/stats/requests") and response.status_code == 200 and response.is_json:
            data = response.get_json()
            data["extended_stats"] = [{"key": TAB_KEY, "data": recorder.table_rows()}]
            response.set_data(json.dumps(data))
        return response
