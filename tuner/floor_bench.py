"""`tritonkit bench floor`: how closely one config's figure agrees with itself on this machine.

No search: the spec's config (or the tuned one, where tuned.yaml names the model) on one server,
its sustained rate measured `rounds` times back to back by the rule `bench tuner`'s judge uses
(from one rung above the highest rate it held, down in 5% steps, three runs pooled against the SLO
at each rate). The spread of those rounds, and of the medians of consecutive threes (what one
`bench tuner` figure is), is the floor under any claim that two figures measured on this box
differ: two tuners, two tunes, or two runs of one bench cannot agree more closely than a config
agrees with itself.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from tritonkit.configs.generate import generate
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.results import SCHEMA
from tritonkit.spec import Spec
from tritonkit.tuner.bench import GRID_MAX_RPS, grid_capacity, judge
from tritonkit.tuner.knobs import Knobs, from_spec
from tritonkit.tuner.lock import repository_lock
from tritonkit.tuner.noise import spread_of
from tritonkit.tuner.offline import RATE_STEP, Objective, Score, held
from tritonkit.tuner.run import objective_for
from tritonkit.tuner.settings import DEFAULT_MARGIN, TuneSettings
from tritonkit.tuner.trials import LocalServer, Probe, Trial, Trials

FIGURE_ROUNDS = 3  # a `bench tuner` figure is the median of its judge's three rounds


def run_floor_bench(spec: Spec, model: str, repo: Path, state_dir: Path, out_dir: Path, *, rounds: int = 12,
                    p95_ms: float | None = None, margin: float = DEFAULT_MARGIN, probe: Probe | None = None,
                    log: Callable[[str], None] = print) -> dict:
    objective = objective_for(spec, model, p95_ms, None, TuneSettings.max_errors, margin)
    k = from_spec(spec.model(model))
    t0 = time.perf_counter()
    with repository_lock(repo):
        generate(spec, repo)
        server = LocalServer(spec, repo, state_dir, model, log)
        server.start()
        try:
            trials = Trials(server, spec, repo, model, slo_p95_ms=objective.target_p95_ms,
                            max_error_ratio=objective.max_error_ratio, probe=probe or Probe(), log=log)
            log(f"==== where to start: {k.label()} up the screening ladder, then up by the judge's rule")
            top = highest_held(trials, k, objective)
            rps: list[float] = []
            at_start = 0
            if top is not None:
                # the judge starts a rung above (where the climb failed) and stops two below
                log(f"==== {rounds} rounds from {top * RATE_STEP:.0f} req/s down, 5% steps, "
                    "three pooled runs per rate")
                figures, _, held_first = judge(trials, {"config": Score(k, top, top, None)}, objective, rounds, log)
                rps, at_start = figures["config"], held_first["config"]
        finally:
            generate(spec, repo, models=[model])  # the config as the spec has it, whatever a trial left
            server.close()
    f = floor_figures(rps)
    # a round that held at the first rate has a figure that is only a lower bound: the box sped up
    # since the climb, and the spread above understates it
    f.update(config=k.label(), held_at_first_rate=at_start, objective=objective.describe(), trials=len(trials.trials),
             seconds=round(time.perf_counter() - t0, 1))
    out_dir = Path(out_dir)
    write_bytes_atomic(out_dir / "bench_floor.json", json.dumps(
        {"schema": SCHEMA, "kind": "bench/floor", "model": model, "figures": f,
         "trials": [x.to_json() for x in trials.trials]}, indent=2, default=str).encode())
    log(format_floor_bench(f))
    return f


def highest_held(trials: Trials, k: Knobs, objective: Objective) -> float | None:
    """The highest rung where `k`'s runs, pooled, hold the SLO (the judge's verdict), climbing from
    where one screening run passed. One screening run (against the search's target, on a server
    that has just started) is a poor anchor: a first try on this box passed 350 req/s and failed
    400, and then every round held at the start, 402, the claim rather than a figure."""
    rate = grid_capacity(trials, k).rate
    if rate is None:
        return None
    while rate * RATE_STEP <= GRID_MAX_RPS:
        runs: list[Trial] = []
        while (verdict := held(runs, objective)) is None:
            runs.append(trials.run(k, trials.open_load(rate * RATE_STEP), "climb"))
        if not verdict:
            break
        rate *= RATE_STEP
    return rate


def floor_figures(rps: list[float]) -> dict:
    """The rounds' spread, and that of the medians of consecutive threes; a round that held nowhere
    (0) counts, as it does in `bench tuner`."""
    threes = [statistics.median(rps[i:i + FIGURE_ROUNDS])
              for i in range(0, len(rps) - FIGURE_ROUNDS + 1, FIGURE_ROUNDS)]

    def spread(xs: list[float]) -> float | None:
        return None if (s := spread_of(xs)) is None else round(s, 3)

    return {"rounds_rps": [round(x, 1) for x in rps], "median_rps": statistics.median(rps) if rps else None,
            "spread": spread(rps), "medians_of_3": [round(x, 1) for x in threes], "medians_of_3_spread": spread(threes)}


def format_floor_bench(f: dict) -> str:
    def pct(s: float | None) -> str:
        return "-" if s is None else f"{100 * s:.0f}%"

    rounds = ", ".join(f"{x:.0f}" for x in f["rounds_rps"]) or "none (no screening run held the SLO)"
    threes = ", ".join(f"{x:.0f}" for x in f["medians_of_3"]) or "-"
    return "\n".join([
        f"objective: {f['objective']}; config {f['config']}; {f['trials']} trials in {f['seconds']:.0f} s",
        f"rounds (req/s): {rounds}",
        f"median {f['median_rps'] or 0:.0f} req/s, spread {pct(f['spread'])} ((max - min) / median)",
        f"rounds that held at the first rate (their figure only a lower bound): {f['held_at_first_rate']}",
        f"medians of three consecutive rounds (one `bench tuner` figure each): {threes}; "
        f"spread {pct(f['medians_of_3_spread'])}",
    ])
