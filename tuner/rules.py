"""Every number the tuner decides with, in one object, each with the reason for its value.

The offline search (`tuner/offline.py`), its noise rules (`tuner/noise.py`), the pooled
confirmation (`tuner/pooled.py`), the cost model (`tuner/costmodel.py`), the knobs' ladder
(`tuner/knobs.py`) and the protective queue policy (`tuner/protect.py`) read them from here, so a
rule can be switched off in one place to see what it is worth (`tritonkit bench ablation`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rules:
    # -- the cost model --------------------------------------------------------------------------
    headroom: float = 0.8  # share of a config's capacity a rate may fill: queueing near 100% breaks any SLO
    min_executions: int = 3  # a batch size Triton ran fewer times than this is noise in the fit
    delay_step_us: int = 100  # no false precision in a delay
    delays_us: tuple[int, ...] = (0, 500, 2000, 8000)  # the delay knob's ladder, for the search and the grid
    saturation: float = 0.98  # a load this share of the full batches' capacity: no P95 to estimate
    # cores Triton's own threads and the load generator take: instances beyond the rest run no faster
    reserved_cores: float = 0.5
    # a calibration run whose P95 is this many SLOs over was saturated: left out of the fit
    saturated_slos: float = 3.0
    # instances per group tried on a server the kit did not start (`tune --url`): it does not say how
    # many cores or GPUs it has, so the search is bounded here (edge boxes: 2 to 8 cores, one GPU)
    remote_instances: int = 4

    # -- rates ---------------------------------------------------------------------------------
    rate_step: float = 1.15  # the rate ladder: the resolution of a throughput figure
    max_steps_down: int = 5  # a config that fails 2x below its first rate is not worth more trials
    # no first rate above what the calibration's closed loop got through: the client shares the
    # machine with the server, which a rate predicted from compute times alone leaves out
    ceiling: bool = True

    # -- the broad screen (tuner/screen.py) -----------------------------------------------------
    # a space of batch x instances this small is screened whole, briefly, before it is refined: a
    # one-knob climb from the user's start can stop at one noisy rung and never see a corner
    screen_space: int = 30
    # share of a round's field kept for the next, of those that held: a round far below the best
    # configs' edges ranks them by little more than noise, so no more than half goes
    screen_keep: float = 0.5
    screen_finalists: int = 2  # configs the screen hands on: one losing run does not drop the runner-up
    screen_raise: float = 1.15 ** 2  # each round's rate over the last one's: two rungs of the ladder
    # of a trial's window a screening run has: it ranks configs against each other in the same
    # minutes, and the finalist's verdicts that follow use full windows
    screen_share: float = 0.5

    # -- noise (tuner/noise.py) ------------------------------------------------------------------
    prior_log_sd: float = 0.2  # repeated runs near capacity on a shared 2-core box: 0.1 to 0.4 (log P95)
    prior_weight: float = 2.0  # the prior counts as this many repeats until the machine's own come in
    min_log_sd: float = 0.03  # a P95 of a few thousand requests is never more exact than this
    clear: float = 2.0  # log SDs from the target at which one run decides (math.inf: never one run)
    runs: int = 3  # runs at most for a majority verdict, and runs pooled in a confirmation
    z: float = 1.64  # one-sided 95%: a candidate's gain in P95 must be this many standard errors
    min_gain: float = 0.05  # and at least this much (log P95), however quiet the machine
    paired: int = 3  # runs a latency challenge takes after its screening run: I, I, C (C I I C)

    # -- what is promised ------------------------------------------------------------------------
    slo_margin: float = 0.1  # share of the SLO every trial holds back, for a minute 10% slower
    pooled: bool = True  # a confirmation pools its runs' requests (False: the majority of its runs)
    # a traffic mix is confirmed over as long as the load test it promises: a long load test meets
    # slower minutes that a few short runs miss (docs/benchmarks.md, "A traffic mix")
    mix_confirm_s: float = 30.0
    mix_run_s: float = 3.0  # one run of a whole traffic mix while searching
    over_share: float = 0.05  # a P95 lets this share of the requests exceed it
    error_margin: float = 0.5  # share of the error bound a confirmation may use: refusals come in bursts
    overload_factors: tuple[float, ...] = (1.5, 3.0)  # a protective queue policy is checked at these x capacity
    overload_goodput: float = 0.9  # ... and must serve this share of the capacity within the SLO there
    default_share: float = 0.5  # of the capacity the default level drains at when interactive levels exist

    # -- the online sidecar (tuner/online.py) ----------------------------------------------------
    # an observation after a change is judged against the one before only at a rate this close:
    # another load says nothing about the change
    online_similar_rate: float = 1.25
    # a mean latency under this share of the SLO is never "worse": far from the SLO, noise moves it
    online_latency_floor: float = 0.5

    @property
    def rate_trials(self) -> int:
        """A confirmation's trials at one rate: its runs, the start's beside each but the last (W S W S W)."""
        return 2 * self.runs - 1

    @property
    def final_trials(self) -> int:
        """Trials kept for the end: the overload checks and a confirmation at two rates."""
        return len(self.overload_factors) + 2 * self.rate_trials


RULES = Rules()
