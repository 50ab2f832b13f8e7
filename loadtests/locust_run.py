"""Run the Locust file headless for one measurement and read back its result.

Locust runs in its own process: it monkey-patches the standard library for gevent, which must
not happen inside the kit's own process (asyncio, gRPC, subprocesses). The load, the request
classes and any real request data go in through environment variables; the result, in the kit's one
JSON schema, comes back through a file the Locust process writes when the test stops.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tritonkit.errors import KitError
from tritonkit.loadtests.load import Load, RequestClass, classes_json

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


def run_locust(http_url: str, model: str, load: Load, classes: list[RequestClass], *,
               input_data: Path | None = None, log_path: Path | None = None) -> dict:
    """One headless Locust run against Triton's HTTP endpoint (HOST:PORT); the result dict."""
    with tempfile.TemporaryDirectory(prefix="tritonkit-locust-") as tmp:
        result_path = Path(tmp) / "result.json"
        env = {**os.environ, "TRITONKIT_MODEL": model, "TRITONKIT_CLASSES": classes_json(classes),
               "TRITONKIT_LOAD": load.to_json(), "TRITONKIT_RESULT_OUT": str(result_path)}
        if input_data is not None:
            env["TRITONKIT_INPUT_DATA"] = str(Path(input_data).resolve())
        cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", f"http://{http_url}",
               "--stop-timeout", f"{load.drain_s:g}", "--loglevel", "WARNING", "--exit-code-on-error", "0",
               "--only-summary"]
        log = Path(log_path or Path(tmp) / "locust.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            try:
                done = subprocess.run(cmd, env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT,
                                      timeout=load.total_s + load.drain_s + 120)
            except subprocess.TimeoutExpired:
                raise KitError(f"locust did not finish in time; its log: {log}") from None
        if done.returncode != 0 or not result_path.exists():
            tail = log.read_text()[-1500:]
            raise KitError(f"locust exited with code {done.returncode} and wrote no result:\n{tail}")
        return json.loads(result_path.read_text())
