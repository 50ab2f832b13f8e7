"""What a tuning run leaves behind: the trial log (JSON, CSV), the decision (tuned.yaml), a report.

tuned.yaml sits beside deploy.yaml and overrides the tuned keys of the models it names; the spec
loader applies it (`tritonkit.spec.TUNED_FILE`), so `tritonkit configs` regenerates the tuned
config from then on. Deleting a model's entry, or the file, goes back to deploy.yaml's values.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import yaml

from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.results import SCHEMA
from tritonkit.plots import pyplot
from tritonkit.spec import TUNED_FILE, Spec
from tritonkit.tuner.knobs import Knobs
from tritonkit.tuner.objective import Score, Tuning
from tritonkit.tuner.trials import Trial

CSV_KEYS = ("n", "phase", "label", "rate", "requests", "ok_rps", "p50_ms", "p95_ms", "p99_ms", "error_ratio",
            "mean_batch", "passed", "seconds", "note", "client_p95_ms", "server_ms", "overhead_ms", "stalled_ms",
            "generator_limited", "padding_waste")


def _score(s: Score) -> dict:
    return {"knobs": s.knobs.to_json(), "label": s.knobs.label(), "passed": s.passed,
            "rate": s.rate, "value": None if math.isinf(s.value) else s.value,
            "trial": s.trial.n if s.trial else None,
            # the figure's own P95 and rate: a confirmed one pools its runs (tuner/pooled.py)
            "p95_ms": s.trial.p95_ms if s.trial else None, "ok_rps": s.trial.ok_rps if s.trial else None,
            "runs": [t.n for t in s.runs]}


def _ms(v: float) -> str:
    return "failed" if math.isinf(v) else f"{v:.1f}"


def describe_server(about: dict) -> str:
    """One line naming the server a tune measured: its figures hold for that server only."""
    return f"Triton {about['version']} at {about['url']} ({about['backend']}; {about['started_by']})"


def log_json(model: str, tuning: Tuning, trials: list[Trial], seconds: float, about: dict) -> dict:
    return {
        "schema": SCHEMA, "kind": "tuner/trials", "model": model, "server": about,
        "objective": {"kind": tuning.objective.kind, "slo_p95_ms": tuning.objective.p95_ms,
                      "margin": tuning.objective.margin, "target_p95_ms": round(tuning.objective.target_p95_ms, 3),
                      "rps": tuning.objective.rps, "max_error_ratio": tuning.objective.max_error_ratio},
        "noise": {"p95_log_sd": tuning.noise_log_sd, "repeated_runs": tuning.noise_repeats},
        "speed": tuning.speed,
        "in_flight": tuning.in_flight,
        "bound": tuning.bound,
        "cost_model": tuning.cost_model.to_json() if tuning.cost_model else None,
        "baseline": _score(tuning.baseline), "best": _score(tuning.best), "confirmed": tuning.confirmed,
        "claim_note": tuning.claim_note, "written": tuning.written, "cost_model_predicts": tuning.predicts,
        "best_measured": None if tuning.best_measured is None else
        {"label": tuning.best_measured[0], "rate": tuning.best_measured[1]},
        "differs_because": tuning.differs_because,
        "beside_start": [[None if math.isinf(w) else w, None if math.isinf(b) else b] for w, b in tuning.beside_start],
        "beside_start_verdict": None if not tuning.beside_start else {
            "start_stands": tuning.start_stands_beside, "why": tuning.beside_why},
        "stopped_because": tuning.stopped_because,
        "overload": [t.to_json() for t in tuning.overload],
        "policy_note": tuning.policy_note,
        "trials": [t.to_json() for t in trials], "trial_count": len(trials), "seconds": round(seconds, 1),
    }


def partial_log(model: str, trials: list[Trial], about: dict) -> dict:
    """The trials of a run that was stopped before it chose anything."""
    return {"schema": SCHEMA, "kind": "tuner/trials", "model": model, "server": about, "interrupted": True,
            "trials": [t.to_json() for t in trials], "trial_count": len(trials)}


def write_log(out_dir: Path, log: dict) -> dict[str, Path]:
    out_dir = Path(out_dir)
    files = {"trials.json": out_dir / "trials.json", "trials.csv": out_dir / "trials.csv"}
    write_bytes_atomic(files["trials.json"], json.dumps(log, indent=2, default=str).encode())
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[*CSV_KEYS, "errors"])
    w.writeheader()
    for t in log["trials"]:  # a stopped run's log has the trials too
        w.writerow({**{k: t.get(k) for k in CSV_KEYS}, "errors": json.dumps(t["errors"])})
    write_bytes_atomic(files["trials.csv"], buf.getvalue().encode())
    return files


def write_tuned(spec: Spec, model: str, k: Knobs, about: dict, in_flight: int | None = None) -> Path:
    """Record the decision beside deploy.yaml, keeping other models' entries; the header names the
    server the last decision was measured on. `in_flight`: what the gateway may let in at once
    (`admission_from`), written beside the batching it was measured with."""
    path = spec.path.parent / TUNED_FILE
    data = yaml.safe_load(path.read_text()) if path.exists() else None
    data = data if isinstance(data, dict) and isinstance(data.get("models"), dict) else {"models": {}}
    # The policies are written whatever they are, none included: the overlay replaces deploy.yaml's,
    # so no policy the tuner's overload gate never checked stays in force.
    batching = {"preferred_batch_sizes": k.preferred, "max_queue_delay_us": k.delay_us,
                "default_queue_policy": None if k.queue is None else k.queue.model_dump(),
                "priority_queue_policies": {lv: q.model_dump() for lv, q in sorted(k.level_queues)}}
    entry = {"max_batch_size": k.max_batch, "batching": batching, "instances": {"count": k.instances}}
    entry = entry if k.batching else {"instances": entry["instances"]}
    if k.edges is not None:
        # one TensorRT profile per edge once `tritonkit build` runs again; the clients pad to them now
        entry["build"] = {"bucket_edges": list(k.edges)}
    if in_flight is not None:
        entry["admission"] = {"max_in_flight": in_flight}
    data["models"][model] = entry
    header = ("# Written by `tritonkit tune`: these keys override deploy.yaml's for the models named here.\n"
              "# `tritonkit configs` applies them. Delete a model's entry, or this file, to go back.\n"
              f"# {model}: measured on {describe_server(about)}; a config tuned on one server, backend or\n"
              "# device does not transfer to another (docs/tuning.md, \"Tuning the server you deploy\").\n")
    write_bytes_atomic(path, (header + yaml.safe_dump(data, sort_keys=False)).encode())
    return path


def plot_trials(path: Path, trials: list[Trial], tuning: Tuning) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for phase, marker in (("baseline", "s"), ("calibrate", "x"), ("start", "D"), ("neighbour", "o"),
                          ("incumbent", "P"), ("overload", "v"), ("confirm", "*")):
        pts = [(t.ok_rps, t.p95_ms) for t in trials if t.phase == phase and t.p95_ms is not None]
        if pts:
            ax.scatter(*zip(*pts), marker=marker, label=phase, alpha=0.75)
    ax.axhline(tuning.objective.p95_ms, color="red", linestyle="--", label="SLO P95")
    best = tuning.best.trial
    if best and best.p95_ms is not None:
        ax.scatter([best.ok_rps], [best.p95_ms], s=260, facecolors="none", edgecolors="black", linewidths=2,
                   label="chosen")
    ax.set_xlabel("throughput, ok req/s")
    ax.set_ylabel("P95 latency, ms")
    ax.set_yscale("log")
    ax.set_title("Every trial: P95 against throughput")
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())


def admission_from(tuning: Tuning) -> int | None:
    """The gateway's limit the tuning measured (`tuner/in_flight.py`); None: nothing written, or no
    claim to measure it below."""
    return tuning.in_flight if tuning.written else None


def measured_by(trials: list[Trial]) -> str:
    """Which client measured the trials (perf_analyzer, or asyncio where it could not run)."""
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.engine or "unknown"] = counts.get(t.engine or "unknown", 0) + 1
    return ", ".join(f"{e} ({n} trial{'s' if n != 1 else ''})" for e, n in counts.items()) or "no trial ran"


def write_report(out_dir: Path, model: str, tuning: Tuning, trials: list[Trial], seconds: float,
                 about: dict) -> Path:
    plot_trials(Path(out_dir) / "trials.png", trials, tuning)
    b, w = tuning.baseline, tuning.best

    def line(name: str, s: Score) -> str:
        t = s.trial
        if t is None or t.p95_ms is None:
            return f"| {name} | {s.knobs.label()} | - | - | - |"
        return f"| {name} | {s.knobs.label()} | {t.ok_rps:.0f} | {t.p95_ms:.2f} | {100 * t.error_ratio:.1f}% |"

    cm = tuning.cost_model
    lines = [f"# Tuning {model}", "",
             f"Server: {describe_server(about)}"
             + (f", tuned as {about['tuned_as']}; instances {about['instances']}" if "tuned_as" in about else "")
             + ". The figures below hold for this server, backend and device only.", "",
             f"Objective: {tuning.objective.describe()}.", "",
             "| | config | req/s | P95 ms | errors |", "| --- | --- | --- | --- | --- |",
             *([line("kept", w)] if tuning.kept else [line("before", b), line("after", w)]), "",
             f"Confirmed by a second measurement: {'yes' if tuning.confirmed else 'no'}"
             + (f" ({tuning.claim_note})" if tuning.claim_note else "") + ". "
             f"Search stopped: {tuning.stopped_because}. {len(trials)} trials in {seconds:.0f} s.", "",
             f"Measured by: {measured_by(trials)}.", ""]
    if tuning.beside_start:
        pairs = ", ".join(f"{_ms(w)} vs {_ms(s)}" for w, s in tuning.beside_start)
        lines += [f"Beside the start, at the same rates in the same minutes: P95 {pairs} ms (winner vs start); "
                  + f"{tuning.beside_why}: " + ("the winner stands." if tuning.beat_start else "the start stands."), ""]
    if tuning.best_measured:
        label, rate = tuning.best_measured
        lines += [f"Best measured: {label} held {rate:.0f} req/s. "
                  + (f"Written instead: {w.knobs.label()}, because {tuning.differs_because}."
                     if tuning.differs_because else "It is the config written."), ""]
    if not tuning.predicts:
        lines += ["The cost model could not rank the configs (see the log): the whole space was screened.", ""]
    o = tuning.objective
    if o.margin:
        lines += [f"Margin: every trial had to meet P95 <= {o.target_p95_ms:.3g} ms, the SLO less {o.margin:.0%}, "
                  f"so that the written config still meets {o.p95_ms:g} ms on a slower minute.", ""]
    if tuning.noise_log_sd is not None:
        lines += [f"Noise: the P95 of one config at one rate varied by {tuning.noise_log_sd:.0%} (log standard "
                  f"deviation) from run to run on this machine, from {tuning.noise_repeats} repeated runs; a "
                  "neighbour won only when it beat the incumbent in interleaved runs by more than that.", ""]
    if tuning.speed:
        sp = tuning.speed
        lines += [f"Machine speed: one batch of {sp['batch']} took {sp['start_ms']:.2f} ms at the start of this "
                  f"tune and {sp['end_ms']:.2f} ms at its end ({100 * sp['change']:+.0f}%). Rates measured on this "
                  "machine at another time move with its speed.", ""]
    if tuning.in_flight is not None:
        lines += [f"Gateway limit: {tuning.in_flight} requests in flight (`admission.max_in_flight` in tuned.yaml), "
                  "the largest closed loop of the written config that held the SLO less the margin (the `in_flight` "
                  "trials): under overload Envoy keeps that many in flight, and each waits as they did.", ""]
    limited = [t.n for t in trials if t.generator_limited]
    if limited:
        lines += [f"The load generator, not the server, limited trials {', '.join(map(str, limited))} (see their "
                  "notes); the P95 decided on leaves out the time the generator itself stalled.", ""]
    if cm:
        lines += [f"Cost model from calibration: T(B) = {cm.c_fixed_ms:.3f} ms + B × {cm.c_per_ms:.3f} ms.", ""]
    for o in tuning.overload:
        lines += [f"Overload check of {o.label} at {o.rate:.0f} req/s: {o.ok_rps:.0f} req/s served, "
                  f"P95 of served requests {o.p95_ms if o.p95_ms is not None else '-'} ms, errors {o.errors}.", ""]
    if tuning.policy_note:
        lines += [f"Queue policy: {tuning.policy_note}.", ""]
    lines += ["![trials](trials.png)", "",
              "| # | phase | config | load | req/s | P95 ms | client P95 ms | server mean ms | errors | pass | note |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t in trials:
        p95, client = ("-" if v is None else f"{v:.2f}" for v in (t.p95_ms, t.client_p95_ms))
        server = "-" if t.server_ms is None else f"{t.server_ms:.2f}"
        lines.append(f"| {t.n} | {t.phase} | {t.label} | {t.load} | {t.ok_rps:.0f} | {p95} | {client} | {server} | "
                     f"{100 * t.error_ratio:.1f}% | {'yes' if t.passed else 'no'} | {t.note} |")
    path = Path(out_dir) / "report.md"
    write_bytes_atomic(path, ("\n".join(lines) + "\n").encode())
    return path
