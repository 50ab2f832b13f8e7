"""NVIDIA's perf_analyzer as a load engine: found or installed for the server's version, driven
open and closed loop against the real server, its profile export read exactly, and a clear error
when the binary cannot run."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import tritonkit
from tritonkit.loadtests import pa_install
from tritonkit.loadtests.load import Load
from tritonkit.loadtests.measure import measure_by
from tritonkit.loadtests.pa_run import ExportPairs

pytestmark = [pytest.mark.server, pytest.mark.measures]


@pytest.fixture(scope="module")
def pa(served) -> pa_install.PerfAnalyzer:
    with served.client() as c:
        return pa_install.find(c.server_version(), log=lambda s: None)


def test_the_binary_matches_the_server_version(served, pa):
    with served.client() as c:
        assert pa.version == c.server_version()
    assert not pa_install.missing_libraries(pa)


def test_open_loop_counts_the_steady_window_exactly(served, pa):
    """Poisson at 150 req/s for 3 s: about 450 requests counted (only those sent in the window),
    all served, and the server's side of exactly that window."""
    load = Load(rate=150, duration_s=3, warmup_s=1)
    r = measure_by("perf_analyzer", "steady", load, None, url=served.endpoints.grpc)
    o = r["overall"]
    assert r["engine"] == "perf_analyzer"
    assert 300 < o["requests"] < 600 and o["ok"] == o["requests"], o
    assert o["p50_ms"] <= o["p95_ms"] <= o["p99_ms"] <= o["max_ms"]
    assert r["server"]["requests"] >= o["requests"] * 0.9  # the statistics bracket the window
    assert len(r["timeline"]) == 3 and sum(row["sent"] for row in r["timeline"]) == o["requests"], r["timeline"]
    # a stall of this shared box can hold perf_analyzer back even at 150 req/s: then it says so (short
    # means more than three Poisson deviations under 90% of the rate, `generator_health`)
    g = r["generator"]
    assert g["saturated"] == (g["warning"] is not None), g
    assert g["saturated"] or g["achieved_rate"] >= 0.9 * 150 - 3 * 450 ** 0.5 / 3, g


def test_closed_loop_keeps_its_concurrency(served, pa):
    r = measure_by("perf_analyzer", "steady", Load(concurrency=4, duration_s=2, warmup_s=0.5), None,
                   url=served.endpoints.grpc)
    assert r["load"]["mode"] == "closed" and r["overall"]["ok"] > 50
    assert r["server"]["mean_batch"] > 1  # four in flight: the batcher finds more than one queued


def test_a_shaped_load_follows_its_schedule(served, pa):
    """A step shape (25%, 50%, 75%, 100% of 200 req/s) through --request-intervals: the last
    quarter of the window carries about four times the first."""
    r = measure_by("perf_analyzer", "steady", Load(rate=200, duration_s=4, warmup_s=0.5, shape="step"), None,
                   url=served.endpoints.grpc)
    sent = [row["sent"] for row in r["timeline"]]
    assert len(sent) == 4 and sent[3] > 2.5 * sent[0], sent


def test_classes_perf_analyzer_cannot_send_are_refused_naming_the_flag(served, tmp_path):
    done = tritonkit("loadtest", "--spec", str(served.spec_path), "--model", "prio", "--url", served.endpoints.grpc,
                     "--engine", "perf_analyzer", "--rps", "50", "--class", "interactive:1:1", "--out", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "--class" in done.stderr and "--engine asyncio" in done.stderr and "Traceback" not in done.stderr


def test_a_binary_that_cannot_run_names_the_missing_libraries(served, pa, tmp_path):
    """The wheel's binary without the libraries the kit links beside it: the error names them."""
    bare = tmp_path / "perf_analyzer"
    shutil.copy(pa.binary, bare)
    done = tritonkit("loadtest", "--spec", str(served.spec_path), "--model", "steady", "--url", served.endpoints.grpc,
                     "--engine", "perf_analyzer", "--rps", "50", "--duration", "1", "--out", str(tmp_path / "out"),
                     env={pa_install.ENV_BINARY: str(bare), "LD_LIBRARY_PATH": ""})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "libb64.so.0d" in done.stderr and "libcudart.so.12" in done.stderr and str(bare) in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out" / "result.json").exists()


def test_the_kit_images_folder_measures_offline_with_an_empty_cache(served, pa, tmp_path):
    """As in the kit image: $TRITONKIT_PERF_ANALYZER_DIR filled at build time (another version's
    folder here), an empty home, nothing on PATH: perf_analyzer measures, nothing is downloaded."""
    shipped = tmp_path / "image" / "2.50.0"
    shipped.mkdir(parents=True)
    shutil.copy(pa.binary, shipped / "perf_analyzer")
    shutil.copytree(pa.binary.parent / "lib", shipped / "lib", symlinks=True)
    home = tmp_path / "home"
    home.mkdir()
    done = tritonkit("loadtest", "--spec", str(served.spec_path), "--model", "steady", "--url", served.endpoints.grpc,
                     "--engine", "perf_analyzer", "--rps", "50", "--duration", "1", "--out", str(tmp_path / "out"),
                     env={pa_install.ENV_DIR: str(tmp_path / "image"), "HOME": str(home), "XDG_CACHE_HOME": "",
                          "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "perf_analyzer 2.50.0 from $TRITONKIT_PERF_ANALYZER_DIR drives Triton 2.51.0" in done.stdout
    assert json.loads((tmp_path / "out" / "result.json").read_text())["engine"] == "perf_analyzer"
    assert not (home / ".cache" / "tritonkit" / "perf_analyzer").exists()


def test_the_export_reader_pairs_timestamps_across_block_edges(tmp_path):
    """PA's export, read in blocks that cut keys and numbers in two: every request's send and
    first response time, and None for a request that got no response."""
    requests = [{"timestamp": 1_000_000_000 + i, "request_inputs": {"x": [0.5] * (i % 7)},
                 "response_timestamps": [] if i == 3 else [2_000_000_000 + i, 3_000_000_000],
                 "response_outputs": [{"y": [1.5] * 5}]} for i in range(40)]
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"experiments": [{"experiment": {"mode": "request_rate", "value": 10},
                                                 "requests": requests, "window_boundaries": [1, 2]}],
                                "version": "2.51.0"}, separators=(",", ":")))
    for chunk in (7, 13, 64, 1 << 20):
        export = ExportPairs(path, chunk)
        pairs = list(export)
        assert pairs == [(1_000_000_000 + i, None if i == 3 else 2_000_000_000 + i) for i in range(40)], chunk
        assert export.ended
    # PA's JSON writer stops at a NaN without flushing its last 64 KB: an export cut short is not whole
    whole = path.read_bytes()
    for cut in (len(whole) // 2, whole.rindex(b"}]") + 2, whole.rindex(b',"version"')):
        path.write_bytes(whole[:cut])
        export = ExportPairs(path)
        assert list(export) and not export.ended, cut


def test_shared_memory_measures_the_same_load_without_tensors_on_the_wire(served, pa):
    """The judge's and the trials' way: tensors through system shared memory on this machine. The
    same requests are counted and answered, and Triton saw each of them."""
    from tritonkit.loadtests.pa_run import run_pa

    out = run_pa(served.endpoints.grpc, "steady", Load(rate=100, duration_s=2, warmup_s=0.5), shared_memory=True,
                 log=lambda s: None)
    ok = [s for s in out.samples if s.latency_s is not None]
    assert 120 < len(ok) == len(out.samples) < 300
    done = int(out.stats_after["inference_stats"]["success"]["count"]) - \
        int(out.stats_before["inference_stats"]["success"]["count"])
    assert done >= len(ok) * 0.9


def test_a_perf_analyzer_over_its_memory_cap_leaves_the_run_to_the_asyncio_client(served, monkeypatch):
    """PA runs under an address-space cap, so a run whose export outgrows the memory ends in PA, not
    in the kernel's OOM killer taking the server beside it; the cheapest-client path then measures
    the run with the asyncio client. A cap PA cannot get through a run under (300 MB; it runs in
    less than 1 GB) shows both."""
    from tritonkit.loadtests.measure import send_cheapest
    from tritonkit.loadtests.pa_run import ENV_MEMORY_MB, memory_cap

    monkeypatch.setenv(ENV_MEMORY_MB, "300")
    assert memory_cap() == 300 * 2**20
    out, engine = send_cheapest(served.endpoints.grpc, "steady", Load(rate=100, duration_s=1.5, warmup_s=0.5))
    assert engine == "asyncio"
    assert len(out.samples) > 100 and all(s.latency_s is not None for s in out.samples)
