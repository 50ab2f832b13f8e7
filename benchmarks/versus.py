"""`tritonkit bench versus`: the kit's tuner and Model Analyzer's quick search, from the same naive
start (benchmarks/cases.py), on the same server, with the same bounds and SLO; then the neutral
judge on both winners, served side by side.

Per side: the search's wall time (MA's counted to its last new measurement), what it measured,
its winner, and the judge's figure over its rounds: the sustained rate within the SLO, or for a
latency objective the P95 at the fixed rate.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tritonkit.benchmarks.cases import CASES, write_case
from tritonkit.benchmarks.judge import (
    Entrant,
    format_judged,
    judge,
    judge_at_rate,
    judged_name,
    measure_once,
    served_side_by_side,
)
from tritonkit.benchmarks.model_analyzer import format_model_analyzer, peer_start, run_model_analyzer, winner_model
from tritonkit.benchmarks.noise_source import noise_source
from tritonkit.configs.loader import load_spec
from tritonkit.errors import input_error
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.results import SCHEMA
from tritonkit.slo import ERROR_BOUND
from tritonkit.spec import ModelSpec, Spec
from tritonkit.tuner.knobs import Knobs, from_spec, max_instances
from tritonkit.tuner.run import max_batch_bound, tune_offline
from tritonkit.tuner.settings import TuneSettings
from tritonkit.tuner.trials import TrialWindow


@dataclass
class Sitting:
    """What one case's searches leave the judge: each side's facts, and each side's pick as an entrant."""

    sides: dict[str, dict]
    entrants: list[Entrant]
    claims: dict[str, float | None]  # each confirmed kit winner's claim: what a hold load tests
    model_analyzer: dict


def run_versus(case: str, out_dir: Path, *, ma_wall_s: float, rounds: int = 3, seconds: float = 5.0,
               engine: str = TuneSettings.engine, max_trials: int = TuneSettings.max_trials, kit_runs: int = 1,
               model_analyzer_from: Path | None = None, hold_loads: int = 0, hold_s: float = 30.0,
               noise: bool = False, quiet_judge: bool = False, rejudge_from: Path | None = None,
               log: Callable[[str], None] = print) -> dict:
    """One case: MA's search (or its result from an earlier `bench_versus.json` of this case, as MA
    runs take 3-9 minutes here), `tune` `kit_runs` times from the same start, then every winner
    before the judge together, so each tuning's pick is judged in the same rounds as MA's. Then,
    for the most throughput, `hold_loads` load tests of `hold_s` seconds of each confirmed kit
    winner at the rate its tuning promised.

    `noise`: all of it beside the noise source (benchmarks/noise_source.py), whose share of a core
    is recorded with the result; `quiet_judge`: the judge after the source is stopped, so that it
    ranks what each side wrote beside the noise, not the noise of its own runs. `rejudge_from`: no
    search; the picks of an earlier sitting of this case (its folder, or its bench_versus.json)
    judged again, quietly."""
    folder = Path(out_dir).resolve() / case
    spec = load_spec(write_case(case, folder), folder / "repo")
    model = spec.models[0].name
    with contextlib.ExitStack() as noisy:
        took = noisy.enter_context(noise_source(folder / "noise_source.log", seed=CASES.index(case))) if noise else {}
        if rejudge_from is not None:
            file, earlier = read_earlier(rejudge_from, case)
            sitting = earlier_sitting(file, earlier, spec.model(model))
            log(f"==== case {case}: the picks of {rejudge_from}, judged again")
        else:
            sitting = _search(case, spec, folder, ma_wall_s=ma_wall_s, engine=engine, max_trials=max_trials,
                              kit_runs=kit_runs, model_analyzer_from=model_analyzer_from, log=log)
        if quiet_judge:
            noisy.close()
        judged = _judge(spec, model, sitting, folder, rounds=rounds, seconds=seconds, hold_loads=hold_loads,
                        hold_s=hold_s, log=log)
    result = {"schema": SCHEMA, "kind": "bench/versus", "case": case, "model": model,
              "p95_ms": spec.model(model).slo.p95_ms, "rps": spec.model(model).slo.rps, "engine": engine,
              "sides": sitting.sides, "model_analyzer": sitting.model_analyzer, "judge": judged,
              # the noise the searches ran beside (None: a quiet box), and whether the judge ran beside it too
              "noise_source": took or None, "judged_beside_noise": bool(took) and not quiet_judge}
    if rejudge_from is not None:
        result |= {"rejudged_from": str(rejudge_from), "engine": earlier["engine"],
                   "noise_source": earlier.get("noise_source")}
    if took:
        log(f"noise source: {took['busy_share']:.0%} of a core in {took['bursts']} bursts over {took['seconds']:.0f} s")
    write_bytes_atomic(folder / "bench_versus.json", json.dumps(result, indent=2, default=str).encode())
    log(format_versus(result))
    return result


def _search(case: str, spec: Spec, folder: Path, *, ma_wall_s: float, engine: str, max_trials: int, kit_runs: int,
            model_analyzer_from: Path | None, log: Callable[[str], None]) -> Sitting:
    model = spec.models[0].name
    start = spec.model(model)
    slo, rps = start.slo.p95_ms, start.slo.rps
    bound = max(1, max_batch_bound(spec, model))
    if model_analyzer_from is not None:
        ma = read_earlier(model_analyzer_from, case)[1]["model_analyzer"]
        log(f"==== case {case}: Model Analyzer's quick search, as measured in {model_analyzer_from}")
    else:
        log(f"==== case {case}: Model Analyzer's quick search")
        ma = run_model_analyzer(spec, model, folder / "model_analyzer", p95_ms=slo, rps=rps,
                                max_instances=max_instances(), max_batch=bound, wall_s=ma_wall_s, log=log)
    log(format_model_analyzer(ma))
    sides: dict[str, dict] = {}
    for i in range(1, kit_runs + 1):
        name = "kit" if kit_runs == 1 else f"kit{i}"
        log(f"==== case {case}: tritonkit tune, run {i} of {kit_runs} (trials measured by {engine})")
        tuned = tune_offline(spec, model, folder / "repo", folder / f"state_{name}", folder / f"tune_{name}",
                             rps=rps, max_trials=max_trials, window=TrialWindow(engine=engine),
                             write_decision=False, log=log)
        t = tuned.tuning
        # the config the tuning writes: the start where it wrote none
        written = t.best.knobs if t.written else from_spec(start)
        sides[name] = {"search_s": round(tuned.seconds, 1), "measurements": len(tuned.trials.trials),
                       "configs": len({x.label for x in tuned.trials.trials}), "winner": t.best.knobs.label(),
                       "config": written.to_json(), "confirmed": t.confirmed, "kept": t.kept, "written": t.written,
                       "search_proper_s": search_proper_s(tuned.trials.trials),
                       "best_measured": t.best_measured and list(t.best_measured),
                       "differs_because": t.differs_because, "cost_model_predicts": t.predicts,
                       "claim_rps": None if rps or t.best.rate is None else round(t.best.rate, 1)}
    sides["model_analyzer"] = {
        "search_s": ma["search_s"], "wall_s": ma["wall_s"], "measurements": len(ma["configs"]),
        "configs": len({m["variant"] for m in ma["configs"]}), "stopped": ma["stopped"],
        "winner": None if ma["winner"] is None else
        f"batch {ma['winner']['max_batch_size']} x{ma['winner']['instances']}",
        "reused_from": None if model_analyzer_from is None else str(model_analyzer_from)}
    return _sitting(sides, ma, start, rps)


def earlier_sitting(file: Path, earlier: dict, start: ModelSpec) -> Sitting:
    """An earlier sitting's sides and picks (`--rejudge-from`): each tuning's written config as its
    record holds it, and Model Analyzer's winner, on this case's start."""
    sides = {name: {k: v for k, v in s.items() if k != "judged"} | {"earlier_judged": s.get("judged")}
             for name, s in earlier["sides"].items()}
    for name, s in sides.items():
        if name != "model_analyzer" and "config" not in s:
            raise input_error(str(file), f"sides.{name}.config",
                              "this sitting's record does not hold the config its tuning wrote",
                              "judge a sitting recorded by this version of `tritonkit bench versus`")
    return _sitting(sides, earlier["model_analyzer"], start, earlier["rps"])


def _sitting(sides: dict[str, dict], ma: dict, start: ModelSpec, rps: float | None) -> Sitting:
    # no claim for the judge: it brackets every entrant from its own capacity, the kit's as Model
    # Analyzer's, and starts them all a rung above the highest (benchmarks/judge.py says why)
    entrants = [Entrant(name, Knobs.from_json(s["config"]).model(start))
                for name, s in sides.items() if name != "model_analyzer"]
    claims = {name: None if rps or not s["confirmed"] else s["claim_rps"]
              for name, s in sides.items() if name != "model_analyzer"}
    if ma["winner"] is not None:
        entrants.append(Entrant("model_analyzer", winner_model(peer_start(start)[0], ma["winner"])))
    return Sitting(sides, entrants, claims, ma)


def _judge(spec: Spec, model: str, sitting: Sitting, folder: Path, *, rounds: int, seconds: float, hold_loads: int,
           hold_s: float, log: Callable[[str], None]) -> dict:
    """Every pick in the same rounds; each side's figure goes into its facts."""
    slo, rps = spec.model(model).slo.p95_ms, spec.model(model).slo.rps
    if rps:
        judged = judge_at_rate(spec, model, sitting.entrants, folder / "judge", rps=rps, p95_ms=slo, rounds=rounds,
                               seconds=seconds, log=log)
    else:
        judged = judge(spec, model, sitting.entrants, folder / "judge", p95_ms=slo, rounds=rounds, seconds=seconds,
                       log=log)
    log(format_judged(judged))
    for name, side in sitting.sides.items():
        side["judged"] = judged["entrants"].get(name)
    promised = [replace(e, claim_rps=sitting.claims[e.name]) for e in sitting.entrants if sitting.claims.get(e.name)]
    if hold_loads and promised:
        held = hold(spec, model, promised, folder / "hold", loads=hold_loads, seconds=hold_s, p95_ms=slo, log=log)
        for name, runs in held.items():
            sitting.sides[name]["held_loads"] = runs
    return judged


def search_proper_s(trials) -> float:
    """Seconds of the trials that searched: neither calibration, nor the end's overload gate,
    confirmation, speed check and in-flight limit (what Model Analyzer's time to its last new
    measurement compares with)."""
    return round(sum(t.seconds for t in trials if t.phase not in ("calibrate", "overload", "confirm", "beside",
                                                                    "speed", "in_flight")), 1)


def hold(spec, model: str, entrants: list[Entrant], work: Path, *, loads: int, seconds: float, p95_ms: float,
         log: Callable[[str], None]) -> dict[str, list[dict]]:
    """Each entrant at its claim, `loads` times for `seconds`, in turn: what a user's load test would see."""
    out: dict[str, list[dict]] = {e.name: [] for e in entrants}
    with served_side_by_side(spec, model, entrants, work, log) as url:
        for i in range(loads):
            for e in entrants[i % len(entrants):] + entrants[:i % len(entrants)]:
                run = measure_once(url, judged_name(model, e.name), e.name, e.claim_rps, seconds, p95_ms, ERROR_BOUND)
                log(f"   {e.name} {seconds:g} s at {e.claim_rps:.0f} req/s: {run.ok_rps:.0f} served, P95 "
                    f"{run.p95_ms} ms, errors {run.error_ratio:.2%} -> {'holds' if run.held else 'misses'}")
                out[e.name].append(vars(run))
    return out


def read_earlier(path: Path, case: str) -> tuple[Path, dict]:
    """An earlier sitting of `case`: a `bench_versus.json`, or a folder holding `<case>/bench_versus.json`."""
    path = Path(path)
    file = path / case / "bench_versus.json" if path.is_dir() else path
    try:
        r = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise input_error(str(file), "bench_versus.json", f"cannot read an earlier sitting: {e}",
                          "give a bench_versus.json written by `tritonkit bench versus`, or its folder") from None
    if r.get("kind") != "bench/versus" or r.get("case") != case or "model_analyzer" not in r:
        raise input_error(str(file), "case", f"this is not `bench versus` case {case}'s result",
                          f"give the bench_versus.json of case {case}")
    return file, r


def versus_table(results: list[dict]) -> str:
    """Every case's sides as one markdown table (docs/benchmarks.md): each tuning's whole `tune` and
    its search proper against Model Analyzer's time to its last new measurement, what each measured,
    the config written beside the best one measured, and the judge's figure over its rounds."""
    lines = ["| case | side | whole tune s (search proper) | measured (configs) | written | best measured "
             "| judged (rounds) | kit / MA; time (search proper) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        latency = r["rps"] is not None
        ma = r["sides"].get("model_analyzer", {})
        ma_fig, ma_s = _judged_figure(ma, latency), ma.get("search_s")
        objective = f"lowest P95 at {r['rps']:g} req/s" if latency else f"P95 <= {r['p95_ms']:g} ms"
        noise = ""
        if r.get("noise_source"):
            noise = f", beside the noise source ({r['noise_source']['busy_share']:.0%} of a core)"
            noise += "" if r.get("judged_beside_noise", True) else ", judged without it"
        for i, (name, s) in enumerate(r["sides"].items()):
            case = f"{r['case']}, {objective}{noise}" if i == 0 else ""
            fig = _judged_figure(s, latency)
            label = _one_line(s.get("winner") or "-")
            j = s.get("judged") or {}
            rounds = j.get("rounds_p95_ms") if latency else j.get("rounds_rps")
            judged = "-" if fig is None else (f"P95 {fig:,.1f} ms" if latency else f"{fig:,.0f}") + \
                f" ({', '.join('-' if x is None else format(x, ',.1f' if latency else ',.0f') for x in rounds or [])})"
            if name == "model_analyzer":
                side, tune = "Model Analyzer", f"{_s(s.get('search_s'))} (wall {_s(s.get('wall_s'))})"
                written, best, ratio = label, "", ""
            else:
                marks = [m for m, on in (("unconfirmed", not s["confirmed"]), ("kept the start", s["kept"])) if on]
                side = name + (f" ({', '.join(marks)})" if marks else "")
                tune = f"{_s(s['search_s'])} ({_s(s['search_proper_s'])})"
                written = label if s["written"] else "the start"
                bm = s.get("best_measured")
                best = "-" if not bm else f"{'the same' if bm[0] == s['winner'] else _one_line(bm[0])}, {bm[1]:,.0f}"
                if s.get("differs_because"):
                    best += f" ({_one_line(s['differs_because'])})"
                ratio = "; ".join([_ratio(fig, ma_fig, latency),
                                   f"{_frac(s['search_s'], ma_s)} ({_frac(s['search_proper_s'], ma_s)})"])
            lines.append(f"| {case} | {side} | {tune} | {s['measurements']} ({s['configs']}) | {written} | {best} "
                         f"| {judged} | {ratio} |")
    return "\n".join(lines)


def _one_line(text: str) -> str:
    """A label or reason as one table cell: the aligned labels' runs of spaces as one."""
    return " ".join(text.split())


def _judged_figure(side: dict, latency: bool) -> float | None:
    j = side.get("judged") or {}
    return j.get("p95_ms") if latency else j.get("rps")


def _ratio(kit: float | None, ma: float | None, latency: bool) -> str:
    """The kit's figure over MA's (for a latency objective, MA's P95 over the kit's: above 1 is better)."""
    if kit is None or ma is None or not kit or not ma:
        return "-"
    return f"{(ma / kit if latency else kit / ma):.2f}x" + (" lower P95" if latency else "")


def _frac(x: float | None, of: float | None) -> str:
    return "-" if x is None or not of else f"{x / of:.2f}"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def read_versus(folder: Path) -> list[dict]:
    """The `bench_versus.json` of every case under `folder` (what `bench versus --out` wrote), in
    the order of `CASES`."""
    found = {}
    for file in sorted(Path(folder).glob("*/bench_versus.json")):
        r = json.loads(file.read_text())
        if r.get("kind") == "bench/versus":
            found[r["case"]] = r
    return [found[c] for c in CASES if c in found]


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
