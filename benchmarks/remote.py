"""`tritonkit bench remote`: `tune --url` against a running server, next to local tunes of the same
spec, every winner before the neutral judge together.

The server stands in for one a user deploys and the kit did not start: it is started here as
`tritonkit serve` starts it (the spec's models loaded, the repository API behind a key) with the
sample model from a naive start (batch 16, no delay, one instance) and a second model, which
serves a steady stream of requests for the whole remote tune: a shadow copy must leave it alone.
Then, with that server stopped, the same spec is tuned locally twice: trials measured by
perf_analyzer (the default engine) and by the asyncio client. The judge takes the three winners.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from tritonkit import sample_model
from tritonkit.benchmarks.judge import Entrant, format_judged, judge
from tritonkit.clients import Client, TritonRequestError
from tritonkit.configs.generate import generate
from tritonkit.configs.loader import load_spec
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.results import SCHEMA
from tritonkit.serving import running
from tritonkit.tuner.run import tune_offline, tune_remote
from tritonkit.tuner.trials import TrialWindow

MODEL, BYSTANDER = "edge_mlp", "bystander"
BYSTANDER_RPS = 50.0  # a light steady load: what the shadow copy must not disturb is its service, not its speed


class SteadyLoad:
    """One client sending `rps` requests a second to a model until stopped, counting every failure."""

    def __init__(self, url: str, model: str, rps: float | None):
        self.url, self.model, self.gap = url, model, 1.0 / rps if rps else None
        self.ok, self.failed = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Client(self.url) as c:
            inputs = c.metadata(self.model).random_inputs(1)
            while not self._stop.wait(self.gap):
                try:
                    c.infer(self.model, inputs)
                    self.ok += 1
                except TritonRequestError as e:
                    self.failed.append(str(e)[:200])

    def __enter__(self) -> SteadyLoad:
        if self.gap:  # no rate: no load
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.gap:
            self._thread.join(30)


def write_spec(folder: Path, bystander: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    sample_model.write(folder / "mlp.onnx")
    naive = {"max_queue_delay_us": 0}
    models = [{"name": MODEL, "onnx": "mlp.onnx", "max_batch_size": 16, "batching": naive, "slo": {"p95_ms": 25}}]
    if bystander:
        sample_model.write(folder / "tiny.onnx", width=64, layers=2)
        models.append({"name": BYSTANDER, "onnx": "tiny.onnx", "max_batch_size": 8, "batching": naive})
    path = folder / "deploy.yaml"
    path.write_text(yaml.safe_dump({"models": models, "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}},
                                   sort_keys=False))
    return path


def run_remote_bench(out_dir: Path, *, rounds: int = 3, seconds: float = 5.0, max_trials: int = 30,
                     bystander_rps: float = BYSTANDER_RPS, log: Callable[[str], None] = print) -> dict:
    """`bystander_rps` 0: the second model is served but idle, so the remote tune measures what the
    local ones do and only the path differs."""
    out_dir = Path(out_dir).resolve()
    served_path = write_spec(out_dir / "served", bystander=True)
    repo = out_dir / "served" / "repo"
    generate(load_spec(served_path, repo), repo)
    sides: dict[str, dict] = {}
    entrants: list[Entrant] = []
    log(f"==== remote: tune --url against a running server, a second model at {bystander_rps:g} req/s")
    with running(load_spec(served_path), repo, out_dir / "served" / "state") as r:
        with r.client() as c:
            before = c.config(MODEL)
        with SteadyLoad(r.endpoints.grpc, BYSTANDER, bystander_rps or None) as load:
            t0 = time.perf_counter()
            tuned = tune_remote(load_spec(served_path, None, check_onnx=False), MODEL, r.endpoints.grpc,
                                out_dir / "tune_remote", headers=r.endpoints.key_headers,
                                key_env="TRITONKIT_API_KEY", repo=repo, max_trials=max_trials,
                                write_decision=False, log=log)
            took = time.perf_counter() - t0
        with r.client() as c:
            unchanged = c.config(MODEL) == before and not c.model_ready(MODEL + "__tune")
    sides["remote"] = _side(tuned, took) | {
        "bystander_rps": bystander_rps, "bystander_ok": load.ok, "bystander_failed": len(load.failed),
        "bystander_errors": load.failed[:5], "served_config_unchanged": unchanged}
    entrants.append(_entrant("remote", tuned))
    local_path = write_spec(out_dir / "local", bystander=False)
    for engine in ("perf_analyzer", "asyncio"):
        name = f"local_{engine}"
        log(f"==== {name}: tune on the kit's own server, trials measured by {engine}")
        t0 = time.perf_counter()
        tuned = tune_offline(load_spec(local_path, out_dir / "local" / "repo"), MODEL, out_dir / "local" / "repo",
                             out_dir / "local" / f"state_{engine}", out_dir / f"tune_{name}", max_trials=max_trials,
                             window=TrialWindow(engine=engine), write_decision=False, log=log)
        sides[name] = _side(tuned, time.perf_counter() - t0)
        entrants.append(_entrant(name, tuned))
    spec = load_spec(local_path, out_dir / "local" / "repo")
    judged = judge(spec, MODEL, entrants, out_dir / "judge", p95_ms=25, rounds=rounds, seconds=seconds, log=log)
    log(format_judged(judged))
    for name, side in sides.items():
        side["judged"] = judged["entrants"].get(name)
    result = {"schema": SCHEMA, "kind": "bench/remote", "model": MODEL, "p95_ms": 25, "sides": sides, "judge": judged}
    write_bytes_atomic(out_dir / "bench_remote.json", json.dumps(result, indent=2, default=str).encode())
    log(format_remote(result))
    return result


def _side(tuned, seconds: float) -> dict:
    t = tuned.tuning
    return {"tune_s": round(seconds, 1), "trials": len(tuned.trials.trials), "winner": t.best.knobs.label(),
            "confirmed": t.confirmed, "claim_rps": None if t.best.rate is None else round(t.best.rate, 1),
            "generator_limited": sum(x.generator_limited for x in tuned.trials.trials)}


def _entrant(name: str, tuned) -> Entrant:
    t = tuned.tuning
    start = tuned.trials.spec.model(MODEL)
    return Entrant(name, t.best.knobs.model(start), claim_rps=t.best.rate if t.confirmed else None)


def format_remote(r: dict) -> str:
    lines = [f"{'side':<22}{'tune s':>7}{'trials':>7}{'limited':>8}  {'winner':<34}{'claim':>7}{'judged':>8}  rounds"]
    for name, s in r["sides"].items():
        j = s["judged"] or {}
        rounds = ", ".join("-" if x is None else f"{x:.0f}" for x in j.get("rounds_rps") or [])
        lines.append(f"{name:<22}{s['tune_s']:>7.0f}{s['trials']:>7}{s['generator_limited']:>8}  {s['winner']:<34}"
                     f"{s['claim_rps'] or 0:>7.0f}{j.get('rps') or 0:>8.0f}  {rounds}")
    rem = r["sides"]["remote"]
    lines.append(f"bystander during the remote tune ({rem['bystander_rps']:g} req/s): {rem['bystander_ok']} ok, "
                 f"{rem['bystander_failed']} failed; "
                 f"served config unchanged after it: {rem['served_config_unchanged']}")
    return "\n".join(lines)
