"""`tritonkit bench mix`: a whole edge box sized for one traffic mix (benchmarks/cases.py, MIX).

Three models of different costs share two cores under one mix, each with its own SLO.
1. Alone: `tune` each model by itself, as if it had the box to itself.
2. Together: `tune --mix` from those configs (tuner/mix.py): the highest common scale of the mix
   at which every SLO holds, one knob of one model at a time.
3. The judge: both config sets served in turn (one server, reloaded between them), the same mix
   ladder for both, from a rung above the higher claim down in 5% steps, interleaved, `rounds`
   times: the scale each holds.
4. The promise: `loads` load tests of the whole mix, `load_s` seconds each, at the joint tuning's
   confirmed scale, for both config sets in turn: every entry's P95 and errors.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from tritonkit.benchmarks.cases import write_mix
from tritonkit.benchmarks.judge import JUDGE_STEP, START_ABOVE, Run, ladder
from tritonkit.configs.loader import load_spec
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.load import Load
from tritonkit.loadtests.results import SCHEMA
from tritonkit.slo import ERROR_BOUND
from tritonkit.tuner.knobs import from_spec
from tritonkit.tuner.mix import Configs, MixSearch, entries_of, format_mix, mix_box, pooled_figures, tune_mix
from tritonkit.tuner.run import tune_offline
from tritonkit.tuner.trials import TrialWindow


def run_mix_bench(out_dir: Path, *, engine: str = "perf_analyzer", max_trials: int = 30, mix_trials: int = 40,
                  rounds: int = 3, loads: int = 3, load_s: float = 30.0, log: Callable[[str], None] = print) -> dict:
    folder = Path(out_dir).resolve()
    spec = load_spec(write_mix(folder), folder / "repo")
    entries = entries_of(spec)
    t0 = time.perf_counter()
    alone: Configs = {}
    alone_s = {}
    for e in entries:
        (model,) = e.models
        log(f"==== {model} tuned alone (trials by {engine})")
        r = tune_offline(spec, model, folder / "repo", folder / "state", folder / f"alone_{model}",
                         max_trials=max_trials, window=TrialWindow(engine=engine), write_decision=False, log=log)
        alone[model] = r.tuning.best.knobs if r.tuning.confirmed else from_spec(spec.model(model))
        alone_s[model] = round(r.seconds, 1)
    log("==== the mix tuned together, from the configs tuned alone")
    joint, runs, joint_s = tune_mix(spec, folder / "repo", folder / "state", folder / "mix", start=alone,
                                    max_trials=mix_trials, log=log)
    log(format_mix(joint))
    sets = {"alone": alone, "joint": joint.best}
    load = Load(rate=1.0, duration_s=5.0, warmup_s=1.0, drain_s=2.0)
    with mix_box(spec, folder / "repo", folder / "state", entries, log) as box:
        search = MixSearch(box, entries, max_trials=10**6, load=load, log=log)
        top = max(joint.scale, joint.start_scale, 0.1) * START_ABOVE
        log(f"==== the judge: both sets from x{top:.2f} down in {JUDGE_STEP - 1:.0%} steps, {rounds} rounds")
        def measure(name: str, scale: float) -> Run:
            """One run of the whole mix with one set at `scale`: its figure is the scale that held."""
            run = search.measure(sets[name], scale, f"judge {name}")
            return Run(name, scale, engine, 0, round(scale, 3), None, 0.0, run.held)

        # the judge's own rounds (benchmarks/judge.py), down only: a scale is a rung of the mix
        judged, _ = ladder(dict.fromkeys(sets, top), dict.fromkeys(sets, top / 8), rounds, measure, log,
                           climb_limit=1.0)
        at = joint.scale
        log(f"==== {loads} load tests of {load_s:g} s of the whole mix at x{at:.2f}, each set in turn")
        long = Load(rate=1.0, duration_s=load_s, warmup_s=2.0, drain_s=2.0)
        search.load = long
        tests: dict[str, list[dict]] = {name: [] for name in sets}
        for i in range(loads):
            for name in list(sets)[i % 2:] + list(sets)[:i % 2]:
                run = search.measure(sets[name], at, f"{load_s:g}s {name}")
                tests[name].append(pooled_figures([run], entries))
    result = {
        "schema": SCHEMA, "kind": "bench/mix", "traffic": spec.traffic,
        "slos": {e.name: e.slo.p95_ms for e in entries}, "engine": engine,
        "alone": {"configs": {m: k.to_json() for m, k in alone.items()}, "search_s": alone_s,
                  "served_together_scale": round(joint.start_scale, 3)},
        "joint": {"configs": {m: k.to_json() for m, k in joint.best.items()}, "scale": round(joint.scale, 3),
                  "confirmed": joint.confirmed, "confirmation": joint.confirmation, "runs": len(runs),
                  "search_s": round(joint_s, 1)},
        "judged": {name: {"rounds": figs, "median": statistics.median(figs) if figs else None}
                   for name, figs in judged.items()},
        "load_tests": {"scale": round(at, 3), "seconds": load_s, "runs": tests,
                       "held": {name: sum(all(f["p95_ms"] is not None and f["p95_ms"] <= f["slo_ms"]
                                              and f["error_ratio"] <= ERROR_BOUND for f in t.values()) for t in runs)
                                for name, runs in tests.items()}},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_bytes_atomic(folder / "bench_mix.json", json.dumps(result, indent=2, default=list).encode())
    log(format_mix_bench(result))
    return result


def format_mix_bench(r: dict) -> str:
    lines = ["traffic at x1: " + ", ".join(f"{n} {rps:g} req/s (P95 <= {r['slos'][n]:g} ms)"
                                           for n, rps in r["traffic"].items())]
    for name in ("alone", "joint"):
        configs = "; ".join(f"{m} {c['max_batch_size']}/{c['max_queue_delay_us']}us/x{c['instances']}"
                            for m, c in r[name]["configs"].items())
        j = r["judged"][name]
        lines.append(f"{name:<6} judged x{j['median'] or 0:.2f} (rounds {', '.join(f'{x:.2f}' for x in j['rounds'])}): "
                     f"{configs}")
    lt = r["load_tests"]
    lines.append(f"{len(lt['runs']['joint'])} load tests of {lt['seconds']:g} s at x{lt['scale']:.2f}:")
    for name, runs in lt["runs"].items():
        for i, t in enumerate(runs, 1):
            shown = ", ".join(f"{n} P95 {f['p95_ms'] or 0:.1f}/{f['slo_ms']:g} ms err {f['error_ratio']:.2%}"
                              for n, f in t.items())
            lines.append(f"  {name:<6} {i}: {shown}")
        lines.append(f"  {name}: every SLO held in {lt['held'][name]} of {len(runs)}")
    return "\n".join(lines)
