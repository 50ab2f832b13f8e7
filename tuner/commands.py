"""`tritonkit sweep`, `tritonkit tune` (offline and --online) and `tritonkit bench`."""

from __future__ import annotations

import argparse
from pathlib import Path

from tritonkit.benchmarks.model_analyzer import require_model_analyzer
from tritonkit.benchmarks.peer_bench import MA_WALL_S, run_peer_bench
from tritonkit.commandline import DEFAULT_REPO, DEFAULT_STATE, say, spec_arg
from tritonkit.configs.loader import load_spec, resolve
from tritonkit.configs.steps import serve_configured
from tritonkit.errors import InputError, Problem, raise_flag_problems
from tritonkit.loadtests.bench import AGREEMENT_ROUNDS, run_bench
from tritonkit.loadtests.commands import FREE_PORTS, load_args, load_from
from tritonkit.loadtests.footprint import run_footprint
from tritonkit.loadtests.overload import run_overload_bench
from tritonkit.loadtests.probe import known
from tritonkit.loadtests.routing_bench import BenchSettings, run_routing_bench
from tritonkit.loadtests.serving_bench import run_serving_bench
from tritonkit.server import read_state
from tritonkit.spec import parse_spec
from tritonkit.tuner.apply import load_verified
from tritonkit.tuner.bench import run_tuner_bench
from tritonkit.tuner.floor_bench import run_floor_bench
from tritonkit.tuner.online import OnlineSettings, run_online
from tritonkit.tuner.run import tune_offline
from tritonkit.tuner.settings import DEFAULT_MARGIN, TuneSettings
from tritonkit.tuner.sweep import BATCH_SIZES, sweep
from tritonkit.tuner.trials import Probe


def cmd_sweep(a: argparse.Namespace) -> int:
    load = load_from(a)
    spec = load_spec(a.spec, a.repo)
    sizes = [b for b in BATCH_SIZES if b <= a.max_batch]
    with serve_configured(spec, a.repo, a.state_dir, models=[a.model], ports=FREE_PORTS, log=say) as r:
        say(f"sweep over max batch sizes {sizes}: {load.describe()}")
        files = sweep(r, spec, a.repo, a.model, load, a.out, batch_sizes=sizes, delays_us=a.delay_us,
                      input_data=a.input_data, log=say)
    say(f"report: {files['report.md']}")
    return 0


def cmd_tune(a: argparse.Namespace) -> int:
    s = TuneSettings(p95_ms=a.p95_ms, rps=a.rps, max_trials=a.max_trials, max_errors=a.max_errors,
                     max_batch=a.max_batch, interval_s=a.interval, cooldown_s=a.cooldown, duration_s=a.duration,
                     margin=a.margin, max_trial_s=a.max_trial_s)
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
                          input_data=a.input_data, margin=s.margin, probe=Probe(max_s=s.max_trial_s), log=say)
    t = result.tuning
    say(f"\nbefore: {t.baseline.knobs.label()}  ->  after: {t.best.knobs.label()}")
    for name in ("report.md", "trials.json", "tuned.yaml"):
        if name in result.files:
            say(f"wrote {result.files[name]}")
    if not t.confirmed:
        say("no config met the SLO on a second measurement: nothing was changed (see the report)")
        return 1
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    if a.what == "generators":
        rounds = AGREEMENT_ROUNDS if a.rounds is None else a.rounds
        raise_flag_problems([("--rounds", rounds >= 1, "measure each engine at least once, e.g. 3")])
        run_bench(a.out, seconds=a.seconds, users=a.users, rate=a.rate, rounds=rounds, log=say)
        say(f"wrote {a.out / 'bench.json'}")
    elif a.what == "tuner":
        s = TuneSettings(p95_ms=a.p95_ms, max_trials=a.max_trials, margin=a.margin, max_trial_s=a.max_trial_s)
        raise_flag_problems([("--confirmations", a.confirmations >= 1, "confirm each winner at least once, e.g. 3")])
        spec = load_spec(a.spec, a.repo)
        model = a.model or spec.models[0].name
        traits = known(a.state_dir, say)  # both sides obey the probe, as `tritonkit tune` does
        run_tuner_bench(spec, model, a.repo, a.state_dir, a.out, p95_ms=s.p95_ms, max_trials=s.max_trials,
                        margin=s.margin, probe=Probe(max_s=s.max_trial_s), confirmations=a.confirmations,
                        traits=traits, log=say)
        say(f"wrote {a.out / 'bench_tuner.json'}")
    elif a.what == "peer":
        rounds = 3 if a.rounds is None else a.rounds
        raise_flag_problems([("--rounds", rounds >= 1, "judge at least once, e.g. 3"),
                             ("--ma-wall-s", a.ma_wall_s > 0, "give Model Analyzer some time, e.g. 900")])
        require_model_analyzer()
        spec = load_spec(a.spec, a.repo)
        run_peer_bench(spec, a.model or spec.models[0].name, a.out / "peer", p95_ms=a.p95_ms, wall_s=a.ma_wall_s,
                       rounds=rounds, seconds=a.seconds, log=say)
        say(f"wrote {a.out / 'peer' / 'bench_peer.json'}")
    elif a.what == "floor":
        s = TuneSettings(p95_ms=a.p95_ms, margin=a.margin, max_trial_s=a.max_trial_s)
        rounds = 12 if a.rounds is None else a.rounds
        raise_flag_problems([("--rounds", rounds >= 2, "measure at least twice for a spread, e.g. 12")])
        spec = load_spec(a.spec, a.repo)
        run_floor_bench(spec, a.model or spec.models[0].name, a.repo, a.state_dir, a.out, rounds=rounds,
                        p95_ms=s.p95_ms, margin=s.margin, probe=Probe(max_s=s.max_trial_s), log=say)
        say(f"wrote {a.out / 'bench_floor.json'}")
    elif a.what == "overload":
        spec = load_spec(a.spec, a.repo)
        model = spec.model(a.model or spec.models[0].name)
        if model.slo.p95_ms is None:
            raise InputError([Problem(str(a.spec), f"models.{model.name}.slo.p95_ms", "the overload bench counts "
                                      "requests within the SLO", "set slo.p95_ms for the model")])
        written = resolve(spec.as_written(), a.repo)
        configs = {"spec": written}
        if written.model(model.name) != model:
            configs["tuned"] = spec  # tuned.yaml names this model
        run_overload_bench(configs, model.name, a.out / "overload_repo", a.state_dir, a.out,
                           seconds=a.seconds, log=say)
        say(f"wrote {a.out / 'bench_overload.json'}")
    elif a.what == "serving":
        raise_flag_problems([("--max-batch", a.max_batch >= 1, "use a max batch of 1 or more"),
                             ("--threads", a.threads >= 1, "use 1 or more ONNX Runtime threads"),
                             ("--instances", a.instances >= 1, "use 1 or more instances"),
                             ("--seconds", a.seconds > 0, "use a window of more than 0 s")])
        run_serving_bench(a.out / "serving", max_batch=a.max_batch, threads=a.threads, instances=a.instances,
                          seconds=a.seconds, log=say)
        say(f"wrote {a.out / 'serving' / 'bench_serving.json'}")
    elif a.what == "footprint":
        run_footprint(a.out / "footprint", log=say)
        say(f"wrote {a.out / 'footprint' / 'footprint.json'}")
    elif a.what == "routing":
        settings = BenchSettings.from_flags(a.runs, a.requests, a.concurrency, a.delay_ms, a.phase_s)
        # the edge slows down and recovers through the one verified way to change a live config
        run_routing_bench(a.out, settings, lambda c, model, cfg: load_verified(c, model, cfg, override=True),
                          log=say)
        say(f"wrote {a.out / 'bench_routing.json'}")
    return 0


def register(sub) -> None:
    sp = sub.add_parser("sweep", help="batch-size sweep with plots and a recommendation")
    load_args(sp, "out/sweep")
    sp.add_argument("--max-batch", type=int, default=64)
    sp.add_argument("--delay-us", type=int, action="append", help="queue delays to sweep (repeatable)")
    sp.set_defaults(func=cmd_sweep)

    sp = sub.add_parser("tune", help="rewrite config.pbtxt from measured P95: offline search or --online sidecar")
    spec_arg(sp)
    sp.add_argument("--model", required=True)
    sp.add_argument("--p95-ms", type=float, help="the P95 SLO (default: the model's slo.p95_ms)")
    sp.add_argument("--rps", type=float, help="offline: the lowest P95 at this rate (default: the highest rate "
                                              "that meets the SLO)")
    sp.add_argument("--max-trials", type=int, default=TuneSettings.max_trials, help="offline: measurement runs at most")
    sp.add_argument("--max-errors", type=float, default=TuneSettings.max_errors,
                    help="offline: error ratio a trial may have")
    sp.add_argument("--max-batch", type=int, help="offline: the largest max batch to try (default: the spec's; "
                                                  "never above the memory plan's bound)")
    _noise_args(sp)
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

    sp = sub.add_parser("bench", help="benchmarks, printed as ratios measured in one run")
    sp.add_argument("what", choices=["generators", "tuner", "floor", "overload", "serving", "footprint", "routing",
                                     "peer"],
                    help="generators: Locust HTTP vs asyncio gRPC capacity and distortion, and one load through all "
                         "three engines; "
                         "peer: Model Analyzer's quick search (the [peer] extra), then perf_analyzer judging its "
                         "winner against the spec's config side by side; "
                         "tuner: the tuner against an exhaustive grid over the same knobs; "
                         "floor: one config's figure measured again and again (how closely two figures "
                         "measured on this box can agree); "
                         "overload: the spec's and the tuned config at 0.8x, 1.5x and 3x their capacity; "
                         "serving: raw ONNX Runtime against the same model served by the kit; "
                         "footprint: install size per extra, idle memory of the server and the tuner sidecar; "
                         "routing: the edge/cloud router over a delayed link (shares, time to switch)")
    spec_arg(sp)
    sp.add_argument("--model", help="tuner, floor, overload: the model (default: the spec's first)")
    sp.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    sp.add_argument("--max-trials", type=int, default=TuneSettings.max_trials, help="tuner: the tuner's trial budget")
    sp.add_argument("--p95-ms", type=float, help="tuner, floor: the P95 SLO (default: the model's slo.p95_ms)")
    _noise_args(sp)
    sp.add_argument("--confirmations", type=int, default=3,
                    help="tuner: how many times each side's winner is confirmed, for the spread of its figure")
    sp.add_argument("--rounds", type=int, default=None,
                    help="floor: how many times the config's figure is measured (default 12); generators: rounds of "
                         "the three engines' agreement runs (default 3)")
    sp.add_argument("--ma-wall-s", type=float, default=MA_WALL_S,
                    help="peer: stop Model Analyzer after this many seconds (default: %(default)g)")
    sp.add_argument("--out", type=Path, default=Path("out/bench"))
    sp.add_argument("--seconds", type=float, default=5.0, help="steady window of each run")
    sp.add_argument("--users", type=int, default=16, help="closed-loop clients for the capacity runs")
    sp.add_argument("--rate", type=float, default=200.0, help="open-loop rate for the distortion runs")
    sp.add_argument("--max-batch", type=int, default=16, help="serving: the largest batch (also 1 and 8)")
    sp.add_argument("--threads", type=int, default=1, help="serving: ONNX Runtime threads, raw and per instance")
    sp.add_argument("--instances", type=int, default=1, help="serving: instances of the served model")
    sp.add_argument("--runs", type=int, default=3, help="routing: step runs (edge slows down, then recovers)")
    sp.add_argument("--requests", type=int, default=300, help="routing: requests per fixed case")
    sp.add_argument("--concurrency", type=int, default=4, help="routing: requests in flight")
    sp.add_argument("--delay-ms", type=float, default=15.0, help="routing: the cloud link's delay, each way")
    sp.add_argument("--phase-s", type=float, default=3.0, help="routing: seconds per phase of a step run")
    sp.set_defaults(func=cmd_bench)


def _noise_args(sp) -> None:
    sp.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                    help="offline: share of the SLO held back; trials must meet the SLO times (1 - margin) "
                         f"(default {DEFAULT_MARGIN})")
    sp.add_argument("--max-trial-s", type=float, default=TuneSettings.max_trial_s,
                    help="offline: the longest steady window of one trial (each holds about 3000 requests "
                         "at its rate, within this)")
