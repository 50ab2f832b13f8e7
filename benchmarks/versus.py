"""`tritonkit bench versus`: the kit's tuner and Model Analyzer's quick search, from the same naive
start (benchmarks/cases.py), on the same server, with the same bounds and SLO; then the neutral
judge on both winners, served side by side.

Per side: the search's wall time (MA's counted to its last new measurement), what it measured,
its winner, and the judge's figure over its rounds: the sustained rate within the SLO, or for a
latency objective the P95 at the fixed rate.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tritonkit.benchmarks.cases import write_case
from tritonkit.benchmarks.judge import Entrant, format_judged, judge, judge_at_rate
from tritonkit.benchmarks.model_analyzer import format_model_analyzer, peer_start, run_model_analyzer, winner_model
from tritonkit.configs.loader import load_spec
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.results import SCHEMA
from tritonkit.tuner.knobs import max_instances
from tritonkit.tuner.run import max_batch_bound, tune_offline
from tritonkit.tuner.settings import TuneSettings
from tritonkit.tuner.trials import TrialWindow


def run_versus(case: str, out_dir: Path, *, ma_wall_s: float, rounds: int = 3, seconds: float = 5.0,
               engine: str = TuneSettings.engine, max_trials: int = TuneSettings.max_trials,
               log: Callable[[str], None] = print) -> dict:
    folder = Path(out_dir).resolve() / case
    spec = load_spec(write_case(case, folder), folder / "repo")
    model = spec.models[0].name
    start = spec.model(model)
    slo, rps = start.slo.p95_ms, start.slo.rps
    bound = max(1, max_batch_bound(spec, model))
    log(f"==== case {case}: Model Analyzer's quick search")
    ma = run_model_analyzer(spec, model, folder / "model_analyzer", p95_ms=slo, rps=rps, max_instances=max_instances(),
                            max_batch=bound, wall_s=ma_wall_s, log=log)
    log(format_model_analyzer(ma))
    log(f"==== case {case}: tritonkit tune (trials measured by {engine})")
    tuned = tune_offline(spec, model, folder / "repo", folder / "state", folder / "tune", rps=rps,
                         max_trials=max_trials, window=TrialWindow(engine=engine), write_decision=False, log=log)
    t = tuned.tuning
    entrants = [Entrant("kit", t.best.knobs.model(start), claim_rps=None if rps else t.best.rate)]
    if ma["winner"] is not None:
        entrants.append(Entrant("model_analyzer", winner_model(peer_start(start)[0], ma["winner"])))
    if rps:
        judged = judge_at_rate(spec, model, entrants, folder / "judge", rps=rps, p95_ms=slo, rounds=rounds,
                               seconds=seconds, log=log)
    else:
        judged = judge(spec, model, entrants, folder / "judge", p95_ms=slo, rounds=rounds, seconds=seconds, log=log)
    log(format_judged(judged))
    sides = {
        "kit": {"search_s": round(tuned.seconds, 1), "measurements": len(tuned.trials.trials),
                "configs": len({x.label for x in tuned.trials.trials}), "winner": t.best.knobs.label(),
                "confirmed": t.confirmed, "kept": t.kept},
        "model_analyzer": {"search_s": ma["search_s"], "wall_s": ma["wall_s"], "measurements": len(ma["configs"]),
                           "configs": len({m["variant"] for m in ma["configs"]}), "stopped": ma["stopped"],
                           "winner": None if ma["winner"] is None else
                           f"batch {ma['winner']['max_batch_size']} x{ma['winner']['instances']}"},
    }
    for name, side in sides.items():
        side["judged"] = judged["entrants"].get(name)
    result = {"schema": SCHEMA, "kind": "bench/versus", "case": case, "model": model, "p95_ms": slo, "rps": rps,
              "engine": engine, "sides": sides, "model_analyzer": ma, "judge": judged}
    write_bytes_atomic(folder / "bench_versus.json", json.dumps(result, indent=2, default=str).encode())
    log(format_versus(result))
    return result


def format_versus(r: dict) -> str:
    latency = r["rps"] is not None
    head = "P95 ms at the rate" if latency else "req/s held"
    lines = [f"case {r['case']}: {'lowest P95 at ' + format(r['rps'], 'g') + ' req/s' if latency else 'most req/s'}"
             f" with P95 <= {r['p95_ms']:g} ms",
             f"{'side':<16}{'search s':>9}{'measured':>9}{'configs':>8}  {'winner':<40}{head:>20}   rounds"]
    for name, s in r["sides"].items():
        j = s["judged"] or {}
        figure = j.get("p95_ms") if latency else j.get("rps")
        rounds = j.get("rounds_p95_ms") if latency else j.get("rounds_rps")
        shown = ", ".join("-" if x is None else f"{x:.1f}" for x in rounds or [])
        lines.append(f"{name:<16}{s['search_s'] or 0:>9.0f}{s['measurements']:>9}{s['configs']:>8}  "
                     f"{s['winner'] or '-':<40}{'-' if figure is None else format(figure, '.1f'):>20}   {shown}")
    return "\n".join(lines)
