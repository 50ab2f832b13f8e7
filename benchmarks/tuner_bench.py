"""`tritonkit bench tuner`: the tuner against an exhaustive grid over the same knobs, on one server.

The grid is what Model Analyzer's brute-force search does: every combination of max batch, queue
delay and instance count, each screened by single runs from GRID_START_RPS (or lower where no config
holds that) along the tuner's own walk to the edge (`tuner/ladder.py`). Both sides then decide by
the same rules (tuner/noise.py): the grid's GRID_FINALISTS best screened configs get the tuner's
majority-of-runs sustained rate (`Search.sustained`), and each side's winner is confirmed by the
same `confirm` (three runs, pooled). Both sides also obey `tritonkit probe` (passed in as the
server's traits): the grid still screens every combination, as a brute-force search knows nothing of
the server, but a config the probe found stalls the batcher is never a finalist, as the tuner never
proposes one; the trials the grid spent on such configs are reported apart. The grid runs first: the
tuner then gets TRIALS_SHARE of the grid's trials as its budget, the bound the comparison is about.
Last, both winners are measured in `rounds` rounds by the neutral judge (benchmarks/judge.py):
both configs served side by side in one server, perf_analyzer at the same Poisson rates,
interleaved, so that a drift of the machine hits both: the figures are the medians of those rounds,
with their spread. Reported: the tuner's figure as a percentage of the grid's, its trials and time
as percentages of the grid's, and each search's own confirmed rate (what `tritonkit tune` would have
written).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from tritonkit.benchmarks.judge import Entrant, judge
from tritonkit.configs.generate import generate
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.results import SCHEMA
from tritonkit.server_traits import ServerTraits
from tritonkit.spec import Spec
from tritonkit.stats import relative_range
from tritonkit.tuner.confirm import confirm
from tritonkit.tuner.knobs import Knobs, from_spec, grid, powers_of_two
from tritonkit.tuner.ladder import down_from, walk_up
from tritonkit.tuner.lock import repository_lock
from tritonkit.tuner.objective import Score
from tritonkit.tuner.offline import Search
from tritonkit.tuner.rules import RULES, Rules
from tritonkit.tuner.run import max_batch_bound, objective_for
from tritonkit.tuner.settings import TuneSettings
from tritonkit.tuner.strategy import EveryCandidate, drive
from tritonkit.tuner.trials import LocalServer, Trials, TrialWindow

GRID_START_RPS = 200.0  # a coarse ladder: a config that cannot serve this is nowhere near the best
GRID_MIN_RPS = 25.0  # ... unless none can: on a slow box the ladder starts at half, down to this
GRID_MAX_RPS = 6400.0
GRID_FINALISTS = 3  # screened configs that get the majority-of-runs rate search
# The claim under test is "most of the grid's throughput for a fraction of its trials": the grid
# runs first and the tuner gets that fraction of its trials as its budget (never more than
# --max-trials, never less than a calibration, a baseline and a confirmation need).
TRIALS_SHARE = 0.15
MIN_TUNER_TRIALS = 12


def screen(trials: Trials, points: list[Knobs], rules: Rules = RULES) -> list[Score]:
    """Every config up the rate ladder, best first (the grid's strategy: every candidate once,
    `tuner/strategy.py`). Where none held the first rung (a box slower than the ladder assumes),
    all of them again from half that rate, down to GRID_MIN_RPS, so that the grid has a figure
    wherever the tuner can have one."""
    screened: list[Score] = []

    def any_holds(start: float) -> bool:
        grid_search = EveryCandidate(points)
        drive(grid_search, lambda k: grid_capacity(trials, k, start, rules), lambda: True)
        screened[:] = [s for _, s in grid_search.results if s.rate]
        return bool(screened)

    down_from(GRID_START_RPS, any_holds, 2.0, lambda: True, 1 + int(math.log2(GRID_START_RPS / GRID_MIN_RPS)))
    return sorted(screened, key=lambda s: -s.rate)


def grid_capacity(trials: Trials, k: Knobs, start: float = GRID_START_RPS, rules: Rules = RULES) -> Score:
    """One screening run per rate, the same walk to the edge as the tuner's (`tuner/ladder.py`): the
    highest rate that passed, none when the first failed."""
    scores: dict[float, Score] = {}

    def holds(rate: float) -> bool:
        if rate > GRID_MAX_RPS:
            return False
        t = trials.run(k, trials.open_load(rate), "grid")
        if t.passed:
            scores[rate] = Score(k, t.ok_rps, rate, t)
        return t.passed

    if not holds(start):
        return Score(k, -math.inf, None, None)
    top, _ = walk_up(start, holds, rules.rate_step, lambda: True)
    return scores[top]


def run_tuner_bench(spec: Spec, model: str, repo: Path, state_dir: Path, out_dir: Path, *,
                    p95_ms: float | None = None, max_trials: int = TuneSettings.max_trials,
                    window: TrialWindow | None = None,
                    rules: Rules = RULES, rounds: int = 3,
                    traits: ServerTraits | None = None, final_judge: Callable[..., dict] = judge,
                    log: Callable[[str], None] = print) -> dict:
    objective = objective_for(spec, model, p95_ms, None, TuneSettings.max_errors, rules)
    bound = max_batch_bound(spec, model)
    window = window or TrialWindow()
    with repository_lock(repo):
        generate(spec, repo)
        server = LocalServer(spec, repo, state_dir, model, log)
        server.start()
        try:
            def trials() -> Trials:
                return Trials(server, spec, repo, model, slo=objective, window=window, log=log)

            points = grid(powers_of_two(bound))
            log(f"==== the grid: {len(points)} configs")
            t0, grid_trials = time.perf_counter(), trials()
            screened = screen(grid_trials, points, rules)
            # the same rules as the tuner's from here: the probe's, majority-of-runs rates, then the
            # same confirmation
            referee = Search(grid_trials, objective, bound, 10 ** 6, log, traits, rules)
            stalling = {k.label() for k in points if referee.stalls(k)}
            if stalling:
                log(f"== {len(stalling)} of the grid's configs are no finalists: {traits.describe()}")
            safe = [s for s in screened if s.knobs.label() not in stalling]
            log(f"== the grid's {GRID_FINALISTS} best, by the tuner's rules")
            finalists = [referee.sustained(s.knobs, s.rate, "grid") for s in safe[:GRID_FINALISTS]]
            ranked = sorted((s for s in finalists if s.passed), key=lambda s: (-s.rate, -s.value))
            grid_best = None
            if ranked:
                best = ranked[0]
                log(f"== confirm the grid's best: {best.knobs.label()} at {best.rate:.0f} req/s")
                grid_best = confirm(grid_trials, [best.knobs], best.rate, step_down=True, objective=objective,
                                    rules=rules).score
            grid_s = time.perf_counter() - t0

            budget = min(max_trials, max(MIN_TUNER_TRIALS, int(TRIALS_SHARE * len(grid_trials.trials))))
            log(f"==== the tuner: {budget} trials ({TRIALS_SHARE:.0%} of the grid's {len(grid_trials.trials)}, "
                f"at most {max_trials})")
            t0, tuner_trials = time.perf_counter(), trials()
            search = Search(tuner_trials, objective, bound, budget, log, traits, rules)
            tuning = search.run(from_spec(spec.model(model)))
            tuner_s = time.perf_counter() - t0

            sides = {"tuner": tuning.best if tuning.confirmed else None, "grid": grid_best}
        finally:
            generate(spec, repo, models=[model])
            server.close()
    log(f"==== both winners judged in {rounds} rounds by perf_analyzer, side by side")
    entrants = [Entrant(name, s.knobs.model(spec.model(model)), claim_rps=s.rate) for name, s in sides.items() if s]
    judged = final_judge(spec, model, entrants, Path(out_dir) / "judge", p95_ms=objective.p95_ms,
                         max_errors=objective.max_error_ratio, rounds=rounds, log=log) if entrants else None
    scored = judged["entrants"] if judged else {}
    figures_of = {name: scored[name]["rounds_rps"] if name in scored else [] for name in sides}
    p95s_of = {name: scored[name]["p95_ms_at_figure"] if name in scored else [] for name in sides}

    def side(s: Score | None, trial_list: list, seconds: float, name: str, pick: Score | None = None) -> dict:
        again = figures_of[name]
        label = s.knobs.label() if s else (f"{pick.knobs.label()} (unconfirmed)" if pick and pick.passed else None)
        return {"best": label, "judged_p95_ms": p95s_of[name],
                "confirmed_rps": s.value if s is not None and s.passed else None,
                "judged_rps": again, "rps": statistics.median(again) if again else None,
                "spread": None if (sp := relative_range(again)) is None else round(sp, 3),
                "trials": len(trial_list), "seconds": round(seconds, 1)}

    t = side(sides["tuner"], tuner_trials.trials, tuner_s, "tuner", tuning.best)
    g = side(grid_best, grid_trials.trials, grid_s, "grid", ranked[0] if ranked else None)
    g.update(configs=len(points), best_unconfirmed_rps=ranked[0].value if ranked else None,
             stalling_configs=len(stalling),
             stalling_trials=sum(1 for x in grid_trials.trials if x.label in stalling))
    t.update(noise_log_sd=tuning.noise_log_sd, margin=objective.margin)
    figures = {
        "objective": objective.describe(),
        "tuner": t, "grid": g,
        "throughput_pct_of_grid": round(100 * t["rps"] / g["rps"], 1) if t["rps"] and g["rps"] else None,
        "confirmed_pct_of_grid": round(100 * t["confirmed_rps"] / g["confirmed_rps"], 1)
        if t["confirmed_rps"] and g["confirmed_rps"] else None,
        "trials_pct_of_grid": round(100 * t["trials"] / g["trials"], 1),
        # against the grid's trials on the configs the probe allows: what a probe-aware grid would cost
        "trials_pct_of_safe_grid": round(100 * t["trials"] / max(1, g["trials"] - g["stalling_trials"]), 1),
        "time_pct_of_grid": round(100 * tuner_s / grid_s, 1),
        "tuner_budget": budget,
        "targets": {"throughput_pct_at_least": 95, "trials_pct_at_most": round(100 * TRIALS_SHARE)},
    }
    bench = {"schema": SCHEMA, "kind": "bench/tuner", "model": model, "figures": figures,
             "tuner_trials": [x.to_json() for x in tuner_trials.trials],
             "grid_trials": [x.to_json() for x in grid_trials.trials], "judge": judged}
    out_dir = Path(out_dir)
    write_bytes_atomic(out_dir / "bench_tuner.json", json.dumps(bench, indent=2, default=str).encode())
    log(format_tuner_bench(figures))
    return bench


def format_tuner_bench(f: dict) -> str:
    t, g = f["tuner"], f["grid"]

    def row(name: str, s: dict) -> str:
        again = ", ".join(f"{x:.0f}" for x in s["judged_rps"]) or "-"
        spread = "-" if s["spread"] is None else f"{100 * s['spread']:.0f}%"
        return f"{name:<8}{s['best'] or '-':<40}{s['rps'] or 0:>9.0f}{spread:>8}{s['trials']:>8}" \
               f"{s['seconds']:>9.0f}   {again}"

    return "\n".join([
        f"objective: {f['objective']}",
        f"{'':<8}{'best config':<40}{'req/s':>9}{'spread':>8}{'trials':>8}{'seconds':>9}   judged rounds (req/s)",
        row("tuner", t), row("grid", g),
        f"tuner / grid: throughput {f['throughput_pct_of_grid']}%, trials {f['trials_pct_of_grid']}%, "
        f"time {f['time_pct_of_grid']}% (targets: >= {f['targets']['throughput_pct_at_least']}% of the throughput "
        f"in <= {f['targets']['trials_pct_at_most']}% of the trials)",
        f"the grid spent {g['stalling_trials']} trials on {g['stalling_configs']} configs the probe found "
        f"stalling; the tuner's trials are {f['trials_pct_of_safe_grid']}% of the rest",
        f"each search's own confirmed rate: tuner {t['confirmed_rps'] or 0:.0f}, grid {g['confirmed_rps'] or 0:.0f} "
        f"req/s ({f['confirmed_pct_of_grid']}%)",
    ])
