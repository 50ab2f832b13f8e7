"""The Locust load test against a real tritonserver: headless counts and exact percentiles agree with
Locust's own, and the web UI's "Exact latency" tab renders in a real headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.checks import assert_priorities_under_overload
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.server

LOCUST = Path(sys.executable).parent / "locust"
LOCUSTFILE = REPO_ROOT / "loadtests" / "locustfile.py"
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# all_fields: priority 1 has its own queue policy; bulk rides level 2, whose 100 ms queue timeout
# can reject a request when this shared machine stalls: failures are counted, not fatal.
CLASSES = [{"name": "interactive", "weight": 1, "priority": 1, "batch": 1},
           {"name": "bulk", "weight": 3, "priority": 2, "batch": 2}]
KINDS = {"queue_full", "timeout", "deadline", "refused", "bad_input", "not_ready", "access_denied", "unavailable",
         "other"}


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "TRITONKIT_MODEL": "all_fields", "TRITONKIT_CLASSES": json.dumps(CLASSES), **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def test_headless_counts_match_locust(served, tmp_path):
    exact_out = tmp_path / "exact.json"
    cmd = [str(LOCUST), "-f", str(LOCUSTFILE), "--headless", "-u", "4", "-r", "4", "-t", "6s",
           "--host", f"http://{served.endpoints.http}", "--json-file", str(tmp_path / "locust"),
           "--loglevel", "WARNING", "--exit-code-on-error", "0"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(TRITONKIT_EXACT_OUT=str(exact_out)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]

    locust_stats = {e["method"]: e for e in json.loads((tmp_path / "locust.json").read_text())}
    exact = json.loads(exact_out.read_text())
    assert set(locust_stats) == set(exact["classes"]) == {"interactive", "bulk"}
    for name, ours in exact["classes"].items():
        theirs = locust_stats[name]
        assert theirs["name"] == "all_fields"
        assert theirs["num_requests"] == ours["requests"] > 0, name
        assert theirs["num_failures"] == sum(ours["errors"].values()), name
        assert set(ours["errors"]) <= KINDS
        assert ours["ok"] > 0
        assert 0 < ours["p50_ms"] <= ours["p95_ms"] <= ours["p99_ms"] <= ours["max_ms"], ours
    overall = exact["overall"]
    assert overall["requests"] == sum(e["num_requests"] for e in locust_stats.values())
    assert overall["p95_ms"] > 0 and overall["throughput"] > 0
    # Weights 1:3 over a few hundred requests: bulk clearly dominates.
    assert exact["classes"]["bulk"]["requests"] > exact["classes"]["interactive"]["requests"]


def _chromium_available() -> str | None:
    """Install Debian's chromium and its driver when missing; the reason they are unusable, or None."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "chromium/chromedriver missing and apt-get unusable (not root or not Debian)"
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium", "chromium-driver"]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if done.returncode != 0:
            return f"{' '.join(cmd)} failed: {done.stderr[-500:]}"
    return None if CHROMIUM.exists() and CHROMEDRIVER.exists() else "chromium installed but not at /usr/bin"


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"locust exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout_s} s")


def test_web_ui_exact_latency_tab(served, tmp_path):
    if reason := _chromium_available():
        pytest.skip(reason)
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium not installed (dev extra)")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    port = _free_port()
    ui = f"http://127.0.0.1:{port}"
    log = (tmp_path / "locust.log").open("w")
    proc = subprocess.Popen([str(LOCUST), "-f", str(LOCUSTFILE), "--host", f"http://{served.endpoints.http}",
                             "--web-host", "127.0.0.1", "--web-port", str(port)],
                            cwd=tmp_path, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    driver = None
    try:
        _wait_http(ui, proc)
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     f"--user-data-dir={tmp_path / 'chrome-profile'}", "--window-size=1400,900"):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(str(CHROMEDRIVER)))
        driver.set_page_load_timeout(30)
        wait = WebDriverWait(driver, 20)

        driver.get(ui)
        for field, value in (("userCount", "3"), ("spawnRate", "3")):
            box = wait.until(ec.presence_of_element_located((By.NAME, field)))
            box.send_keys(Keys.CONTROL, "a")  # React inputs ignore clear(); select all and type over
            box.send_keys(value)
        driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

        tab = wait.until(ec.element_to_be_clickable(
            (By.XPATH, "//button[@role='tab'][contains(., 'Exact latency')]")))
        def landed(_drv) -> bool:  # both classes have requests in the runner's exact statistics
            with urllib.request.urlopen(f"{ui}/tritonkit/exact", timeout=5) as r:
                classes = json.load(r).get("classes", {})
            return all((classes.get(c) or {}).get("p95_ms") for c in ("interactive", "bulk"))

        wait.until(landed)
        tab.click()

        def p95_cells(drv):
            rows = drv.find_elements(By.XPATH, "//table//tr[td]")
            cells = {r.find_elements(By.TAG_NAME, "td")[0].text: r.find_elements(By.TAG_NAME, "td") for r in rows}
            return cells if "interactive" in cells and cells["interactive"][6].text else False

        headers = [h.text for h in wait.until(lambda d: d.find_elements(By.XPATH, "//table//th"))]
        assert headers[6] == "P95 ms", headers
        cells = wait.until(p95_cells)
        driver.save_screenshot(str(tmp_path / "exact_latency.png"))
        for name in ("interactive", "bulk", "overall"):
            p95 = cells[name][6].text
            assert float(p95) > 0 and len(p95.split(".")[1]) == 2, (name, p95)

        with urllib.request.urlopen(f"{ui}/tritonkit/exact", timeout=5) as r:
            snapshot = json.load(r)
        assert snapshot["classes"]["interactive"]["p95_ms"] > 0
        with urllib.request.urlopen(f"{ui}/stats/requests", timeout=5) as r:
            assert json.load(r)["user_count"] == 3  # the form's values reached the runner
    finally:
        if driver is not None:
            driver.quit()
        _stop(proc)
        log.close()


def _loadtest(served, tmp_path, *args: str) -> dict:
    from tests.conftest import tritonkit

    done = tritonkit("loadtest", "--spec", str(served.spec_path), "--url", served.endpoints.http,
                     "--metrics-url", served.endpoints.metrics, "--out", str(tmp_path), *args, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "P95 ms" in done.stdout
    return json.loads((tmp_path / "result.json").read_text())


@pytest.mark.measures
def test_tritonkit_loadtest_locust_priorities_under_overload(served, tmp_path):
    """Headless Locust through `tritonkit loadtest`: far more than `prio` can serve (a batch-4
    model with a 24-deep queue). Interactive (priority 1) overtakes bulk in the queue, and the
    requests the full queue turns away are counted as queue_full, not as latency."""
    result = _loadtest(served, tmp_path, "--model", "prio", "--rps", "1000", "--duration", "4", "--warmup", "1",
                       "--class", "interactive:1:1", "--class", "bulk:3:2", "--max-errors", "1")
    assert result["engine"] == "locust" and result["schema"] == "tritonkit.result/1"
    assert_priorities_under_overload(result)
    assert (tmp_path / "result.csv").read_text().splitlines()[0].startswith("class,")


@pytest.mark.measures
def test_tritonkit_loadtest_locust_step_shape_raises_the_rate(served, tmp_path):
    """A step shape at 200 req/s open loop: the last quarter of the window offers about four
    times the first (25% -> 100%), and a light load is served without generator warnings."""
    result = _loadtest(served, tmp_path, "--model", "steady", "--rps", "200", "--shape", "step",
                       "--duration", "4", "--warmup", "0.5")
    sent = [b["sent"] for b in result["timeline"]]
    assert len(sent) == 4 and sent[-1] > 2.5 * sent[0], sent
    assert result["overall"]["ok"] == result["overall"]["requests"] > 200
    assert not result["generator"]["saturated"], result["generator"]
    assert result["load"]["shape"] == "step" and result["load"]["mode"] == "open"


def test_tritonkit_loadtest_bad_class_is_a_clear_error(served, tmp_path):
    from tests.conftest import tritonkit

    done = tritonkit("loadtest", "--spec", str(served.spec_path), "--url", served.endpoints.http,
                     "--model", "steady", "--rps", "10", "--class", "bulk:x:2", "--out", str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--class bulk:x:2" in done.stderr and "interactive:1:1" in done.stderr
    assert not (tmp_path / "result.json").exists()
