"""The neutral judge: two or more configs of one model, served side by side by one server and
measured by perf_analyzer (NVIDIA's C++ client, the tool Triton users trust) with Poisson arrivals,
interleaved, round after round.

Each config is loaded as its own copy of the model (`<model>__<entrant>`), so no reload stands
between two measurements. Every entrant starts a round at the same rate, a 15% rung above the
highest claim (an entrant without one is given the first rate it holds in 15% steps down from its
capacity, perf_analyzer's closed loop), walks down in those rungs to the first rate it holds, and
climbs from there in JUDGE_STEP steps while it holds; the entrants take one run each in turn, in
an order that rotates from round to round, so a slow minute of the machine hits all alike. An
entrant's figure for the round is the last rate where its run's P95 was within the SLO and at most
`max_errors` of its requests failed. The figure is the median of the rounds, with their spread.

One start for all, because on a noisy box a ladder is anchored where it starts: a walk down stops
at its first hold and a climb at its first miss, so a config started from a low claim scores near
that claim. Beside the noise source the same config, started from three entrants' own claims, was
judged 195, 240 and 300 req/s in the same rounds; from one start the procedure is the same for
every entrant, and only the configs and the noise tell them apart.

perf_analyzer gives up on a measurement at its first failed request, and Triton 2.51 counts queue
timeouts in its statistics but not a full queue's refusals. So a run that perf_analyzer abandons
(a config's queue policy refused a request) is measured again at the same rate by the kit's
asyncio client, which counts every refusal against the error budget instead of failing the config
on its first; the judge reports how many runs each entrant needed that for.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tritonkit.configs.generate import generate
from tritonkit.loadtests.load import Load, Outcome, run_figures
from tritonkit.loadtests.measure import send_cheapest
from tritonkit.serving import running
from tritonkit.slo import ERROR_BOUND
from tritonkit.spec import ModelSpec, ServerSpec, Spec
from tritonkit.stats import relative_range
from tritonkit.tuner.ladder import walk_down, walk_up
from tritonkit.tuner.strategy import drive

JUDGE_STEP = 1.05  # the figure's resolution: two configs differ by what they hold, not by a coarse rung
# the ladder starts this far above the highest claim, so a figure is an edge, not a claim, and walks
# down in rungs this large to the first hold (then climbs in JUDGE_STEP steps)
START_ABOVE = 1.15
FLOOR_BELOW = 4.0  # ... and stops this far below the lowest: an entrant that holds nothing there scores 0
# An entrant that holds at the start climbs at most this far above it: a claim of half what a config
# holds is the tuner's failure to report (a finding in itself), not a figure worth 15 more runs a round
CLIMB_LIMIT = 2.0
CALIBRATION_S = 3.0
FALLBACK = "asyncio (perf_analyzer stopped at a refused request)"


@dataclass(frozen=True)
class Entrant:
    name: str  # "kit", "model_analyzer", "spec", ...
    model: ModelSpec  # the config, as the spec's model with that config
    claim_rps: float | None = None  # what its own search said it holds; None: calibrated here


@dataclass(frozen=True)
class Run:
    entrant: str
    rate: float
    engine: str
    requests: int
    ok_rps: float
    p95_ms: float | None
    error_ratio: float
    held: bool
    note: str = ""


def judged_name(model: str, entrant: str) -> str:
    return f"{model}__{entrant}"


@contextlib.contextmanager
def served_side_by_side(spec: Spec, model: str, entrants: list[Entrant], work: Path,
                        log: Callable[[str], None]) -> Iterator[str]:
    """Every entrant's config as its own copy of the model, all in one server: its gRPC URL."""
    variants = [e.model.model_copy(update={"name": judged_name(model, e.name)}) for e in entrants]
    server = ServerSpec(http_port=0, grpc_port=0, metrics_port=0)
    judged = Spec(spec.data.model_copy(update={"models": variants, "server": server}), spec.path, spec.shown)
    repo = Path(work) / "repo"
    generate(judged, repo)
    with running(judged, repo, Path(work) / "state", log=log) as r:
        yield r.endpoints.grpc


def judge(spec: Spec, model: str, entrants: list[Entrant], work: Path, *, p95_ms: float,
          max_errors: float = ERROR_BOUND, rounds: int = 3, seconds: float = 5.0, floor_rps: float | None = None,
          climb_limit: float = CLIMB_LIMIT, log: Callable[[str], None] = print) -> dict:
    """Each entrant's sustained rate under the SLO, `rounds` times, by the rule above; an entrant
    that holds nothing down to `floor_rps` (default: FLOOR_BELOW under its own claim) scores 0."""
    runs: list[Run] = []
    with served_side_by_side(spec, model, entrants, work, log) as url:
        measure = _measurer(url, model, runs, seconds, p95_ms, max_errors, log)
        # each entrant's claim: what its search said, or found here in coarse steps down from its capacity
        claims = {e.name: e.claim_rps or bracket(e.name, calibrate(url, judged_name(model, e.name), e.model, log),
                                                 measure) for e in entrants}
        start, floor = ladder_bounds(claims, floor_rps)
        starts, floors = dict.fromkeys(claims, start), dict.fromkeys(claims, floor)
        log(f"== the judge: {rounds} rounds, every entrant from {start:.0f} req/s (a rung above the highest claim) "
            f"down in {START_ABOVE - 1:.0%} rungs to its first hold, then up in {JUDGE_STEP - 1:.0%} steps, "
            f"P95 <= {p95_ms:g} ms, errors <= {max_errors:.0%}, {seconds:g} s a run")
        figures, p95_at = ladder(starts, floors, rounds, measure, log, climb_limit)
    return {"p95_ms": p95_ms, "max_errors": max_errors, "rounds": rounds, "seconds": seconds,
            "step": JUDGE_STEP, "claims": {k: round(v, 1) for k, v in claims.items()},
            "entrants": {e.name: _summary(e, figures[e.name], p95_at[e.name], runs, starts[e.name])
                         for e in entrants},
            "runs": [vars(x) for x in runs]}


def ladder_bounds(claims: dict[str, float], floor_rps: float | None = None) -> tuple[float, float]:
    """Where every entrant starts, a rung above the highest claim, and the floor it stops at,
    `floor_rps` or FLOOR_BELOW under the lowest (the module's docstring says why one start)."""
    return max(claims.values()) * START_ABOVE, floor_rps or min(claims.values()) / FLOOR_BELOW


def judge_at_rate(spec: Spec, model: str, entrants: list[Entrant], work: Path, *, rps: float, p95_ms: float,
                  max_errors: float = ERROR_BOUND, rounds: int = 3, seconds: float = 5.0,
                  log: Callable[[str], None] = print) -> dict:
    """For a latency objective: each entrant's P95 at the fixed rate `rps`, one run per round, the
    entrants interleaved; a run with more errors than the budget has no P95 (None)."""
    runs: list[Run] = []
    p95s: dict[str, list[float | None]] = {e.name: [] for e in entrants}
    with served_side_by_side(spec, model, entrants, work, log) as url:
        measure = _measurer(url, model, runs, seconds, p95_ms, max_errors, log)
        log(f"== the judge: {rounds} rounds at {rps:g} req/s, {seconds:g} s a run")
        for i in range(rounds):
            for e in entrants[i % len(entrants):] + entrants[:i % len(entrants)]:
                run = measure(e.name, rps)
                p95s[e.name].append(run.p95_ms if run.error_ratio <= max_errors else None)
    summary = {}
    for e in entrants:
        got = [x for x in p95s[e.name] if x is not None]
        median = statistics.median(got) if len(got) == len(p95s[e.name]) else None
        summary[e.name] = {"p95_ms": median, "rounds_p95_ms": p95s[e.name],
                           "spread": None if (r := relative_range(got)) is None else round(r, 3),
                           "runs": rounds, "fallback_runs": sum(1 for x in runs if x.entrant == e.name
                                                                and x.engine == FALLBACK)}
    return {"rps": rps, "p95_ms": p95_ms, "max_errors": max_errors, "rounds": rounds, "seconds": seconds,
            "entrants": summary, "runs": [vars(x) for x in runs]}


def _measurer(url: str, model: str, runs: list[Run], seconds: float, p95_ms: float, max_errors: float,
              log: Callable[[str], None]) -> Callable[[str, float], Run]:
    def measure(name: str, rate: float) -> Run:
        run = measure_once(url, judged_name(model, name), name, rate, seconds, p95_ms, max_errors)
        runs.append(run)
        log(f"   {name:<16} {rate:7.0f} req/s: P95 {run.p95_ms or math.nan:7.2f} ms, errors "
            f"{run.error_ratio:6.2%} -> {'holds' if run.held else 'misses'}"
            + (f" [{run.engine}]" if run.engine != "perf_analyzer" else ""))
        return run
    return measure


class JudgeRound:
    """One round of the judge, as a strategy (`tuner/strategy.py`: ask and tell, never measuring):
    each entrant walks from its start down in `down` rungs to the first rate it holds, then up in
    JUDGE_STEP steps while it holds, short of the rung it missed above (where it holds at its start,
    up to `climb_limit` times the start: a start is a claim, never a ceiling). The entrants take
    one run each in turn, in `order`, so a drift of the machine falls on all alike. `result`: each
    entrant's last run that held, None where it held nothing above its floor."""

    def __init__(self, starts: dict[str, float], floors: dict[str, float], order: list[str], climb_limit: float,
                 down: float = START_ABOVE):
        self.floors, self.down = floors, down
        self.rate = dict(starts)
        # no rate at or above this: the lowest the entrant missed, or the climb's limit
        self.ceiling = {n: s * climb_limit * (1 + 1e-9) for n, s in starts.items()}
        self.climbing: dict[str, Run] = {}  # entrant -> its last run that held, while it climbs
        self.pending = list(order)
        self.result: dict[str, Run | None] = {}
        self._turns: list[str] = []  # this pass over the pending entrants

    def ask(self) -> tuple[str, float] | None:
        while self._turns or self.pending:
            if not self._turns:
                self._turns = list(self.pending)
            name = self._turns.pop(0)
            if name not in self.climbing and self.rate[name] < self.floors[name]:
                self._done(name, None)
                continue
            return name, self.rate[name]
        return None

    def tell(self, candidate: tuple[str, float], run: Run | None) -> None:
        name, rate = candidate
        if run is not None and run.held:
            self.climbing[name] = run
            if rate * JUDGE_STEP < self.ceiling[name]:
                self.rate[name] = rate * JUDGE_STEP
            else:
                self._done(name, run)
        elif name in self.climbing:
            self._done(name, self.climbing[name])  # the last rate that held
        else:
            self.ceiling[name] = rate
            self.rate[name] = rate / self.down

    def _done(self, name: str, run: Run | None) -> None:
        self.result[name] = run
        self.pending.remove(name)


def ladder(starts: dict[str, float], floors: dict[str, float], rounds: int, measure: Callable[[str, float], Run],
           log: Callable[[str], None] = print, climb_limit: float = CLIMB_LIMIT
           ) -> tuple[dict[str, list[float]], dict[str, list[float | None]]]:
    """The rounds (`JudgeRound`), the order of the entrants rotating from round to round; an
    entrant's figure for a round is the served rate of the run that gave it, 0 where none held."""
    names = list(starts)
    figures: dict[str, list[float]] = {n: [] for n in names}
    p95_at: dict[str, list[float | None]] = {n: [] for n in names}
    for i in range(rounds):
        log(f"== round {i + 1}/{rounds}")
        r = JudgeRound(starts, floors, names[i % len(names):] + names[:i % len(names)], climb_limit)
        drive(r, lambda c: measure(*c), lambda: True)
        for name in names:
            run = r.result[name]
            figures[name].append(run.ok_rps if run else 0.0)
            p95_at[name].append(run.p95_ms if run else None)
    return figures, p95_at


def measure_once(url: str, name: str, entrant: str, rate: float, seconds: float, p95_ms: float,
                 max_errors: float) -> Run:
    load = Load(rate=rate, duration_s=seconds, warmup_s=1.0)
    out, engine = send_cheapest(url, name, load)
    return verdict(out, load, entrant, engine if engine == "perf_analyzer" else FALLBACK, p95_ms, max_errors)


def verdict(out: Outcome, load: Load, entrant: str, engine: str, p95_ms: float, max_errors: float) -> Run:
    """Held: some requests, a P95 within the SLO, errors within the budget, and a generator that
    kept up (a run it could not offer says nothing about the config)."""
    f = run_figures(load, out)
    held = f.holds(p95_ms, max_errors)
    return Run(entrant, round(load.rate, 1), engine, f.requests, round(f.ok_rps, 1),
               None if f.p95_ms is None else round(f.p95_ms, 3), round(f.error_ratio, 4), held, f.warning or "")


def bracket(name: str, capacity: float, measure: Callable[[str, float], Run]) -> float:
    """A claim for an entrant without one, along the tuner's ladder walk (`tuner/ladder.py`) in
    START_ABOVE steps but on the judge's own verdict (the plain SLO): down from its capacity to the
    first rate that holds, or, where the capacity itself holds (a closed loop that the client, not
    the server, limited), up to the edge."""
    def holds(rate: float) -> bool:
        return measure(name, rate).held

    if holds(capacity):
        return walk_up(capacity, holds, START_ABOVE, lambda: True)[0]
    steps = math.ceil(math.log(FLOOR_BELOW) / math.log(START_ABOVE)) - 1  # every rung above capacity / FLOOR_BELOW
    return walk_down(capacity, holds, START_ABOVE, lambda: True, steps) or capacity / START_ABOVE ** (steps + 1)


def calibrate(url: str, name: str, m: ModelSpec, log: Callable[[str], None]) -> float:
    """Where the ladder starts for an entrant without a claim: what perf_analyzer's closed loop gets
    through with two full batches in flight per instance, which no open-loop rate under an SLO beats."""
    clients = 2 * max(1, m.max_batch_size) * m.instances.count
    load = Load(concurrency=clients, duration_s=CALIBRATION_S, warmup_s=1.0)
    out, _ = send_cheapest(url, name, load)  # a queue policy that refuses some: what it served counts
    rate = sum(1 for s in out.samples if s.latency_s is not None) / CALIBRATION_S
    log(f"   {name}: {rate:.0f} req/s with {clients} in flight (its capacity)")
    return rate


def _summary(e: Entrant, figures: list[float], p95s: list[float | None], runs: list[Run], start: float) -> dict:
    mine = [x for x in runs if x.entrant == e.name]
    median = statistics.median(figures) if figures else 0.0
    return {"rps": round(median, 1), "rounds_rps": figures, "p95_ms_at_figure": p95s,
            "spread": None if (r := relative_range(figures)) is None else round(r, 3),
            "held_above_start": sum(1 for x in mine if x.held and x.rate > round(start, 1)),
            "runs": len(mine), "fallback_runs": sum(1 for x in mine if x.engine == FALLBACK)}


def format_judged(j: dict) -> str:
    if "rps" in j:  # a latency objective: P95 at one rate
        lines = [f"the judge: perf_analyzer, Poisson {j['rps']:g} req/s, {j['rounds']} rounds of {j['seconds']:g} s",
                 f"{'entrant':<18}{'P95 ms':>8}{'spread':>8}   rounds (P95 ms)"]
        for name, s in j["entrants"].items():
            rounds = ", ".join("-" if x is None else f"{x:.2f}" for x in s["rounds_p95_ms"])
            spread = "-" if s["spread"] is None else f"{s['spread']:.0%}"
            lines.append(f"{name:<18}{s['p95_ms'] or math.nan:>8.2f}{spread:>8}   {rounds}")
        return "\n".join(lines)
    lines = [f"the judge: perf_analyzer, Poisson, {j['rounds']} rounds of {j['seconds']:g} s runs, P95 <= "
             f"{j['p95_ms']:g} ms and errors <= {j['max_errors']:.0%}",
             f"{'entrant':<18}{'req/s':>8}{'spread':>8}   rounds (req/s)          runs  by asyncio  above start"]
    for name, s in j["entrants"].items():
        spread = "-" if s["spread"] is None else f"{s['spread']:.0%}"
        rounds = ", ".join(f"{x:.0f}" for x in s["rounds_rps"])
        lines.append(f"{name:<18}{s['rps']:>8.0f}{spread:>8}   {rounds:<24}{s['runs']:>4}{s['fallback_runs']:>11}"
                     f"{s['held_above_start']:>10}")
    lines.append("(above start: runs that held above the first rate, a rung over the claim, as the ladder climbed)")
    return "\n".join(lines)
