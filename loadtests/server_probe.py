"""`tritonkit probe`: does the target tritonserver keep serving behind a bounded queue when more
load arrives than it can take? (The mechanism is in tritonkit/server_traits.py.)

One slower copy of the sample model, three ways: without a queue policy (prefetch on: the
capacity), and behind a bounded queue with one and with two instances. Each bounded copy gets
twice that capacity, open loop, for two seconds; one lone client then shows whether an idle
server waits out the batcher's 500 ms. About 30 s with the server start; the answer is cached
per server version, so `configs`, `validate` and the tuner read it without running anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tritonkit import sample_model, server_traits
from tritonkit.clients import Client
from tritonkit.configs.generate import generate, local_onnx_runtime
from tritonkit.configs.loader import load_spec
from tritonkit.loadtests.asyncgen import run_load
from tritonkit.loadtests.load import Load, Outcome
from tritonkit.loadtests.results import class_summary
from tritonkit.server import find_install, read_state
from tritonkit.server_traits import ServerTraits
from tritonkit.serving import running

# Eight layers of the sample MLP: about half its capacity, so twice that stays within what one
# load generator sends on a small box, and the server, not the generator, is what is measured.
PROBE_LAYERS = 8
QUEUE = 16  # one batch deep: the queue is full at once under overload
HELD = 0.6  # a bounded queue "held" if it served this share of the capacity (collapse is < 0.1)
IDLE_STALL_S = 0.3  # one lone request this slow on an idle server is the batcher's 500 ms wait

MODELS = {
    "probe_free": {"instances": 1, "queue": False},
    "probe_bounded_x1": {"instances": 1, "queue": True},
    "probe_bounded_x2": {"instances": 2, "queue": True},
}


def _spec_yaml() -> dict:
    models = []
    for name, m in MODELS.items():
        batching = {"preferred_batch_sizes": [16], "max_queue_delay_us": 1000}
        if m["queue"]:
            batching["default_queue_policy"] = {"max_queue_size": QUEUE}
        models.append({"name": name, "onnx": "probe.onnx", "max_batch_size": 16, "threads": 1,
                       "batching": batching, "instances": {"count": m["instances"]}})
    return {"models": models}


def _ok_rps(out: Outcome, seconds: float) -> float:
    return class_summary(out.samples, seconds)["throughput_rps"]


def _max_s(out: Outcome) -> float:
    return max((s.latency_s for s in out.samples if s.latency_s is not None), default=0.0)


@contextlib.contextmanager
def _served(work: Path, state_dir: Path, url: str | None, log: Callable[[str], None]) -> Iterator[str]:
    """The probe models on the bundled server (started here, stopped by pid), or loaded with their
    files into the server at `url` (which must allow loading models: explicit model control)."""
    sample_model.write(work / "probe.onnx", layers=PROBE_LAYERS)
    (work / "deploy.yaml").write_text(yaml.safe_dump(_spec_yaml()))
    repo = work / "repo"
    spec = load_spec(work / "deploy.yaml", repo)
    generate(spec, repo)
    if url is None:
        ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
        with running(spec, repo, state_dir, ports=ports, log=log) as r:
            yield r.endpoints.grpc
        return
    # A server `tritonkit serve` started from this state folder restricts loading to its own key.
    local = read_state(state_dir)
    headers = local.key_headers if local is not None and url == local.grpc else {}
    with Client(url, key_headers=headers) as c:
        for name in MODELS:
            folder = repo / name
            config = text_format.Parse((folder / "config.pbtxt").read_text(), mc.ModelConfig())
            files = {str(p.relative_to(folder)): p.read_bytes() for p in (folder / "1").rglob("*") if p.is_file()}
            log(f"  loading {name} into {url}")
            c.load(name, config, files)
        try:
            yield url
        finally:
            for name in MODELS:
                with contextlib.suppress(Exception):
                    c.unload(name)


async def _measure(url: str, log: Callable[[str], None]) -> dict:
    cap_load = Load(concurrency=32, duration_s=2.0, warmup_s=0.5, drain_s=2.0)
    capacity = _ok_rps(await run_load(url, "probe_free", cap_load), cap_load.duration_s)
    log(f"  capacity without a queue policy: {capacity:.0f} req/s")
    evidence: dict = {"capacity_rps": round(capacity, 1), "offered_rps": round(2 * capacity, 1)}
    for name in ("probe_bounded_x1", "probe_bounded_x2"):
        load = Load(rate=2 * capacity, duration_s=2.0, warmup_s=0.5, drain_s=2.0)
        ok = _ok_rps(await run_load(url, name, load), load.duration_s)
        evidence[name] = {"ok_rps": round(ok, 1), "share": round(ok / capacity, 3) if capacity else 0.0}
        log(f"  {name} at {2 * capacity:.0f} req/s: {ok:.0f} req/s served ({ok / max(capacity, 1e-9):.0%})")
    lone = await run_load(url, "probe_bounded_x1", Load(concurrency=1, duration_s=2.0, warmup_s=0.3, drain_s=2.0))
    evidence["lone_client_max_ms"] = round(1e3 * _max_s(lone), 1)
    log(f"  one client, bounded queue, one instance: slowest request {evidence['lone_client_max_ms']} ms")
    return evidence


def traits_from(version: str, evidence: dict) -> ServerTraits:
    """The decision, one place: which instance counts kept a bounded queue serving."""
    held1 = evidence["probe_bounded_x1"]["share"] >= HELD and evidence["lone_client_max_ms"] < 1e3 * IDLE_STALL_S
    held2 = evidence["probe_bounded_x2"]["share"] >= HELD
    safe = 1 if held1 else 2 if held2 else None
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ServerTraits(version, stalls=not held1, safe_instances=safe, probed_at=when, evidence=evidence)


def local_install_line() -> str:
    """Which tritonserver runs locally, the backends it has, and the one `runtime: auto` serves ONNX with."""
    runtime = local_onnx_runtime()
    backend = "its onnxruntime backend" if runtime == "onnxruntime" else "ONNX Runtime in its python backend"
    return f"local tritonserver: {find_install().describe()}; runtime auto (no GPU) serves ONNX with {runtime} " \
           f"({backend})"


def probe(state_dir: Path, log: Callable[[str], None], url: str | None = None) -> ServerTraits:
    """Measure the server and cache the answer under its version (and, for the bundled one, its binary)."""
    if url is None:
        log(local_install_line())
    with tempfile.TemporaryDirectory(prefix="tritonkit-probe-") as tmp, _served(Path(tmp), state_dir, url, log) as at:
        with Client(at) as c:
            version = c.server_version()
        log(f"probing Triton {version} at {at}")
        evidence = asyncio.run(_measure(at, log))
    traits = traits_from(version, evidence)
    server_traits.save(traits, find_install().fingerprint if url is None else None)
    return traits


def probe_once(state_dir: Path, log: Callable[[str], None]) -> ServerTraits:
    """The bundled server's traits: from the cache, or probed now (once per server version), and
    what they mean for the configs a tuner may propose, logged."""
    traits = server_traits.cached_local(find_install().fingerprint)
    if traits is None:
        log("== probing the bundled tritonserver once (cached per version; `tritonkit probe` to redo)")
        traits = probe(state_dir, log)
    log(traits.describe())
    return traits
