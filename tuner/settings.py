"""What `tritonkit tune` is asked for, each value checked once, here, with the flag that sets it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tritonkit.errors import input_error, raise_flag_problems
from tritonkit.slo import ERROR_BOUND
from tritonkit.spec import Spec
from tritonkit.tuner.rules import RULES, Rules

ENGINES = ("asyncio", "perf_analyzer")


def slo_for(spec: Spec, model: str, p95_ms: float | None) -> float:
    """The P95 SLO every tuner aims at: --p95-ms, else the model's slo.p95_ms."""
    m = spec.model(model)
    slo = p95_ms or m.slo.p95_ms
    if not slo:
        raise input_error(spec.shown, f"models[{spec.models.index(m)}].slo.p95_ms", "the tuner needs a P95 SLO",
                          "set slo.p95_ms in the spec or pass --p95-ms")
    return slo


@dataclass(frozen=True)
class TuneSettings:
    p95_ms: float | None = None  # None: the model's slo.p95_ms
    rps: float | None = None  # offline: the lowest P95 at this rate; None: the highest rate within the SLO
    # offline: calibration, the start, a screen of the whole space (10 configs on two cores) over its
    # rounds, the finalists' edges, the overload gate and a confirmation at two rates beside the start
    max_trials: int = 42
    max_errors: float = ERROR_BOUND  # offline: error ratio a trial may have
    max_batch: int | None = None  # offline: the largest max batch to try
    margin: float = RULES.slo_margin  # offline: share of the SLO held back
    max_trial_s: float = 8.0  # offline: the longest steady window of one trial
    # offline: the client that measures each trial. perf_analyzer (C++) leaves the most of the cores a
    # server shares with its client; the asyncio client marks its own trials generator-limited sooner
    engine: str = "perf_analyzer"
    interval_s: float = 5.0  # online: seconds per observation window
    cooldown_s: float = 15.0  # online: seconds between two changes
    duration_s: float | None = None  # online: None runs until Ctrl-C

    @property
    def rules(self) -> Rules:
        """The tuner's rules with what the flags change in them (`--margin`)."""
        return replace(RULES, slo_margin=self.margin)

    def __post_init__(self) -> None:
        raise_flag_problems([
            ("--p95-ms", self.p95_ms is None or self.p95_ms > 0, "give the P95 SLO in ms, above 0, e.g. 25"),
            ("--rps", self.rps is None or self.rps > 0, "give a rate above 0, e.g. 400"),
            ("--max-trials", self.max_trials >= 5, "allow at least 5 trials (calibration alone takes 3)"),
            ("--max-errors", 0 <= self.max_errors < 1, "give a ratio within 0..1, e.g. 0.01"),
            ("--max-batch", self.max_batch is None or self.max_batch >= 1, "give a max batch of at least 1"),
            ("--margin", 0 <= self.margin <= 0.5, "give the share of the SLO to hold back, within 0..0.5, e.g. 0.1"),
            ("--max-trial-s", self.max_trial_s >= 1, "give the longest trial window in seconds, at least 1, e.g. 8"),
            ("--engine", self.engine in ENGINES, f"measure trials with one of {', '.join(ENGINES)}"),
            ("--interval", self.interval_s > 0, "give a window above 0 s, e.g. 5"),
            ("--cooldown", self.cooldown_s >= 0, "give a cool-down of 0 s or more"),
            ("--duration", self.duration_s is None or self.duration_s > 0,
             "give a duration above 0 s, or leave it out"),
        ])
