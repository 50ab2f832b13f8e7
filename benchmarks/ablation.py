"""`tritonkit bench ablation`: what each of the tuner's noise rules is worth.

Each rule is switched off in the one Rules object (tuner/rules.py) and the offline search runs
again, on two kinds of evidence:

- the simulated world (tuner/simulated.py): the same model tuned SEEDS times, each time with its
  own run-to-run noise and drift, where the true edge of every config is known. A rule earns its
  place when removing it makes picks miss the SLO, scatter, or cost more trials;
- the trials that real tunings recorded (`bench versus` writes them): what the rule decided there,
  counted from the runs themselves (how many rungs one clear run settled, where a pooled
  confirmation and a majority of the same runs disagreed);
- with `--case`, one real case of `bench versus`: `tune` once per variant, every winner before the
  judge together, and each winner's promised rate in one load test of HOLD_S seconds.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tritonkit.benchmarks.cases import write_case
from tritonkit.benchmarks.judge import Entrant, judge
from tritonkit.benchmarks.versus import hold
from tritonkit.configs.loader import load_spec
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.results import SCHEMA
from tritonkit.slo import meets
from tritonkit.tuner.knobs import Knobs, grid, powers_of_two
from tritonkit.tuner.noise import clear, majority
from tritonkit.tuner.objective import Objective
from tritonkit.tuner.offline import Search
from tritonkit.tuner.rules import RULES, Rules
from tritonkit.tuner.run import tune_offline
from tritonkit.tuner.settings import TuneSettings
from tritonkit.tuner.simulated import SLO_MS, TrueWorldTrials, true_edge
from tritonkit.tuner.trials import TrialWindow

SEEDS = 20
HOLD_S = 30.0
START = Knobs(16, 8000, 1)  # the simulated world's spec config
MAX_TRIALS = TuneSettings.max_trials  # the tuner's own default budget

VARIANTS: dict[str, Rules] = {
    "all rules": RULES,
    "no one-run verdict (always a majority of 3)": replace(RULES, clear=math.inf),
    "one run decides every rate": replace(RULES, runs=1),
    "no pooled confirmation (majority of 3 runs)": replace(RULES, pooled=False),
    "no SLO margin": replace(RULES, slo_margin=0.0),
}


def simulate(rules: Rules, seeds: int = SEEDS) -> dict:
    """SEEDS tunings of TRUE_WORLD with `rules`, its noise seeded per tuning: how many confirmed; how
    their confirmed rates compare with the world's true best (the highest true edge of any config);
    how many claim past their own config's true edge, and by how much; how scattered the picks
    are; the trials they took, and how many runs a rung took on the way (a rung: one config at one
    rate in the search)."""
    objective = Objective(SLO_MS, margin=rules.slo_margin)
    best = max(true_edge(k) for k in grid(powers_of_two(16)))
    picks, trials, runs_per_rung = [], [], []
    for seed in range(seeds):
        sim = TrueWorldTrials(seed, objective.target_p95_ms)
        t = Search(sim, objective, bound=16, max_trials=MAX_TRIALS, log=lambda s: None, rules=rules).run(START)
        trials.append(len(sim.trials))
        searched = [x for x in sim.trials if x.rate and x.phase not in ("confirm", "overload")]
        runs_per_rung.append(len(searched) / max(1, len({(x.label, round(x.rate, 1)) for x in searched})))
        if t.confirmed and t.best.rate:
            k = t.best.knobs
            picks.append((Knobs(k.max_batch, k.delay_us, k.instances), t.best.rate))
    over = [r / true_edge(k) for k, r in picks if r > true_edge(k)]
    labels = [k.label() for k, _ in picks]
    common = max(set(labels), key=labels.count) if labels else None
    rates = [r for _, r in picks]
    return {"confirmed": len(picks), "seeds": seeds,
            "median_rate_of_best": round(statistics.median(rates) / best, 3) if rates else None,
            "over_true_edge": len(over), "worst_over_true_edge": round(max(over), 3) if over else None,
            "same_pick": labels.count(common) if common else 0, "common_pick": common,
            "mean_trials": round(statistics.mean(trials), 1),
            "runs_per_rung": round(statistics.mean(runs_per_rung), 2)}


def from_real_trials(trials_files: list[Path], rules: Rules = RULES) -> dict:
    """What two rules decided in recorded tunings: rungs that one clear run settled (each would
    have taken a second run, or a third, without it), and confirmations whose pooled verdict
    differs from the majority of the same runs."""
    one_run = rungs = 0
    disagree: list[str] = []
    confirmations = 0
    for f in trials_files:
        d = json.loads(Path(f).read_text())
        target = d["objective"]["target_p95_ms"]
        slo, bound = d["objective"]["slo_p95_ms"], d["objective"]["max_error_ratio"]
        by_rung: dict[tuple, list[dict]] = {}
        for t in d["trials"]:
            if t["rate"] and t["phase"] not in ("confirm", "overload", "calibrate", "speed"):
                by_rung.setdefault((t["label"], round(t["rate"], 1)), []).append(t)
        noise = d.get("noise") or {}  # p95_spread: the key before it was named for what it is
        log_sd = noise.get("p95_log_sd") or noise.get("p95_spread") or rules.prior_log_sd
        for runs in by_rung.values():
            rungs += 1
            first = runs[0]
            settled = first["p95_ms"] is not None and clear(first["p95_ms"], first["passed"], target, log_sd, rules)
            one_run += len(runs) == 1 and settled
        # a confirmation rung's pooled verdict is what the tuning did next: it stopped there
        # (confirmed) or stepped down to the next rung
        confirm: dict[tuple, list[dict]] = {}
        for t in d["trials"]:
            if t["phase"] == "confirm":
                confirm.setdefault((t["label"], round(t["rate"], 1)), []).append(t)
        for i, ((label, rate), runs) in enumerate(confirm.items()):
            if len(runs) < rules.runs:
                continue
            confirmations += 1
            pooled_held = i == len(confirm) - 1 and bool(d.get("confirmed"))
            majority_held = bool(majority([meets(t["p95_ms"], slo, t["error_ratio"], bound) for t in runs],
                                          final=True))
            if pooled_held != majority_held:
                said = {True: "held", False: "failed"}
                disagree.append(f"{Path(f).parent.parent.name}: {label} at {rate:.0f} req/s, pooled "
                                f"{said[pooled_held]}, majority {said[majority_held]}")
    return {"files": len(trials_files), "rungs": rungs, "settled_by_one_clear_run": one_run,
            "confirmations": confirmations, "pooled_differs_from_majority": disagree}


def real_case(case: str, out_dir: Path, *, engine: str, log: Callable[[str], None]) -> dict:
    """`tune` once per variant on a `bench versus` case, then every winner judged side by side, and
    each winner held at its promised rate for HOLD_S seconds."""
    folder = Path(out_dir).resolve() / case
    spec = load_spec(write_case(case, folder), folder / "repo")
    model = spec.models[0].name
    slo = spec.models[0].slo.p95_ms
    rows, entrants = {}, []
    for i, (name, rules) in enumerate(VARIANTS.items()):
        log(f"==== {case}, {name}")
        r = tune_offline(spec, model, folder / "repo", folder / f"state{i}", folder / f"tune{i}",
                         window=TrialWindow(engine=engine), write_decision=False,
                         rules=rules, log=log)
        t = r.tuning
        rows[name] = {"entrant": f"v{i}", "winner": t.best.knobs.label(), "confirmed": t.confirmed,
                      "claim_rps": round(t.best.rate, 1) if t.confirmed and t.best.rate else None,
                      "trials": len(r.trials.trials), "search_s": round(r.seconds, 1)}
        if rows[name]["claim_rps"]:
            entrants.append(Entrant(f"v{i}", t.best.knobs.model(spec.models[0]), claim_rps=t.best.rate))
    judged = judge(spec, model, entrants, folder / "judge", p95_ms=slo, log=log) if entrants else {"entrants": {}}
    held = hold(spec, model, entrants, folder / "hold", loads=1, seconds=HOLD_S, p95_ms=slo, log=log) \
        if entrants else {}
    for row in rows.values():
        j = judged["entrants"].get(row["entrant"]) or {}
        row["judged_rps"] = j.get("rps")
        runs = held.get(row["entrant"]) or []
        row["held_promise"] = runs[0]["held"] if runs else None
        row["promise_p95_ms"] = runs[0]["p95_ms"] if runs else None
        row["promise_errors"] = runs[0]["error_ratio"] if runs else None
    return {"case": case, "engine": engine, "rows": rows}


def run_ablation(out_dir: Path, *, real: list[Path], seeds: int = SEEDS, case: str | None = None,
                 engine: str = "perf_analyzer", log: Callable[[str], None] = print) -> dict:
    table = {}
    for name, rules in VARIANTS.items():
        table[name] = simulate(rules, seeds)
        log(f"  {name}: {table[name]}")
    result = {"schema": SCHEMA, "kind": "bench/ablation", "seeds": seeds, "simulated": table,
              "real": from_real_trials(real) if real else None,
              "case": real_case(case, out_dir, engine=engine, log=log) if case else None}
    write_bytes_atomic(Path(out_dir) / "bench_ablation.json", json.dumps(result, indent=2).encode())
    log(format_ablation(result))
    return result


def format_ablation(r: dict) -> str:
    lines = [f"the simulated world (not the tuner's cost model), {r['seeds']} noisy tunings per row, true edges known",
             f"{'rules':<46}{'confirmed':>10}{'rate/best':>10}{'over edge':>10}{'worst':>7}{'same pick':>10}"
             f"{'trials':>8}{'runs/rung':>10}"]
    for name, s in r["simulated"].items():
        worst = "-" if s["worst_over_true_edge"] is None else f"{s['worst_over_true_edge']:.2f}"
        rate = "-" if s["median_rate_of_best"] is None else f"{s['median_rate_of_best']:.2f}"
        lines.append(f"{name:<46}{s['confirmed']:>10}{rate:>10}{s['over_true_edge']:>10}{worst:>7}"
                     f"{s['same_pick']:>10}{s['mean_trials']:>8}{s['runs_per_rung']:>10}")
    if r.get("case"):
        c = r["case"]
        lines.append(f"one real case ({c['case']}, trials by {c['engine']}): tune once per row, winners judged "
                     f"together, each promise held {HOLD_S:g} s")
        lines.append(f"{'rules':<46}{'trials':>7}{'search s':>9}{'promised':>9}{'judged':>8}{'held':>6}  winner")
        for name, x in c["rows"].items():
            held = "-" if x["held_promise"] is None else ("yes" if x["held_promise"] else "no")
            lines.append(f"{name:<46}{x['trials']:>7}{x['search_s']:>9.0f}{x['claim_rps'] or 0:>9.0f}"
                         f"{x['judged_rps'] or 0:>8.0f}{held:>6}  {' '.join(x['winner'].split())}")
    if r.get("real"):
        x = r["real"]
        lines.append(f"real tunings ({x['files']}): {x['settled_by_one_clear_run']} of {x['rungs']} rungs settled by "
                     f"one clear run; {len(x['pooled_differs_from_majority'])} of {x['confirmations']} "
                     f"confirmations where the pooled verdict and a majority of the same runs disagree")
    return "\n".join(lines)
