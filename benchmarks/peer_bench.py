"""`tritonkit bench peer`: Model Analyzer's quick search on the spec's model, then the neutral
judge on its winner and on the spec's own config, served side by side.

The question a Triton user asks before picking the kit: what would Model Analyzer, the tool they
would use instead, have given them from the same start, and does it hold up under open-loop load
at the same SLO? Both answers come from perf_analyzer: MA measures with it, and so does the judge.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tritonkit.benchmarks.judge import Entrant, format_judged, judge
from tritonkit.benchmarks.model_analyzer import format_model_analyzer, peer_start, run_model_analyzer, winner_model
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.results import SCHEMA
from tritonkit.spec import Spec
from tritonkit.tuner.knobs import max_instances
from tritonkit.tuner.run import max_batch_bound
from tritonkit.tuner.settings import slo_for

MA_WALL_S = 900.0


def run_peer_bench(spec: Spec, model: str, out_dir: Path, *, p95_ms: float | None = None, wall_s: float = MA_WALL_S,
                   rounds: int = 3, seconds: float = 5.0, log: Callable[[str], None] = print) -> dict:
    out_dir = Path(out_dir)
    slo = slo_for(spec, model, p95_ms)
    ma = run_model_analyzer(spec, model, out_dir / "model_analyzer", p95_ms=slo, max_instances=max_instances(),
                            max_batch=max(1, max_batch_bound(spec, model)), wall_s=wall_s, log=log)
    log(format_model_analyzer(ma))
    entrants = [Entrant("spec", spec.model(model))]
    if ma["winner"] is not None:
        entrants.append(Entrant("model_analyzer", winner_model(peer_start(spec.model(model))[0], ma["winner"])))
    judged = judge(spec, model, entrants, out_dir / "judge", p95_ms=slo, rounds=rounds, seconds=seconds, log=log)
    log(format_judged(judged))
    bench = {"schema": SCHEMA, "kind": "bench/peer", "model": model, "p95_ms": slo,
             "model_analyzer": ma, "judge": judged}
    write_bytes_atomic(out_dir / "bench_peer.json", json.dumps(bench, indent=2, default=str).encode())
    return bench
