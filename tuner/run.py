"""`tritonkit tune` (offline): lock the repository, serve the model, search, write the outcome.

Ctrl-C (or any failure) puts back the config the repository had before tuning started, the one
deploy.yaml (and an earlier tuned.yaml) describes, and the trials so far are still written.
On success the tuned config is written last, so its `.last-good` copy is the pre-tuning one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tritonkit.build_engines.plan import serving_max_batch
from tritonkit.configs.generate import generate
from tritonkit.loadtests.server_probe import probe_once
from tritonkit.spec import Spec
from tritonkit.tuner import outputs, remote
from tritonkit.tuner.apply import LiveConfig
from tritonkit.tuner.buckets import model_edge_sets
from tritonkit.tuner.in_flight import measure_in_flight
from tritonkit.tuner.knobs import Knobs, from_spec
from tritonkit.tuner.lock import repository_lock
from tritonkit.tuner.objective import Objective, Tuning
from tritonkit.tuner.offline import Search
from tritonkit.tuner.rules import RULES, Rules
from tritonkit.tuner.settings import TuneSettings, slo_for
from tritonkit.tuner.trials import LocalServer, Trials, TrialWindow


@dataclass
class TuneResult:
    tuning: Tuning
    trials: Trials
    files: dict[str, Path]
    seconds: float


def max_batch_bound(spec: Spec, model: str, limit: int | None = None) -> int:
    """The largest max batch the tuner may try: `limit` (default: the spec's max_batch_size),
    lowered by the memory plan of `tritonkit.build_engines` (the one place for that rule)."""
    m = spec.model(model)
    if m.max_batch_size == 0:
        return 0  # no batch axis: instances are the only knob
    wanted = m.model_copy(update={"max_batch_size": limit or m.max_batch_size})
    return max(1, serving_max_batch(spec, wanted))


def objective_for(spec: Spec, model: str, p95_ms: float | None, rps: float | None,
                  max_error_ratio: float, rules: Rules = RULES) -> Objective:
    """What a tuning aims at: the SLO (the flag's, else the spec's) less `rules.slo_margin`."""
    return Objective(slo_for(spec, model, p95_ms), margin=rules.slo_margin, max_error_ratio=max_error_ratio, rps=rps)


def tune_offline(spec: Spec, model: str, repo: Path, state_dir: Path, out_dir: Path, *,
                 p95_ms: float | None = None, rps: float | None = None,
                 max_trials: int = TuneSettings.max_trials, max_error_ratio: float = TuneSettings.max_errors,
                 max_batch: int | None = None, window: TrialWindow | None = None,
                 write_decision: bool = True, input_data: Path | None = None, rules: Rules = RULES,
                 log: Callable[[str], None] = print) -> TuneResult:
    """`spec` is the command's resolved spec (configs.loader, against `repo`): a model that
    `tritonkit build` prepared is tuned as built."""
    objective = objective_for(spec, model, p95_ms, rps, max_error_ratio, rules)
    bound = max_batch_bound(spec, model, max_batch)
    t0 = time.perf_counter()
    traits = probe_once(state_dir, log)  # what the server does with a bounded queue, probed once per version
    with repository_lock(repo):
        generate(spec, repo)
        server = LocalServer(spec, repo, state_dir, model, log)
        server.start()
        trials = Trials(server, spec, repo, model, slo=objective,
                        window=window or TrialWindow(), log=log,
                        input_data=input_data)
        with server.r.client() as c:
            about = {"url": server.url, "started_by": "the kit's bundled server", "version": c.server_version(),
                     "backend": remote.backend_of(c.config(model))}
        tuning = None
        try:
            search = Search(trials, objective, bound, max_trials, log, traits, rules,
                            edge_sets=bucket_edge_sets(spec, model, input_data, log))
            tuning = _searched(search, from_spec(spec.model(model)))
        finally:
            # Whatever happened, the repository holds the pre-tuning config until the winner is chosen.
            generate(spec, repo, models=[model])
            server.close()
            if tuning is None:
                log("tuning stopped: the pre-tuning config is back in the repository")
                outputs.write_log(out_dir, outputs.partial_log(model, trials.trials, about))
        files = _write(spec, model, tuning, trials, out_dir, time.perf_counter() - t0, about, write_decision)
        if write_decision and tuning.written:
            # what tuned.yaml now says, applied in memory: the decision and the repository agree
            generate(tuning.best.knobs.apply(spec, model), repo)
    return TuneResult(tuning, trials, files, time.perf_counter() - t0)


def tune_remote(spec: Spec, model: str, url: str, out_dir: Path, *, headers: dict[str, str], key_env: str,
                repo: Path | None, in_place: bool = False, p95_ms: float | None = None, rps: float | None = None,
                max_trials: int = TuneSettings.max_trials, max_error_ratio: float = TuneSettings.max_errors,
                max_batch: int | None = None, window: TrialWindow | None = None,
                input_data: Path | None = None, rules: Rules = RULES, write_decision: bool = True,
                log: Callable[[str], None] = print) -> TuneResult:
    """The same search against a server the kit did not start (`tuner/remote.py`): trials on a shadow
    copy (or the model itself with `in_place`), the original config back and verified at the end.
    `spec` is parsed and checked without its ONNX graphs, which need not be on this machine."""
    objective = objective_for(spec, model, p95_ms, rps, max_error_ratio, rules)
    t0 = time.perf_counter()
    with remote.session(url, model, headers, key_env, repo, in_place, log) as (server, served):
        start = remote.served_knobs(served.config)
        bound, why = remote.batch_bound(spec, served, repo, max_batch)
        log(f"  start: {start.label()} (as served); max batch at most {bound} ({why}); "
            f"at most {rules.remote_instances} instances per group")
        if spec.model(model).padding is not None:
            log("  bucket edges: not tuned through --url; the kit's own server tunes them (tune without --url)")
        spec = start.apply(spec, model)  # what the search reads of the model: as served
        live = LiveConfig(server, spec, repo, model, log, target=remote.ThroughApi(server, served))
        trials = Trials(server, spec, repo, model, slo=objective,
                        window=window or TrialWindow(), log=log,
                        input_data=input_data, live=live)
        about = served.describe()
        tuning = None
        try:
            # no queue-stall probe: that needs a server of the kit's own; the report says so
            search = Search(trials, objective, bound, max_trials, log, None, rules, rules.remote_instances)
            tuning = _searched(search, start)
        finally:
            if tuning is None:
                log("tuning stopped")
                outputs.write_log(out_dir, outputs.partial_log(model, trials.trials, about))
    files = _write(spec, model, tuning, trials, out_dir, time.perf_counter() - t0, about, write_decision)
    return TuneResult(tuning, trials, files, time.perf_counter() - t0)


def bucket_edge_sets(spec: Spec, model: str, input_data: Path | None, log: Callable[[str], None]
                     ) -> list[tuple[int, ...]]:
    """The edge sets a tune screens: where the model pads requests drawn from a length distribution
    (tuner/buckets.py). Real request data brings its own lengths, which no distribution describes."""
    m = spec.model(model)
    if m.padding is None:
        return []
    if input_data is not None:
        log("  bucket edges: not tuned, the trials send real request data (--input-data) as it is padded")
        return []
    sets = model_edge_sets(spec, model)
    if not sets:
        log("  bucket edges: not tuned, no padded input has a length distribution (inputs[].lengths)")
    own = tuple(m.build.bucket_edges)
    return [e for e in sets if e != own]  # the spec's own edges are the start's: measured as it is


def _searched(search: Search, start: Knobs) -> Tuning:
    tuning = search.run(start)
    search.speed_check(tuning)  # first: it repeats the calibration's last run while the budget allows
    measure_in_flight(search, tuning)
    return tuning


def _write(spec: Spec, model: str, tuning: Tuning, trials: Trials, out_dir: Path, seconds: float, about: dict,
           write_decision: bool) -> dict[str, Path]:
    files = outputs.write_log(out_dir, outputs.log_json(model, tuning, trials.trials, seconds, about))
    files["report.md"] = outputs.write_report(out_dir, model, tuning, trials.trials, seconds, about)
    if write_decision and tuning.written:
        files["tuned.yaml"] = outputs.write_tuned(spec, model, tuning.best.knobs, about,
                                                  in_flight=outputs.admission_from(tuning))
    return files
