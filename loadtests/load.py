"""What a load test sends, independent of the engine that sends it (asyncio gRPC or Locust HTTP).

A load is open loop (arrivals at a target rate, Poisson or constant, whatever the server does)
or closed loop (a number of clients, each sending its next request when the last one returns).
Its shape scales that target over the steady window: constant, step, ramp or spike. A run has a
warm-up (not counted), a steady window (counted: requests *scheduled* in it) and a drain (the
window's requests finish; nothing new is sent).

Both engines record `Sample`s into an `Outcome`; `generator_health` then says whether the
generator kept up, so that no result is silently the generator's limit rather than the server's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from tritonkit.errors import InputError, flag_problem
from tritonkit.slo import meets
from tritonkit.stats import percentile

OVERALL = "overall"

# Fraction of the target at progress p in [0, 1) through the steady window; warm-up runs at p = 0.
SHAPES: dict[str, Callable[[float], float]] = {
    "constant": lambda p: 1.0,
    "step": lambda p: (min(int(p * 4), 3) + 1) / 4,  # 25%, 50%, 75%, 100%, a quarter of the window each
    "ramp": lambda p: 0.1 + 0.9 * p,  # 10% up to 100%
    "spike": lambda p: 1.0 if 0.4 <= p < 0.6 else 0.3,  # 30%, with the middle fifth at 100%
    "updown": lambda p: 1.0 if int(p * 4) % 2 else 0.2,  # 20%, 100%, 20%, 100%: steps both ways
}


@dataclass(frozen=True)
class RequestClass:
    """A kind of request with its share of the traffic, its priority and its queue timeout."""

    name: str = "default"
    weight: float = 1.0
    priority: int = 0  # 0 = the model's default priority
    timeout_us: int | None = None  # Triton only lets it shorten the policy's (allow_timeout_override)
    batch: int = 1

    @classmethod
    def from_flags(cls, texts: list[str] | None) -> list[RequestClass] | None:
        """--class NAME:WEIGHT:PRIORITY[:TIMEOUT_US[:BATCH]], repeatable; none: one default class."""
        classes = []
        for text in texts or []:
            parts = text.split(":")
            try:
                if not 3 <= len(parts) <= 5 or not parts[0] or parts[0] == OVERALL:
                    raise ValueError("expected NAME:WEIGHT:PRIORITY[:TIMEOUT_US[:BATCH]]")
                timeout = int(parts[3]) if len(parts) > 3 and parts[3] else None
                batch = int(parts[4]) if len(parts) > 4 else 1
                classes.append(check_class(cls(parts[0], float(parts[1]), int(parts[2]), timeout, batch), "--class"))
            except ValueError as e:
                raise InputError([flag_problem(f"--class {text}", f"{e}; for example --class interactive:1:1:50000")]) \
                    from None
        if len({c.name for c in classes}) != len(classes):
            raise InputError([flag_problem("--class", "give each class its own name")])
        return classes or None


@dataclass(frozen=True)
class Load:
    rate: float | None = None  # open loop, requests per second
    arrival: str = "poisson"  # poisson | constant
    concurrency: int | None = None  # closed loop
    duration_s: float = 10.0  # steady window
    warmup_s: float = 2.0
    drain_s: float = 10.0
    max_in_flight: int = 2048  # beyond this the generator drops arrivals (and says so)
    shape: str = "constant"

    @classmethod
    def from_flags(cls, rate: float | None, users: int | None, duration_s: float, warmup_s: float,
                   arrival: str = "poisson", shape: str = "constant") -> Load:
        """--rps/--users/--duration as the command line gives them, each refused with its flag."""
        if not rate and not users:
            raise InputError([flag_problem("--rps/--users", "give an arrival rate (--rps R) or a concurrency "
                                                             "(--users N)")])
        if (rate is not None and rate <= 0) or (users is not None and users < 1) or duration_s <= 0:
            raise InputError([flag_problem("--rps/--users/--duration", "use a rate > 0, users >= 1 and a "
                                                                        "duration > 0")])
        return cls(rate=rate, arrival=arrival, concurrency=users, duration_s=duration_s, warmup_s=warmup_s,
                   shape=shape)

    def __post_init__(self) -> None:
        if not self.rate and not self.concurrency:
            raise ValueError("give a rate (open loop) or a concurrency (closed loop)")
        if self.shape not in SHAPES:
            raise ValueError(f"shape {self.shape!r}: use one of {sorted(SHAPES)}")
        if self.arrival not in ("poisson", "constant"):
            raise ValueError(f"arrival {self.arrival!r}: use poisson or constant")

    @property
    def mode(self) -> str:
        return "open" if self.rate else "closed"

    @property
    def total_s(self) -> float:
        return self.warmup_s + self.duration_s

    def level(self, elapsed_s: float) -> float:
        """The shape's fraction of the target, `elapsed_s` after the start of the run."""
        p = (elapsed_s - self.warmup_s) / self.duration_s
        return SHAPES[self.shape](min(max(p, 0.0), 0.999999))

    def rate_at(self, elapsed_s: float) -> float:
        return (self.rate or 0.0) * self.level(elapsed_s)

    def clients_at(self, elapsed_s: float) -> int:
        return max(1, math.ceil((self.concurrency or 0) * self.level(elapsed_s)))

    def describe(self) -> str:
        shaped = "" if self.shape == "constant" else f", {self.shape} shape"
        if self.rate:
            return f"open loop, {self.arrival} arrivals at {self.rate:g} req/s{shaped}"
        return f"closed loop, {self.concurrency} concurrent clients{shaped}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Load:
        return cls(**json.loads(text))


def parse_classes(text: str | None) -> list[RequestClass]:
    """Request classes from JSON: a list of objects, each with at least a "name"."""
    if not text:
        return [RequestClass()]
    items = json.loads(text)
    if not isinstance(items, list) or not items:
        raise ValueError("must be a non-empty JSON list of objects")
    known = set(RequestClass.__dataclass_fields__)
    classes = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "name" not in item:
            raise ValueError(f"[{i}] must be an object with a \"name\"")
        if unknown := set(item) - known:
            raise ValueError(f"[{i}] unknown keys {sorted(unknown)} (known: {sorted(known)})")
        classes.append(check_class(RequestClass(**item), f"[{i}]"))
    names = [c.name for c in classes]
    if len(set(names)) != len(names) or OVERALL in names:
        raise ValueError(f"class names must be unique and not {OVERALL!r}: {names}")
    return classes


def check_class(c: RequestClass, where: str) -> RequestClass:
    if c.weight <= 0 or c.batch < 1 or c.priority < 0 or (c.timeout_us is not None and c.timeout_us < 0):
        raise ValueError(f"{where} {c.name!r}: weight must be > 0, batch >= 1, priority and timeout_us >= 0")
    return c


def classes_json(classes: list[RequestClass]) -> str:
    return json.dumps([asdict(c) for c in classes])


@dataclass
class Sample:
    cls: str
    scheduled: float  # when the arrival schedule (open loop) or the client (closed loop) wanted it sent
    sent: float
    latency_s: float | None  # None when the request failed
    kind: str | None = None  # error kind when it failed
    endpoint: str | None = None  # through a router: the endpoint that answered
    failed_after_s: float | None = None  # a failed request: how long its error took to come back


@dataclass
class Outcome:
    samples: list[Sample] = field(default_factory=list)  # steady window only
    dropped: int = 0  # arrivals the generator could not send (max_in_flight reached)
    unanswered: int = 0  # open loop: steady-window requests sent but neither answered nor failed by the drain's end
    # elements of every generated input: as drawn, and as sent after padding to the length buckets
    real_elements: int = 0
    sent_elements: int = 0
    cpu_percent: float = 0.0  # the generator process's CPU over the run, percent of one core
    wall_s: float = 0.0
    error_examples: dict[str, str] = field(default_factory=dict)
    # Triton's statistics at the steady window's start and after the drain: the server's side of
    # exactly the requests counted here (plus the few warm-up requests still in flight)
    stats_before: dict | None = None
    stats_after: dict | None = None
    # (start, end) perf_counter intervals in which the generator's loop did not run (loadtests/stalls.py)
    stalls: list[tuple[float, float]] = field(default_factory=list)
    # what an external generator (perf_analyzer) said about keeping up, in its own words: reported,
    # not a verdict (it counts a request sent a microsecond late as delayed; a rate it could not
    # offer shows as a short run)
    generator_notes: list[str] = field(default_factory=list)

    @property
    def padding_waste(self) -> float | None:
        """Padded elements over real ones (0: nothing padded); None where no input was counted."""
        return round(self.sent_elements / self.real_elements - 1, 3) if self.real_elements else None


@dataclass(frozen=True)
class RunFigures:
    """One run's figures as a verdict reads them: the ok requests' latencies, the P95 of them, the
    failed share, and whether the generator kept up (a run it could not offer says nothing)."""

    ok_ms: list[float]
    requests: int
    p95_ms: float | None
    error_ratio: float
    ok_rps: float
    saturated: bool
    warning: str | None

    def holds(self, p95_ms: float, max_errors: float) -> bool:
        """The one per-run verdict of a run judged alone (the judge's, each entry of a traffic mix's):
        a P95 within `p95_ms`, errors within `max_errors`, and a generator that kept up."""
        return meets(self.p95_ms, p95_ms, self.error_ratio, max_errors) and not self.saturated


def run_figures(load: Load, out: Outcome) -> RunFigures:
    ok = [s.latency_s * 1e3 for s in out.samples if s.latency_s is not None]
    n = len(out.samples) + out.unanswered  # one still out after the drain failed its deadline
    health = generator_health(load, out)
    return RunFigures(ok, n, percentile(ok, 95) if ok else None, (n - len(ok)) / n if n else 1.0,
                      len(ok) / load.duration_s, health["saturated"], health["warning"])


def generator_health(load: Load, out: Outcome) -> dict:
    """Is the generator keeping up? Lag behind the schedule, achieved rate, CPU, dropped arrivals."""
    lags_ms = [(s.sent - s.scheduled) * 1e3 for s in out.samples]
    achieved = (len(out.samples) + out.unanswered) / load.duration_s  # sent, whatever became of them
    health = {"cpu_percent": round(out.cpu_percent, 1), "achieved_rate": round(achieved, 1),
              "lag_p95_ms": round(percentile(lags_ms, 95), 3) if lags_ms else None,
              "dropped": out.dropped, "saturated": False, "short": False, "warning": None,
              "notes": list(out.generator_notes)}
    reasons = []
    if out.cpu_percent > 90:
        reasons.append(f"its process used {out.cpu_percent:.0f}% of a core")
    if load.rate:
        # the shape lowers the target on purpose: compare against the mean level it asked for
        asked = load.rate * _mean_level(load)
        # Poisson arrivals in the window vary by sqrt(n) around n: a 1 s window at 50 req/s holds
        # fewer than 45 one time in five. Short means short by more than three of those.
        chance = 3 * math.sqrt(asked * load.duration_s) / load.duration_s if load.arrival == "poisson" else 0.0
        if achieved < 0.9 * asked - chance:
            health["short"] = True
            reasons.append(f"it sent {achieved:.0f} req/s of the {asked:.0f} asked")
        # Scheduling jitter on a busy box delays sends by a few ms without limiting the load; a lag
        # of a whole inter-arrival gap (or 20 ms) means the generator fell behind.
        if health["lag_p95_ms"] is not None and health["lag_p95_ms"] > max(20.0, 1000.0 / load.rate):
            reasons.append(f"its sends ran {health['lag_p95_ms']:.1f} ms (P95) behind schedule")
        if out.dropped:
            reasons.append(f"{out.dropped} arrivals were dropped at {load.max_in_flight} in flight")
    if reasons:
        health["saturated"] = True
        health["warning"] = ("the load generator, not the server, limited this run: " + "; ".join(reasons)
                             + ". Its numbers understate the offered load; use fewer req/s or more generator cores.")
    return health


def _mean_level(load: Load, steps: int = 1000) -> float:
    return sum(SHAPES[load.shape](i / steps) for i in range(steps)) / steps
