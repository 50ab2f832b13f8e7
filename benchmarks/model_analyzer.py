"""NVIDIA's Model Analyzer (MA) as the peer the tuner is measured against: its quick search on the
same model, from the same starting config, against the same bundled server, with the same bounds
(instances, max batch, the P95 constraint), read back from its checkpoint.

What MA needs from a repository, and what the kit gives it:
- a server it can load models into without a key: the bundled server is started for MA alone
  with model control open (on this machine's loopback), in remote launch mode;
- a start config it can vary: MA sets `max_batch_size` and `instance_group` on a copy of the
  config and keeps everything else, so the kit's preferred batch sizes (above MA's first max
  batch of 1), its warm-up samples (at the spec's max batch) and its queue policies (whose first
  refusal stops the perf_analyzer run MA measures with) would each make MA skip or lose every
  candidate; `peer_start` leaves them out and says so;
- the kit's perf_analyzer for the server's version, with its libraries, and the model's inputs
  from the one sampler, as perf_analyzer's `--input-data`;
- `cpu_only` (no GPU metrics to wait for), perf_analyzer's CPU ceiling lifted (MA kills it above
  80% by default, which a 2-core box reaches), and time windows rather than request counts.
MA's wall time is bounded, and so is a search that stops making new measurements (1.58's quick
search can keep stepping a coordinate already at its bound, skipping measurements it has).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from tritonkit.clients import Client
from tritonkit.configs.generate import generate
from tritonkit.errors import InputError, KitError, Problem
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests import pa_install
from tritonkit.loadtests.pa_run import sample_json
from tritonkit.server import LocalTriton
from tritonkit.spec import Batching, Instances, ModelSpec, ServerSpec, Spec

# No new measurement for this long, and none under way: the search is only revisiting what it has.
# One measurement under way can take longer on a noisy box (perf_analyzer widening its window until
# it is stable): that is progress, bounded by the wall time alone.
STALL_S = 180.0
_STARTED = re.compile(r"Profiling \S+: concurrency=")
# what MA logs once a measurement is over: saved, skipped (nothing saved), or the next config begun
_OVER = ("Saved checkpoint", "no checkpoint saved", "model config:")


def _under_way(log_text: str) -> bool:
    """Has MA started a measurement it has not finished (its log's last word on one)?"""
    started = [m.start() for m in _STARTED.finditer(log_text)]
    return bool(started) and started[-1] > max(log_text.rfind(w) for w in _OVER)


INPUT_SAMPLES = 16


def require_model_analyzer() -> Path:
    """The `model-analyzer` of this environment, or exit 2 naming the extra that brings it."""
    if importlib.util.find_spec("model_analyzer") is not None:
        found = Path(sys.executable).parent / "model-analyzer"
        on_path = shutil.which("model-analyzer")
        if found.exists() or on_path:
            return found if found.exists() else Path(on_path)
    raise InputError([Problem("command line", "tritonkit bench peer", "Model Analyzer is not installed",
                              "pip install 'triton-edge-kit[peer]' (in a checkout: "
                              ".venv/bin/pip install -e '.[peer]')")])


def peer_start(m: ModelSpec) -> tuple[ModelSpec, list[str]]:
    """The start config MA can search, and what was left out for it (see the module's docstring)."""
    left_out = []
    b = m.batching
    if b.preferred_batch_sizes:
        left_out.append(f"preferred_batch_sizes {b.preferred_batch_sizes}")
    if b.default_queue_policy or b.priority_queue_policies:
        left_out.append("the queue policies")
    if m.warmup and m.max_batch_size:
        left_out.append("the warm-up samples")
    batching = Batching(enabled=b.enabled, max_queue_delay_us=b.max_queue_delay_us)
    return m.model_copy(update={"batching": batching, "warmup": False}), left_out


def run_model_analyzer(spec: Spec, model: str, work: Path, *, p95_ms: float, max_instances: int, max_batch: int,
                       wall_s: float, rps: float | None = None, window_ms: int | None = None,
                       max_measurements: int | None = None, pa_windows: int | None = None,
                       log: Callable[[str], None] = print) -> dict:
    """MA's quick search; its configs, its winner (the highest throughput within the P95, or with
    `rps` the lowest P95 that serves that rate) and its wall time, counted to its last new
    measurement. `window_ms`: perf_analyzer's measurement window (default: its own);
    `max_measurements`: MA is stopped once it has saved that many (default: no bound);
    `pa_windows`: perf_analyzer's windows per measurement, its stability check off (default: its
    own, up to ten windows until three agree, which a busy box can make take ten)."""
    ma = require_model_analyzer()
    work = Path(work).resolve()
    start, left_out = peer_start(spec.model(model))
    if left_out:
        log(f"== Model Analyzer starts from {model}'s config without {', '.join(left_out)}")
    peer = Spec(spec.data.model_copy(update={"models": [start], "server": ServerSpec()}), spec.path, spec.shown)
    repo = work / "repo"
    generate(peer, repo)
    server = LocalTriton(repo, ServerSpec(http_port=0, grpc_port=0, metrics_port=0), work / "state", restricted=False)
    with server:
        e = server.endpoints
        with Client(e.grpc) as c:
            c.load(model)  # to read its inputs; MA loads each candidate itself
            pa = pa_install.find(c.server_version(), log=log)
            meta = c.metadata(model)
            sampler = meta.sampler(None, 0)
            samples = [sample_json(x, sampler.batched) for x in sampler.spread(INPUT_SAMPLES if sampler.varies else 1)]
            c.unload(model)
        data = work / "input_data.json"
        data.write_text(json.dumps({"data": samples}))
        config = work / "model_analyzer.yaml"
        checkpoints = work / "checkpoints"
        shutil.rmtree(checkpoints, ignore_errors=True)
        config.write_text(yaml.safe_dump({
            "model_repository": str(repo), "triton_launch_mode": "remote", "client_protocol": "grpc",
            "triton_grpc_endpoint": e.grpc, "triton_http_endpoint": f"{e.host}:{e.http_port}",
            "triton_metrics_url": e.metrics, "perf_analyzer_path": str(pa.binary),
            "perf_analyzer_cpu_util": 100.0 * (os.cpu_count() or 1), "perf_output": False,
            "run_config_search_mode": "quick", "run_config_search_max_instance_count": max_instances,
            "run_config_search_max_model_batch_size": max_batch,
            "export_path": str(work / "export"), "checkpoint_directory": str(checkpoints),
            "output_model_repository_path": str(work / "variants"), "override_output_model_repository": True,
            "profile_models": {model: {
                "cpu_only": True, **objectives(p95_ms, rps),
                "perf_analyzer_flags": {"measurement-mode": "time_windows", "input-data": str(data),
                                        **({"measurement-interval": window_ms} if window_ms else {}),
                                        **({"max-trials": pa_windows, "stability-percentage": 100000}
                                           if pa_windows else {})}}},
        }))
        log(f"== Model Analyzer {_version(ma)}: quick search, at most {max_instances} instances and max batch "
            f"{max_batch}, P95 <= {p95_ms:g} ms, at most {wall_s:.0f} s (log: {work / 'model_analyzer.log'})")
        wall, last_new, stopped = _supervise(ma, config, pa, work / "model_analyzer.log", wall_s, max_measurements, log)
    measured = read_checkpoint(checkpoints / "0.ckpt", model)
    winner = best(measured, p95_ms, rps)
    result = {"wall_s": round(wall, 1), "search_s": round(last_new, 1), "stopped": stopped,
              "start_left_out": left_out, "configs": measured, "winner": winner}
    write_bytes_atomic(work / "model_analyzer.json", json.dumps(result, indent=2).encode())
    return result


def _version(ma: Path) -> str:
    try:
        from importlib.metadata import version

        return version("triton-model-analyzer")
    except Exception:  # noqa: BLE001 - a version is only for the log
        return str(ma)


def _supervise(ma: Path, config: Path, pa: pa_install.PerfAnalyzer, log_path: Path, wall_s: float,
               max_measurements: int | None, log: Callable[[str], None]) -> tuple[float, float, str]:
    """Run MA until it finishes, `wall_s` passes, STALL_S pass without a new measurement or one
    under way, or it has saved `max_measurements`.
    Returns its wall time, the time of its last new measurement and why it stopped."""
    env = pa.environ()
    t0 = time.monotonic()
    last_new, last_busy, seen, stopped = 0.0, 0.0, 0, "finished"
    with open(log_path, "w") as out:
        proc = subprocess.Popen([str(ma), "profile", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=config.parent, start_new_session=True)
        while proc.poll() is None:
            time.sleep(2)
            now = time.monotonic() - t0
            text = log_path.read_text(errors="replace")
            profiled = text.count("Saved checkpoint")
            if profiled > seen:
                seen, last_new = profiled, now
                line = [x for x in text.splitlines() if "Profiling " in x][-1:]
                log(f"   [{now:4.0f} s] {line[0].split('] ', 1)[-1] if line else 'measured'}")
            if _under_way(text):
                last_busy = now
            idle = now - max(last_new, last_busy)
            reason = "wall time" if now > wall_s else "no new measurement" if idle > STALL_S else \
                "measurement budget" if max_measurements is not None and seen >= max_measurements else None
            if reason:
                stopped = f"stopped by the kit: {reason}"
                os.killpg(proc.pid, signal.SIGINT)  # MA saves its checkpoint on Ctrl-C
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        if proc.returncode and stopped == "finished" and seen == 0:
            raise KitError(f"Model Analyzer failed (exit {proc.returncode}); see {log_path}")
    return time.monotonic() - t0, last_new, stopped


def read_checkpoint(path: Path, model: str) -> list[dict]:
    """Every (config, concurrency) MA measured: the knobs it set, throughput and P95."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise KitError(f"Model Analyzer left no readable checkpoint at {path} ({e})") from None
    out = []
    for variant, (run_config, measurements) in data["ResultManager.results"]["_results"].get(model, {}).items():
        cfg = run_config["_model_run_configs"][0]["_model_config_variant"]["model_config"]
        db = cfg.get("dynamicBatching", {})
        knobs = {"max_batch_size": int(cfg.get("maxBatchSize", 0)),
                 "instances": sum(int(g.get("count", 1)) for g in cfg.get("instanceGroup", [])) or 1,
                 "max_queue_delay_us": int(db.get("maxQueueDelayMicroseconds", 0)),
                 "preferred_batch_sizes": [int(x) for x in db.get("preferredBatchSize", [])],
                 "dynamic_batching": "dynamicBatching" in cfg}
        for m in measurements.values():
            for mc in m["_model_config_measurements"]:
                values = dict((k, v["_value"]) for k, v in mc["_non_gpu_data"])
                out.append({"variant": variant, **knobs,
                            "concurrency": mc["_model_specific_pa_params"].get("concurrency-range"),
                            "throughput_rps": values.get("perf_throughput"),
                            "p95_ms": values.get("perf_latency_p95")})
    return out


def objectives(p95_ms: float, rps: float | None) -> dict:
    """MA's objective and constraints for the kit's: the most throughput within the P95, or the
    lowest P95 among the configs that serve `rps`."""
    if rps is None:
        return {"constraints": {"perf_latency_p95": {"max": p95_ms}}}
    return {"objectives": {"perf_latency_p95": 10},
            "constraints": {"perf_latency_p95": {"max": p95_ms}, "perf_throughput": {"min": rps}}}


def best(measured: list[dict], p95_ms: float, rps: float | None = None) -> dict | None:
    """MA's pick: the highest throughput whose P95 meets the constraint; with `rps`, the lowest P95
    among those that serve at least that rate."""
    ok = [m for m in measured if m["p95_ms"] is not None and m["p95_ms"] <= p95_ms and m["throughput_rps"]]
    if rps is not None:
        ok = [m for m in ok if m["throughput_rps"] >= rps]
        return min(ok, key=lambda m: m["p95_ms"]) if ok else None
    return max(ok, key=lambda m: m["throughput_rps"]) if ok else None


def winner_model(start: ModelSpec, winner: dict) -> ModelSpec:
    """MA's winning config as the spec's model: its max batch and instances on the start config."""
    batching = start.batching.model_copy(update={
        "enabled": winner["dynamic_batching"], "max_queue_delay_us": winner["max_queue_delay_us"],
        "preferred_batch_sizes": winner["preferred_batch_sizes"]})
    return start.model_copy(update={"max_batch_size": winner["max_batch_size"], "batching": batching,
                                    "instances": Instances(kind=start.instances.kind, count=winner["instances"])})


def format_model_analyzer(r: dict) -> str:
    lines = [f"Model Analyzer: {len({m['variant'] for m in r['configs']})} configs, {len(r['configs'])} measurements, "
             f"{r['wall_s']:.0f} s ({r['search_s']:.0f} s to its last new measurement; {r['stopped']})",
             f"{'variant':<28}{'max batch':>10}{'inst':>6}{'conc':>6}{'req/s':>9}{'P95 ms':>9}"]
    for m in r["configs"]:
        lines.append(f"{m['variant']:<28}{m['max_batch_size']:>10}{m['instances']:>6}{m['concurrency'] or 0:>6}"
                     f"{m['throughput_rps'] or 0:>9.0f}{m['p95_ms'] or 0:>9.2f}")
    w = r["winner"]
    lines.append("winner: none within the P95" if w is None else
                 f"winner: {w['variant']}: max batch {w['max_batch_size']}, {w['instances']} instance(s), "
                 f"{w['throughput_rps']:.0f} req/s at concurrency {w['concurrency']}, P95 {w['p95_ms']:.2f} ms")
    return "\n".join(lines)
