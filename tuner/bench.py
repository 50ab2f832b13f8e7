"""`tritonkit bench tuner`: the tuner against an exhaustive grid over the same knobs, on one server.

The grid is what Model Analyzer's brute-force search does: every combination of max batch, queue
delay and instance count, each with a rate sweep (doubling from 100 req/s, then the tuner's own
1.15 steps inside the last bracket, so both find a capacity to the same resolution). The best
grid point is confirmed by a second measurement exactly as the tuner's winner is, so that neither
side wins by one lucky short run. Figures: the tuner's confirmed throughput as a percentage of
the grid's, and its trials and time as percentages of the grid's.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from tritonkit.configs.generate import generate
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.results import SCHEMA
from tritonkit.spec import Spec
from tritonkit.tuner.knobs import Knobs, batch_sizes, from_spec, grid
from tritonkit.tuner.lock import repository_lock
from tritonkit.tuner.offline import RATE_STEP, Score, Search, confirm
from tritonkit.tuner.run import max_batch_bound, objective_for
from tritonkit.tuner.trials import LocalServer, Probe, Trials

GRID_START_RPS = 100.0
GRID_MAX_RPS = 6400.0


def grid_capacity(trials: Trials, k: Knobs) -> Score:
    rate, passed = GRID_START_RPS, None
    while rate <= GRID_MAX_RPS:
        t = trials.run(k, trials.open_load(rate), "grid")
        if not t.passed:
            break
        passed = Score(k, t.ok_rps, rate, t)
        rate *= 2
    if passed is None:
        return Score(k, -math.inf, None, None)
    rate = passed.rate * RATE_STEP
    while rate < passed.rate * 2:
        t = trials.run(k, trials.open_load(rate), "grid")
        if not t.passed:
            break
        passed = Score(k, t.ok_rps, rate, t)
        rate *= RATE_STEP
    return passed


def run_tuner_bench(spec: Spec, model: str, repo: Path, state_dir: Path, out_dir: Path, *,
                    p95_ms: float | None = None, max_trials: int = 30, probe: Probe | None = None,
                    log: Callable[[str], None] = print) -> dict:
    objective = objective_for(spec, model, p95_ms, None, 0.01)
    bound = max_batch_bound(spec, model)
    probe = probe or Probe()
    with repository_lock(repo):
        generate(spec, repo)
        server = LocalServer(spec, repo, state_dir, model, log)
        server.start()
        try:
            def trials() -> Trials:
                return Trials(server, spec, repo, model, slo_p95_ms=objective.slo_p95_ms,
                              max_error_ratio=objective.max_error_ratio, probe=probe, log=log)

            log("==== the tuner")
            t0, tuner_trials = time.perf_counter(), trials()
            tuning = Search(tuner_trials, objective, bound, max_trials, log).run(from_spec(spec.model(model)))
            tuner_s = time.perf_counter() - t0

            points = grid(batch_sizes(bound))
            log(f"==== the grid: {len(points)} configs")
            t0, grid_trials = time.perf_counter(), trials()
            scores = [grid_capacity(grid_trials, k) for k in points]
            ranked = sorted((s for s in scores if s.rate), key=lambda s: -s.value)
            grid_best = None
            if ranked:
                log(f"== confirm the grid's best: {ranked[0].knobs.label()} at {ranked[0].rate:.0f} req/s")
                grid_best = confirm(grid_trials, [ranked[0].knobs], ranked[0].rate, step_down=True)
            grid_s = time.perf_counter() - t0
        finally:
            generate(spec, repo, models=[model])
            server.close()

    def rps(s: Score | None) -> float | None:
        return s.trial.ok_rps if s is not None and s.trial is not None and s.passed else None

    tuner_rps = rps(tuning.best) if tuning.confirmed else None
    grid_rps = rps(grid_best)
    figures = {
        "objective": objective.describe(),
        "tuner": {"best": tuning.best.knobs.label(), "rps": tuner_rps, "trials": len(tuner_trials.trials),
                  "seconds": round(tuner_s, 1)},
        "grid": {"configs": len(points), "best": grid_best.knobs.label() if grid_best else None, "rps": grid_rps,
                 "best_unconfirmed_rps": ranked[0].value if ranked else None,
                 "trials": len(grid_trials.trials), "seconds": round(grid_s, 1)},
        "throughput_pct_of_grid": round(100 * tuner_rps / grid_rps, 1) if tuner_rps and grid_rps else None,
        "trials_pct_of_grid": round(100 * len(tuner_trials.trials) / len(grid_trials.trials), 1),
        "time_pct_of_grid": round(100 * tuner_s / grid_s, 1),
        "targets": {"throughput_pct_at_least": 95, "trials_pct_at_most": 15},
    }
    bench = {"schema": SCHEMA, "kind": "bench/tuner", "model": model, "figures": figures,
             "tuner_trials": [t.to_json() for t in tuner_trials.trials],
             "grid_trials": [t.to_json() for t in grid_trials.trials]}
    out_dir = Path(out_dir)
    write_bytes_atomic(out_dir / "bench_tuner.json", json.dumps(bench, indent=2, default=str).encode())
    log(format_tuner_bench(figures))
    return bench


def format_tuner_bench(f: dict) -> str:
    t, g = f["tuner"], f["grid"]
    return "\n".join([
        f"objective: {f['objective']}",
        f"{'':<8}{'best config':<40}{'req/s':>9}{'trials':>8}{'seconds':>9}",
        f"{'tuner':<8}{t['best']:<40}{t['rps'] or 0:>9.0f}{t['trials']:>8}{t['seconds']:>9.0f}",
        f"{'grid':<8}{g['best'] or '-':<40}{g['rps'] or 0:>9.0f}{g['trials']:>8}{g['seconds']:>9.0f}",
        f"tuner / grid: throughput {f['throughput_pct_of_grid']}%, trials {f['trials_pct_of_grid']}%, "
        f"time {f['time_pct_of_grid']}% (targets: >= 95% of the throughput in <= 15% of the trials)",
    ])
