"""`tritonkit sweep` and `tritonkit tune` (offline and --online)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tritonkit.commandline import DEFAULT_REPO, DEFAULT_STATE, say, spec_arg
from tritonkit.configs.loader import load_spec
from tritonkit.configs.steps import serve_configured
from tritonkit.errors import InputError, flag_problem
from tritonkit.loadtests.commands import FREE_PORTS, load_args, load_from
from tritonkit.server import read_state
from tritonkit.spec import TUNED_FILE, parse_spec
from tritonkit.tuner.knobs import powers_of_two
from tritonkit.tuner.mix import format_mix, tune_mix
from tritonkit.tuner.online import OnlineSettings, run_online
from tritonkit.tuner.rules import RULES
from tritonkit.tuner.run import tune_offline
from tritonkit.tuner.settings import TuneSettings
from tritonkit.tuner.sweep import MAX_BATCH, sweep
from tritonkit.tuner.trials import TrialWindow


def cmd_sweep(a: argparse.Namespace) -> int:
    load = load_from(a)
    spec = load_spec(a.spec, a.repo)
    sizes = powers_of_two(a.max_batch)
    with serve_configured(spec, a.repo, a.state_dir, models=[a.model], ports=FREE_PORTS, log=say) as r:
        say(f"sweep over max batch sizes {sizes}: {load.describe()}")
        files = sweep(r, spec, a.repo, a.model, load, a.out, batch_sizes=sizes, delays_us=a.delay_us,
                      input_data=a.input_data, log=say)
    say(f"report: {files['report.md']}")
    return 0


def cmd_tune(a: argparse.Namespace) -> int:
    s = TuneSettings(p95_ms=a.p95_ms, rps=a.rps, max_trials=a.max_trials, max_errors=a.max_errors,
                     max_batch=a.max_batch, interval_s=a.interval, cooldown_s=a.cooldown, duration_s=a.duration,
                     margin=a.margin, max_trial_s=a.max_trial_s, engine=a.engine)
    if a.mix == bool(a.model):
        raise InputError([flag_problem("--model/--mix", "give one model to tune (--model NAME), or --mix for "
                                                        "every model of the spec's traffic mix together")])
    if a.mix:
        return _tune_mix(a, s)
    if a.online:
        # The sidecar reads the spec for the SLO and the key only: no ONNX file where it runs, so no graph rules.
        spec = parse_spec(a.spec)
        # The server `tritonkit serve` started from here, unless --url names another one.
        local = read_state(a.state_dir)
        url = a.url or (local.grpc if local else "127.0.0.1:8001")
        headers = local.key_headers if local and local.grpc == url else None
        settings = OnlineSettings(interval_s=s.interval_s, cooldown_s=s.cooldown_s, dry_run=a.dry_run)
        run_online(spec, a.model, url, settings, repo=a.repo, p95_ms=s.p95_ms, duration_s=s.duration_s,
                   out_dir=a.out, key_headers=headers, log=say)
        return 0
    repo = a.repo or DEFAULT_REPO
    spec = load_spec(a.spec, repo)  # a model `tritonkit build` prepared is tuned as built
    result = tune_offline(spec, a.model, repo, a.state_dir, a.out, p95_ms=s.p95_ms, rps=s.rps,
                          max_trials=s.max_trials, max_error_ratio=s.max_errors, max_batch=s.max_batch,
                          input_data=a.input_data, margin=s.margin,
                          window=TrialWindow(max_s=s.max_trial_s, engine=s.engine), log=say)
    t = result.tuning
    if t.kept:
        say(f"\nkept: {t.best.knobs.label()} (no other batching held more; see the report)")
    else:
        say(f"\nbefore: {t.baseline.knobs.label()}  ->  after: {t.best.knobs.label()}")
    for name in ("report.md", "trials.json", "tuned.yaml"):
        if name in result.files:
            say(f"wrote {result.files[name]}")
    if not t.confirmed:
        say("no config met the SLO on a second measurement: nothing was changed (see the report)")
        return 1
    return 0


def _tune_mix(a: argparse.Namespace, s: TuneSettings) -> int:
    if a.online:
        raise InputError([flag_problem("--mix", "the traffic mix is tuned offline: drop --online")])
    repo = a.repo or DEFAULT_REPO
    spec = load_spec(a.spec, repo)
    tuning, runs, seconds = tune_mix(spec, repo, a.state_dir, a.out, max_trials=s.max_trials,
                                     margin=s.margin, max_errors=s.max_errors, write_decision=True, log=say)
    say("\n" + format_mix(tuning))
    say(f"{len(runs)} runs of the mix in {seconds:.0f} s; wrote {a.out / 'mix.json'}")
    if not tuning.confirmed:
        say("no scale of the mix held every SLO on a second measurement: nothing was changed")
        return 1
    say(f"wrote {spec.path.parent / TUNED_FILE}: the mix holds x{tuning.scale:.2f} its traffic")
    return 0


def register(sub) -> None:
    sp = sub.add_parser("sweep", help="batch-size sweep with plots and a recommendation")
    load_args(sp, "out/sweep")
    sp.add_argument("--max-batch", type=int, default=MAX_BATCH)
    sp.add_argument("--delay-us", type=int, action="append", help="queue delays to sweep (repeatable)")
    sp.set_defaults(func=cmd_sweep)

    sp = sub.add_parser("tune", help="rewrite config.pbtxt from measured P95: offline search or --online sidecar")
    spec_arg(sp)
    sp.add_argument("--model", help="the model to tune (or --mix)")
    sp.add_argument("--mix", action="store_true",
                    help="offline: every model of the spec's traffic mix together, for the highest common scale "
                         "of the mix at which every SLO holds")
    sp.add_argument("--p95-ms", type=float, help="the P95 SLO (default: the model's slo.p95_ms)")
    sp.add_argument("--rps", type=float, help="offline: the lowest P95 at this rate (default: the highest rate "
                                              "that meets the SLO)")
    sp.add_argument("--max-trials", type=int, default=TuneSettings.max_trials, help="offline: measurement runs at most")
    sp.add_argument("--max-errors", type=float, default=TuneSettings.max_errors,
                    help="offline: error ratio a trial may have")
    sp.add_argument("--max-batch", type=int, help="offline: the largest max batch to try (default: the spec's; "
                                                  "never above the memory plan's bound)")
    noise_args(sp)
    sp.add_argument("--repo", type=Path, help=f"the model repository (offline default: {DEFAULT_REPO}; online: "
                                               "accepted configs are also written there, so a restart keeps them)")
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    sp.add_argument("--out", type=Path, default=Path("out/tune"))
    sp.add_argument("--input-data", type=Path, metavar="FILE|DIR",
                    help="offline: real request data the trials cycle through (perf_analyzer's --input-data "
                         "JSON, or a folder of NAME.npy); default: generated by the spec's rules")
    sp.add_argument("--online", action="store_true", help="watch a live server and adjust the queue delay and "
                                                          "preferred sizes within guardrails")
    sp.add_argument("--url", help="online: Triton's gRPC HOST:PORT (default 127.0.0.1:8001)")
    sp.add_argument("--metrics-url", help="online: accepted for the sidecar; the decisions use the statistics API")
    sp.add_argument("--dry-run", action="store_true", help="online: only log what would change")
    sp.add_argument("--interval", type=float, default=TuneSettings.interval_s,
                    help="online: seconds per observation window")
    sp.add_argument("--cooldown", type=float, default=TuneSettings.cooldown_s,
                    help="online: seconds between two changes")
    sp.add_argument("--duration", type=float, help="online: stop after this many seconds (default: until Ctrl-C)")
    sp.set_defaults(func=cmd_tune)



def noise_args(sp) -> None:
    sp.add_argument("--margin", type=float, default=RULES.slo_margin,
                    help="offline: share of the SLO held back; trials must meet the SLO times (1 - margin) "
                         f"(default {RULES.slo_margin})")
    sp.add_argument("--max-trial-s", type=float, default=TuneSettings.max_trial_s,
                    help="offline: the longest steady window of one trial (each holds about 3000 requests "
                         "at its rate, within this)")
    sp.add_argument("--engine", default=TuneSettings.engine,
                    help="offline: the client that measures each trial: asyncio (default) or perf_analyzer (C++, "
                         "the least CPU beside the server)")
