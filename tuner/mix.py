"""Joint tuning for a traffic mix: every model of an edge box tuned together.

A box serves a mix (deploy.yaml `traffic:`, requests per second per model or pipeline, each with
its own P95 SLO). Configs that each met their SLO with the box to themselves can miss it together,
as they share the cores. The objective is the highest common scale s of the mix at which every
entry meets its SLO: the box holds s times the traffic it is given.

The search is the single-model tuner's rule over the joint config (every model's knobs), with the
same Rules (tuner/rules.py):
1. the start (each model's config from the spec, or each tuned alone) is measured up the scale
   ladder (`rate_step`) to its sustained scale: the highest rung where most of up to `runs` runs
   of the whole mix meet every entry's SLO less the margin, errors within the bound;
2. at the rung it missed, the entry furthest over its SLO is the bottleneck. One knob of one model
   moves at a time (batch x2 or /2, the delay a rung, one instance more or less): the bottleneck's
   models first, then the others' moves that give cores back (one instance fewer, a longer
   delay, a larger batch). A move wins when the mix holds the rung above the incumbent's
   scale, and then climbs;
3. the winner is confirmed: `runs` runs at its scale, `mix_confirm_s` seconds in all (as long as
   the load test a user would check it with), each entry's requests pooled, every SLO met itself
   and errors within `error_margin` of the bound, a rung lower until they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from tritonkit.configs.generate import generate
from tritonkit.errors import InputError, Problem
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.asyncgen import run_load
from tritonkit.loadtests.load import Load, Outcome, run_figures
from tritonkit.loadtests.results import SCHEMA
from tritonkit.serving import Running, running
from tritonkit.slo import ERROR_BOUND, SloBound
from tritonkit.spec import Spec
from tritonkit.tuner import outputs
from tritonkit.tuner.apply import LiveConfig, Models, Served
from tritonkit.tuner.knobs import Knobs, from_spec, max_instances, neighbours
from tritonkit.tuner.ladder import down_from, walk_down, walk_up
from tritonkit.tuner.noise import settle
from tritonkit.tuner.pooled import pool
from tritonkit.tuner.rules import RULES, Rules
from tritonkit.tuner.run import max_batch_bound
from tritonkit.tuner.strategy import HillClimb, drive

Configs = dict[str, Knobs]  # model -> its knobs


@dataclass(frozen=True)
class Entry:
    """One part of the mix: a model or a pipeline, its rate at scale 1, its SLO and the models it runs."""

    name: str
    rps: float
    slo: SloBound  # its own P95, with the search's margin and error bound
    models: tuple[str, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "rps": self.rps, "slo_ms": self.slo.p95_ms, "models": list(self.models)}


def entries_of(spec: Spec, margin: float = 0.0, max_errors: float = ERROR_BOUND) -> list[Entry]:
    """The spec's traffic mix, each entry with its SLO (and the search's `margin` and error bound);
    every problem named with its field."""
    if not spec.traffic:
        raise InputError([Problem(spec.shown, "traffic", "no traffic mix to tune for",
                                  "add `traffic:` with requests per second per model or pipeline, e.g. "
                                  "{detector: 20, recogniser: 100}")])
    problems, out = [], []
    for name, rps in spec.traffic.items():
        slo = spec.slo_of(name).p95_ms
        if not slo:
            kind, items = ("pipelines", spec.pipelines) if spec.pipeline(name) else ("models", spec.models)
            at = f"{kind}[{[x.name for x in items].index(name)}].slo.p95_ms"
            problems.append(Problem(spec.shown, at, f"{name} is in the traffic mix without a P95 SLO",
                                    "set its slo.p95_ms: joint tuning holds every entry to its own"))
            continue
        out.append(Entry(name, rps, SloBound(slo, margin, max_errors), tuple(spec.steps_of(name))))
    if problems:
        raise InputError(problems)
    return out


@dataclass
class MixRun:
    """One run of the whole mix at one scale: per entry its rate, served rate, P95 and errors."""

    n: int
    phase: str
    scale: float
    configs: dict[str, str]  # model -> knobs label
    figures: dict[str, dict]  # entry -> {"rps", "ok_rps", "requests", "p95_ms", "error_ratio", "slo_ms"}
    held: bool
    worst: str | None  # the entry furthest over (or nearest to) its SLO
    latencies: dict[str, list[float]] = field(default_factory=dict, repr=False)  # for pooling; not logged

    def to_json(self) -> dict:
        return {"n": self.n, "phase": self.phase, "scale": round(self.scale, 3), "configs": self.configs,
                "figures": self.figures, "held": self.held, "worst": self.worst}


def send_mix(url: str, entries: list[Entry], scale: float, load: Load) -> dict[str, tuple[Load, Outcome]]:
    """Every entry's share of the mix at `scale`, sent together (one asyncio client per entry, one loop)."""
    loads = [replace(load, rate=e.rps * scale) for e in entries]

    async def together() -> list[Outcome]:
        return await asyncio.gather(*(run_load(url, e.name, x, seed=i) for i, (e, x) in enumerate(zip(entries, loads))))

    return {e.name: (x, out) for e, x, out in zip(entries, loads, asyncio.run(together()))}


def judge_run(n: int, phase: str, scale: float, configs: Configs, entries: list[Entry],
              sent: dict[str, tuple[Load, Outcome]]) -> MixRun:
    figures, latencies, ratio = {}, {}, {}
    held = True
    for e in entries:
        load, out = sent[e.name]
        f = run_figures(load, out)
        figures[e.name] = {"rps": round(load.rate, 1), "ok_rps": round(f.ok_rps, 1),
                           "requests": f.requests, "p95_ms": None if f.p95_ms is None else round(f.p95_ms, 3),
                           "error_ratio": round(f.error_ratio, 4), "slo_ms": e.slo.p95_ms}
        latencies[e.name] = f.ok_ms
        held &= e.slo.passes(f.p95_ms, f.error_ratio)
        ratio[e.name] = (f.p95_ms or float("inf")) / e.slo.p95_ms + (f.error_ratio > e.slo.max_error_ratio)
    worst = max(ratio, key=ratio.get) if ratio else None
    return MixRun(n, phase, scale, {m: k.label() for m, k in configs.items()}, figures, held, worst, latencies)


class MixBox:
    """The box: one server with every model and pipeline of the mix, whose configs change together
    through one LiveConfig (`tuner.apply.Models`): a refused set puts the last good one back."""

    def __init__(self, spec: Spec, repo: Path, r: Running, log: Callable[[str], None]):
        self.spec, self.repo, self.r, self.log = spec, Path(repo), r, log
        self.live = LiveConfig(Served(r), spec, repo, "", log, target=Models(r, repo, spec))

    def variant(self, configs: Configs) -> Spec:
        spec = self.spec
        for model, k in configs.items():
            spec = k.apply(spec, model)
        return spec

    def apply(self, configs: Configs) -> str | None:
        """Put `configs` in force; None when they serve, else why not (the last good ones serve again)."""
        try:
            return self.live.apply(self.variant(configs))
        except InputError as e:  # the kit's rules refuse the set: nothing was written
            self.log(f"    refused: {str(e)[:300]}")
            return str(e)

    def keep(self) -> None:
        self.live.keep()

    def run(self, n: int, phase: str, scale: float, configs: Configs, entries: list[Entry], load: Load) -> MixRun:
        """`configs` in force, the mix sent at `scale`, and the run judged; a refused config is a run
        that holds nothing (the last good configs serve again)."""
        if self.apply(configs):
            return MixRun(n, phase, scale, {m: k.label() for m, k in configs.items()}, {}, False, None)
        sent = send_mix(self.r.endpoints.grpc, entries, scale, load)
        run = judge_run(n, phase, scale, configs, entries, sent)
        self.keep()
        return run

@dataclass
class MixTuning:
    entries: list[Entry]
    start: Configs
    start_scale: float
    best: Configs
    scale: float
    confirmed: bool
    confirmation: dict[str, dict] = field(default_factory=dict)  # entry -> pooled figures at `scale`
    stopped_because: str = ""


class MixSearch:
    """`box` puts configs in force and measures the mix (`MixBox.run`); `bounds`: each model's
    largest max batch (default: the box's spec, by the memory plan)."""

    def __init__(self, box: MixBox, entries: list[Entry], *, max_trials: int, load: Load, rules: Rules = RULES,
                 bounds: dict[str, int] | None = None, log: Callable[[str], None] = print):
        self.box, self.entries, self.max_trials = box, entries, max_trials
        self.load, self.rules, self.log = load, rules, log
        self.runs: list[MixRun] = []
        self.bounds = bounds or {m: max(1, max_batch_bound(box.spec, m)) if box.spec.model(m).max_batch_size else 0
                                 for m in models_of(entries)}

    @property
    def left(self) -> int:
        # a confirmation at two scales stays reserved: a slower minute after the search costs a rung
        return self.max_trials - len(self.runs) - 2 * self.rules.runs

    def measure(self, configs: Configs, scale: float, phase: str) -> MixRun:
        run = self.box.run(len(self.runs) + 1, phase, scale, configs, self.entries, self.load)
        self.runs.append(run)
        shown = ", ".join(f"{n} {_ms(f['p95_ms'])}/{f['slo_ms']:g} ms" + (f" err {f['error_ratio']:.1%}"
                                                                         if f["error_ratio"] else "")
                          for n, f in run.figures.items())
        self.log(f"  run {run.n:>3} {phase:<10} x{scale:5.2f}  {shown}  {'holds' if run.held else 'misses'}")
        return run

    def holds(self, configs: Configs, scale: float, phase: str) -> tuple[bool, list[MixRun]]:
        """The one verdict (`noise.settle`): most of up to `rules.runs` runs hold (no run of a whole
        mix is clear on its own: each entry is judged against its own SLO)."""
        return settle(lambda: self.measure(configs, scale, phase), lambda r: r.held, lambda: self.left > 0,
                      rules=self.rules)

    def sustained(self, configs: Configs, scale: float, phase: str,
                  given: list[MixRun] | None = None) -> tuple[float, MixRun | None]:
        """The highest scale that holds, to within a rung, along the one ladder walk
        (`tuner/ladder.py`): from a `scale` that holds, its edge bracketed and bisected; from one
        that does not, down a rung at a time. With the run that missed above it (whose worst entry
        is the bottleneck). `given`: runs at `scale` that already held there."""
        ok, runs = (True, given) if given else self.holds(configs, scale, phase)
        missed: dict[float, MixRun | None] = {scale: _missed(runs)}

        def holds(x: float) -> bool:
            ok, runs = self.holds(configs, x, phase)
            missed[x] = _missed(runs)
            return ok

        def more() -> bool:
            return self.left > 0

        if ok:
            top, miss = walk_up(scale, holds, self.rules.rate_step, more)
            return top, None if miss is None else missed[miss]
        below = walk_down(scale, holds, self.rules.rate_step, more, self.rules.max_steps_down)
        # the bottleneck: the entry worst over its SLO at the lowest scale that missed
        lowest_miss = min((x for x in missed if below is None or x > below), default=scale)
        return (0.0 if below is None else below), missed[lowest_miss]

    def moves(self, configs: Configs, bottleneck: str | None) -> Iterator[Configs]:
        """One knob of one model at a time: every move of the bottleneck's models, then the moves
        of the others that give cores back."""
        mine = next((e.models for e in self.entries if e.name == bottleneck), ())
        for model in mine:
            for k in neighbours(configs[model], self.bounds[model], rules=self.rules):
                if k.instances <= max_instances():
                    yield {**configs, model: k}
        for model in configs:
            if model in mine:
                continue
            now = configs[model]
            for k in neighbours(now, self.bounds[model], rules=self.rules):
                if k.instances < now.instances or k.delay_us > now.delay_us or k.max_batch > now.max_batch:
                    yield {**configs, model: k}

    def run(self, start: Configs, start_scale: float = 1.0) -> MixTuning:
        """Hill climbing over the joint config (`tuner/strategy.py`): a move wins when the mix
        holds the rung above the incumbent's scale, and then walks to its own edge."""
        self.log(f"== the start: {_configs(start)}")
        scale, missed = self.sustained(start, start_scale, "start")
        tuning = MixTuning(self.entries, start, scale, start, scale, False,
                           stopped_because="no move held the rung above the incumbent's scale")
        if scale <= 0:
            return tuning

        def moves(configs: Configs, reached: tuple[float, MixRun | None]) -> Iterator[Configs]:
            scale, missed = reached
            bottleneck = missed.worst if missed else None
            self.log(f"== from x{scale:.2f}; bottleneck: {bottleneck or '-'}")
            yield from self.moves(configs, bottleneck)

        climb = HillClimb(start, (scale, missed), moves, key=_key)

        def measure(move: Configs) -> tuple[float, MixRun | None] | None:
            incumbent, (scale, _) = climb.incumbent, climb.result
            above = scale * self.rules.rate_step
            ok, runs = self.holds(move, above, "move")
            changed = next(f"{m}: {k.label()}" for m, k in move.items() if incumbent[m] != k)
            self.log(f"    {'won' if ok else 'lost'}: {changed} {'holds' if ok else 'misses'} x{above:.2f}")
            return self.sustained(move, above, "move", given=runs) if ok else None

        if not drive(climb, measure, lambda: self.left >= self.rules.runs):
            tuning.stopped_because = f"trial budget ({self.max_trials} runs) used"
        tuning.best, (tuning.scale, _) = climb.incumbent, climb.result
        self.confirm(tuning)
        return tuning

    def confirm(self, tuning: MixTuning) -> None:
        """`runs` runs at the scale, `mix_confirm_s` seconds in all, pooled per entry, every SLO
        itself; a rung lower until they hold."""
        scale = tuning.scale
        search_load = self.load
        self.load = replace(search_load, duration_s=max(search_load.duration_s,
                                                        self.rules.mix_confirm_s / self.rules.runs))
        self.log(f"== confirm: {self.rules.runs} runs of {self.load.duration_s:g} s, pooled per entry, every SLO "
                 "itself")
        try:
            self._confirm(tuning, scale)
        finally:
            self.load = search_load

    def _confirm(self, tuning: MixTuning, scale: float) -> None:
        def holds(x: float) -> bool:
            runs = [self.measure(tuning.best, x, "confirm") for _ in range(self.rules.runs)]
            pooled = pooled_figures(runs, self.entries)
            if all(e.slo.holds(pooled[e.name]["p95_ms"], pooled[e.name]["error_ratio"], self.rules.error_margin)
                   for e in self.entries):
                tuning.scale, tuning.confirmed, tuning.confirmation = x, True, pooled
                return True
            return False

        down_from(scale, holds, self.rules.rate_step, lambda: len(self.runs) + self.rules.runs <= self.max_trials,
                  self.rules.max_steps_down)


def pooled_figures(runs: list[MixRun], entries: list[Entry]) -> dict[str, dict]:
    """Each entry's requests over `runs`, pooled (`tuner/pooled.py`)."""
    out = {}
    for e in entries:
        mine = [(r.latencies.get(e.name, []), r.figures[e.name]) for r in runs if e.name in r.figures]
        p = pool((lat, f["requests"], f["error_ratio"]) for lat, f in mine)
        out[e.name] = {"p95_ms": p.percentile(95), "error_ratio": round(p.error_ratio, 4), "requests": p.requests,
                       "ok_rps": round(statistics.mean(f["ok_rps"] for _, f in mine), 1) if p.requests else 0.0,
                       "slo_ms": e.slo.p95_ms}
    return out


def _missed(runs: list[MixRun]) -> MixRun | None:
    """The last run that missed: its worst entry is the bottleneck."""
    return next((r for r in reversed(runs) if not r.held), None)


def models_of(entries: list[Entry]) -> list[str]:
    return list(dict.fromkeys(m for e in entries for m in e.models))


@contextlib.contextmanager
def mix_box(spec: Spec, repo: Path, state_dir: Path, entries: list[Entry], log: Callable[[str], None]
            ) -> Iterator[MixBox]:
    """A server with every entry of the mix loaded; the spec's configs back in the repository after."""
    generate(spec, repo)
    ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
    try:
        with running(spec, repo, state_dir, models=[e.name for e in entries], ports=ports, log=log) as r:
            yield MixBox(spec, repo, r, log)
    finally:
        generate(spec, repo)


def start_configs(spec: Spec, entries: list[Entry]) -> Configs:
    return {m: from_spec(spec.model(m)) for m in models_of(entries)}


def tune_mix(spec: Spec, repo: Path, state_dir: Path, out_dir: Path, *, start: Configs | None = None,
             max_trials: int = 40, max_errors: float = ERROR_BOUND,
             load: Load | None = None, rules: Rules = RULES, write_decision: bool = False,
             log: Callable[[str], None] = print) -> tuple[MixTuning, list[MixRun], float]:
    """The spec's traffic mix tuned together (module doc); with `write_decision`, a confirmed
    tuning's configs go into tuned.yaml, every model's."""
    entries = entries_of(spec, rules.slo_margin, max_errors)
    load = load or Load(rate=1.0, duration_s=rules.mix_run_s, warmup_s=1.0, drain_s=2.0)
    t0 = time.perf_counter()
    log("traffic mix: " + ", ".join(f"{e.name} {e.rps:g} req/s (P95 <= {e.slo.p95_ms:g} ms)" for e in entries))
    with mix_box(spec, repo, state_dir, entries, log) as box:
        with box.r.client() as c:
            about = {"url": box.r.endpoints.grpc, "started_by": "the kit's bundled server",
                     "version": c.server_version(), "backend": "python"}
        search = MixSearch(box, entries, max_trials=max_trials, load=load, rules=rules, log=log)
        tuning = search.run(start or start_configs(spec, entries))
    seconds = time.perf_counter() - t0
    write_bytes_atomic(Path(out_dir) / "mix.json", json.dumps({
        "schema": SCHEMA, "kind": "tune/mix", "entries": [e.to_json() for e in entries],
        "start": {m: k.to_json() for m, k in tuning.start.items()}, "start_scale": round(tuning.start_scale, 3),
        "best": {m: k.to_json() for m, k in tuning.best.items()}, "scale": round(tuning.scale, 3),
        "confirmed": tuning.confirmed, "confirmation": tuning.confirmation,
        "stopped_because": tuning.stopped_because, "seconds": round(seconds, 1),
        "runs": [r.to_json() for r in search.runs]}, indent=2, default=list).encode())
    if write_decision and tuning.confirmed:
        for model, k in tuning.best.items():
            outputs.write_tuned(spec, model, k, about)
    return tuning, search.runs, seconds


def format_mix(t: MixTuning) -> str:
    lines = [f"start  x{t.start_scale:.2f}: {_configs(t.start)}",
             f"{'kept ' if _key(t.best) == _key(t.start) else 'after'}  x{t.scale:.2f}: {_configs(t.best)}"
             f"{'' if t.confirmed else '  (not confirmed)'}"]
    for name, f in t.confirmation.items():
        lines.append(f"  {name:<20} {f['ok_rps']:>8.1f} req/s  P95 {_ms(f['p95_ms'])} ms (SLO {f['slo_ms']:g})  "
                     f"errors {f['error_ratio']:.2%}")
    return "\n".join(lines)


def _configs(c: Configs) -> str:
    return "; ".join(f"{m} {' '.join(k.label().split())}" for m, k in c.items())


def _key(c: Configs) -> tuple:
    return tuple(sorted((m, k.max_batch, k.delay_us, k.instances) for m, k in c.items()))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"
