"""Assertions that more than one test file makes about a load-test result."""

from __future__ import annotations

import json


def assert_priorities_under_overload(result: dict) -> None:
    """Interactive (priority 1) overtook bulk in the queue, the full queue's rejections are counted
    as queue_full, every request is accounted for, and Triton's side of the window is there."""
    inter, bulk = result["classes"]["interactive"], result["classes"]["bulk"]
    print(json.dumps({k: {m: v[m] for m in ("requests", "ok", "errors", "p50_ms", "p95_ms")}
                      for k, v in result["classes"].items()}))
    assert inter["ok"] > 20 and bulk["ok"] > 20
    assert inter["p95_ms"] < bulk["p95_ms"]
    assert bulk["errors"].get("queue_full", 0) > 0
    assert result["overall"]["requests"] == sum(c["requests"] for c in result["classes"].values())
    for c in result["classes"].values():
        assert c["ok"] + sum(c["errors"].values()) == c["requests"]
    assert result["server"]["requests"] > 0 and result["server"]["queue_ms"] > 0
    assert "request" in result["server_summary_us"]
