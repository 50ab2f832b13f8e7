"""What a tuning aims at and what it found: the objective, one candidate's score, and the outcome
the report, trials.json and tuned.yaml are written from."""

from __future__ import annotations

from dataclasses import dataclass, field

from tritonkit.slo import SloBound
from tritonkit.tuner.costmodel import CostModel
from tritonkit.tuner.knobs import Knobs
from tritonkit.tuner.trials import Trial


@dataclass(frozen=True)
class Objective(SloBound):
    """The SLO with its margin and error bound (`tritonkit.slo.SloBound`), and what is maximised under it:
    the sustained rate, or with `rps` the P95 at that rate."""

    rps: float | None = None  # None: maximise the sustained rate

    @property
    def kind(self) -> str:
        return "latency" if self.rps else "throughput"

    def describe(self) -> str:
        target = f"{self.target_p95_ms:g} ms (SLO {self.p95_ms:g} ms less a {self.margin:.0%} margin)" \
            if self.margin else f"{self.p95_ms:g} ms"
        if self.rps:
            return f"lowest P95 at {self.rps:g} req/s (P95 <= {target})"
        return f"highest sustained req/s with P95 <= {target} and errors <= {100 * self.max_error_ratio:g}%"


@dataclass
class Score:
    """What one candidate achieved: the value the objective compares, and the trial behind it."""

    knobs: Knobs
    value: float  # req/s (throughput) or -P95 ms (latency); -inf when it never passed
    rate: float | None
    trial: Trial | None  # the run behind the figure (the median passing one)
    runs: list[Trial] = field(default_factory=list)  # every run at `rate` behind the verdict

    @property
    def passed(self) -> bool:
        return self.trial is not None and self.trial.passed


@dataclass
class Tuning:
    objective: Objective
    baseline: Score
    best: Score
    cost_model: CostModel | None
    bound: int
    overload: list[Trial] = field(default_factory=list)  # the checks of the protective policy, in order
    confirmed: bool = False
    claim_note: str = ""  # why an unconfirmed winner claims the rate it does (`confirm._claim_what_held`)
    stopped_because: str = ""
    policy_note: str = ""  # why the winner has no protective queue policy, when it has none
    noise_log_sd: float | None = None  # run-to-run standard deviation of log P95 measured on this machine
    noise_repeats: int = 0  # repeated runs behind it (0: the prior alone)
    # the machine's own speed at the start and the end: {"batch", "start_ms", "end_ms", "change"}
    speed: dict | None = None
    # the best config any verdict measured (label, the highest rate it held): the written one,
    # unless `differs_because` says why not
    best_measured: tuple[str, float] | None = None
    differs_because: str = ""
    # the confirmation's runs of the winner and of the start beside it, at the same rates:
    # (winner P95, start P95), math.inf for a run that failed outright
    beside_start: list[tuple[float, float]] = field(default_factory=list)
    # those pairs' verdict (`noise.start_stands`): the winner did not beat the start beside it, and
    # the start is what is written
    start_stands_beside: bool = False
    beside_why: str = ""  # what decided it: the clear pairs, or a tie and the rates each held alone
    predicts: bool = True  # the cost model could rank candidates (else the space was screened blind)
    in_flight: int | None = None  # the gateway's limit for the written config (`tuner/in_flight.py`)

    @property
    def beat_start(self) -> bool:
        """The winner stands beside the start (no pairs run: what the search found)."""
        if not self.beside_start:
            return not self.kept and self.best.passed
        return not self.start_stands_beside

    @property
    def written(self) -> bool:
        """A config is written: a confirmed one, or a winner that beat the start beside it though no
        rate was confirmed within the trials left (the report says so)."""
        return self.confirmed or (not self.kept and self.beat_start)

    @property
    def kept(self) -> bool:
        """The winner batches as the start config did (max batch, delay, instances): the search moved
        nothing, whatever queue policy it adds."""
        return self.baseline.knobs.schedule == self.best.knobs.schedule
