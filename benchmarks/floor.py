"""`tritonkit bench floor`: how closely one config's figure agrees with itself on this machine.

No search: the spec's config (or the tuned one, where tuned.yaml names the model), its sustained
rate measured `rounds` times back to back by the neutral judge (benchmarks/judge.py: perf_analyzer,
Poisson, from its capacity down in 5% steps). The spread of those rounds, and of the medians of
consecutive threes (what one `bench tuner` figure is), is the floor under any claim that two
figures measured on this box differ: two tuners, two tunes, or two runs of one bench cannot agree
more closely than a config agrees with itself.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from tritonkit.benchmarks.judge import Entrant, judge
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.results import SCHEMA
from tritonkit.spec import Spec
from tritonkit.stats import relative_range
from tritonkit.tuner.knobs import from_spec
from tritonkit.tuner.settings import TuneSettings, slo_for

FIGURE_ROUNDS = 3  # a `bench tuner` figure is the median of its judge's three rounds


def run_floor_bench(spec: Spec, model: str, out_dir: Path, *, rounds: int = 12, p95_ms: float | None = None,
                    final_judge: Callable[..., dict] = judge, log: Callable[[str], None] = print) -> dict:
    slo = slo_for(spec, model, p95_ms)
    m = spec.model(model)
    t0 = time.perf_counter()
    j = final_judge(spec, model, [Entrant("config", m)], Path(out_dir) / "floor_judge", p95_ms=slo,
                    max_errors=TuneSettings.max_errors, rounds=rounds, log=log)
    e = j["entrants"]["config"]
    f = floor_figures(e["rounds_rps"])
    f.update(config=from_spec(m).label(),
             objective=f"highest req/s with P95 <= {slo:g} ms and errors <= {TuneSettings.max_errors:.0%}",
             runs=e["runs"], seconds=round(time.perf_counter() - t0, 1))
    write_bytes_atomic(Path(out_dir) / "bench_floor.json", json.dumps(
        {"schema": SCHEMA, "kind": "bench/floor", "model": model, "figures": f, "judge": j}, indent=2,
        default=str).encode())
    log(format_floor_bench(f))
    return f


def floor_figures(rps: list[float]) -> dict:
    """The rounds' spread, and that of the medians of consecutive threes; a round that held nowhere
    (0) counts, as it does in `bench tuner`."""
    threes = [statistics.median(rps[i:i + FIGURE_ROUNDS])
              for i in range(0, len(rps) - FIGURE_ROUNDS + 1, FIGURE_ROUNDS)]

    def spread(xs: list[float]) -> float | None:
        return None if (s := relative_range(xs)) is None else round(s, 3)

    return {"rounds_rps": [round(x, 1) for x in rps], "median_rps": statistics.median(rps) if rps else None,
            "spread": spread(rps), "medians_of_3": [round(x, 1) for x in threes], "medians_of_3_spread": spread(threes)}


def format_floor_bench(f: dict) -> str:
    def pct(s: float | None) -> str:
        return "-" if s is None else f"{100 * s:.0f}%"

    rounds = ", ".join(f"{x:.0f}" for x in f["rounds_rps"]) or "none"
    threes = ", ".join(f"{x:.0f}" for x in f["medians_of_3"]) or "-"
    return "\n".join([
        f"objective: {f['objective']}; config {f['config']}; {f['runs']} runs in {f['seconds']:.0f} s",
        f"rounds (req/s): {rounds}",
        f"median {f['median_rps'] or 0:.0f} req/s, spread {pct(f['spread'])} ((max - min) / median)",
        f"medians of three consecutive rounds (one `bench tuner` figure each): {threes}; "
        f"spread {pct(f['medians_of_3_spread'])}",
    ])
