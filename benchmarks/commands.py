"""`tritonkit bench`: the benchmarks (`make bench`), each printed as ratios measured in one run."""

from __future__ import annotations

import argparse
from pathlib import Path

from tritonkit.benchmarks.ablation import SEEDS, run_ablation
from tritonkit.benchmarks.buckets import run_buckets_bench
from tritonkit.benchmarks.cases import CASES
from tritonkit.benchmarks.floor import run_floor_bench
from tritonkit.benchmarks.footprint import run_footprint
from tritonkit.benchmarks.generators import AGREEMENT_ROUNDS, run_bench
from tritonkit.benchmarks.mix_bench import run_mix_bench
from tritonkit.benchmarks.model_analyzer import require_model_analyzer
from tritonkit.benchmarks.overload import APPROACHES, THROTTLE_K, run_overload_bench
from tritonkit.benchmarks.peer_bench import MA_WALL_S, run_peer_bench
from tritonkit.benchmarks.refusal import run_refusal_bench
from tritonkit.benchmarks.remote import run_remote_bench
from tritonkit.benchmarks.routing import BenchSettings, run_routing_bench
from tritonkit.benchmarks.serving import run_serving_bench
from tritonkit.benchmarks.tuner_bench import run_tuner_bench
from tritonkit.benchmarks.versus import read_versus, run_versus, versus_table
from tritonkit.commandline import DEFAULT_REPO, DEFAULT_STATE, say, spec_arg
from tritonkit.configs.loader import load_spec, resolve
from tritonkit.errors import InputError, Problem, raise_flag_problems
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.server_probe import probe_once
from tritonkit.tuner.apply import load_verified
from tritonkit.tuner.commands import noise_args
from tritonkit.tuner.settings import TuneSettings
from tritonkit.tuner.trials import TrialWindow


def cmd_bench(a: argparse.Namespace) -> int:
    if a.what == "generators":
        rounds = AGREEMENT_ROUNDS if a.rounds is None else a.rounds
        raise_flag_problems([("--rounds", rounds >= 1, "measure each engine at least once, e.g. 3")])
        run_bench(a.out, seconds=a.seconds, users=a.users, rate=a.rate, rounds=rounds, log=say)
        say(f"wrote {a.out / 'bench.json'}")
    elif a.what == "tuner":
        s = TuneSettings(p95_ms=a.p95_ms, max_trials=a.max_trials, margin=a.margin, max_trial_s=a.max_trial_s,
                         engine=a.engine)
        rounds = 3 if a.rounds is None else a.rounds
        raise_flag_problems([("--rounds", rounds >= 1, "judge each winner at least once, e.g. 3")])
        spec = load_spec(a.spec, a.repo)
        model = a.model or spec.models[0].name
        traits = probe_once(a.state_dir, say)  # both sides obey the probe, as `tritonkit tune` does
        run_tuner_bench(spec, model, a.repo, a.state_dir, a.out, p95_ms=s.p95_ms, max_trials=s.max_trials,
                        rules=s.rules, window=TrialWindow(max_s=s.max_trial_s, engine=s.engine),
                        rounds=rounds,
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
    elif a.what == "versus":
        rounds = 3 if a.rounds is None else a.rounds
        s = TuneSettings(max_trials=a.max_trials, engine=a.engine)
        raise_flag_problems([("--rounds", rounds >= 1, "judge at least once, e.g. 3"),
                             ("--kit-runs", a.kit_runs >= 1, "tune at least once, e.g. 3"),
                             ("--ma-wall-s", a.ma_wall_s > 0, "give Model Analyzer some time, e.g. 900"),
                             ("--quiet-judge", not a.quiet_judge or a.noise_source,
                              "it stops the noise source before the judge: give --noise-source too"),
                             ("--rejudge-from", not (a.rejudge_from and a.noise_source),
                              "an earlier sitting's picks are judged quietly: leave out --noise-source")])
        if not a.table:
            if not a.rejudge_from:
                require_model_analyzer()
            for case in a.case or list(CASES):
                run_versus(case, a.out / "versus", ma_wall_s=a.ma_wall_s, rounds=rounds, seconds=a.seconds,
                           engine=s.engine, max_trials=s.max_trials, kit_runs=a.kit_runs,
                           model_analyzer_from=a.model_analyzer_from, hold_loads=a.hold_loads,
                           noise=a.noise_source, quiet_judge=a.quiet_judge, rejudge_from=a.rejudge_from, log=say)
            say(f"wrote {a.out / 'versus'}/<case>/bench_versus.json")
        results = read_versus(a.out / "versus")
        if not results:
            raise InputError([Problem(str(a.out / "versus"), "--table", "no case's bench_versus.json under it",
                                      "give the --out of an earlier `tritonkit bench versus`")])
        table = versus_table(results)
        write_bytes_atomic(a.out / "versus" / "versus.md", (table + "\n").encode())
        say(table)
        say(f"wrote {a.out / 'versus' / 'versus.md'}")
    elif a.what == "remote":
        rounds = 3 if a.rounds is None else a.rounds
        raise_flag_problems([("--rounds", rounds >= 1, "judge at least once, e.g. 3")])
        raise_flag_problems([("--bystander-rps", a.bystander_rps >= 0, "give a rate of 0 or more, e.g. 50")])
        run_remote_bench(a.out / "remote", rounds=rounds, seconds=a.seconds, max_trials=a.max_trials,
                         bystander_rps=a.bystander_rps, log=say)
        say(f"wrote {a.out / 'remote' / 'bench_remote.json'}")
    elif a.what == "floor":
        s = TuneSettings(p95_ms=a.p95_ms)
        rounds = 12 if a.rounds is None else a.rounds
        raise_flag_problems([("--rounds", rounds >= 2, "measure at least twice for a spread, e.g. 12")])
        spec = load_spec(a.spec, a.repo)
        run_floor_bench(spec, a.model or spec.models[0].name, a.out, rounds=rounds, p95_ms=s.p95_ms, log=say)
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
        raise_flag_problems([("--runs", a.runs >= 1, "measure each approach at least once, e.g. 3"),
                             ("--throttle-k", a.throttle_k >= 1, "K below 1 refuses what the server accepts; "
                                                                 "use 1 or more, e.g. 2")])
        run_overload_bench(configs, model.name, a.out / "overload_repo", a.state_dir, a.out,
                           seconds=a.seconds, runs=a.runs, throttle_k=a.throttle_k,
                           approaches=tuple(a.approach or APPROACHES), pod=not a.flat_cgroup, log=say)
        say(f"wrote {a.out / 'bench_overload.json'}")
    elif a.what == "buckets":
        raise_flag_problems([("--runs", a.runs >= 1, "measure each way at least once, e.g. 3"),
                             ("--seconds", a.seconds > 0, "use a window of more than 0 s")])
        run_buckets_bench(a.out / "buckets", a.state_dir, seconds=a.seconds, runs=a.runs, log=say)
        say(f"wrote {a.out / 'buckets' / 'bench_buckets.json'}")
    elif a.what == "serving":
        raise_flag_problems([("--max-batch", a.max_batch >= 1, "use a max batch of 1 or more"),
                             ("--threads", a.threads >= 1, "use 1 or more ONNX Runtime threads"),
                             ("--instances", a.instances >= 1, "use 1 or more instances"),
                             ("--seconds", a.seconds > 0, "use a window of more than 0 s")])
        run_serving_bench(a.out / "serving", max_batch=a.max_batch, threads=a.threads, instances=a.instances,
                          seconds=a.seconds, log=say)
        say(f"wrote {a.out / 'serving' / 'bench_serving.json'}")
    elif a.what == "mix":
        rounds = 3 if a.rounds is None else a.rounds
        raise_flag_problems([("--rounds", rounds >= 1, "judge at least once, e.g. 3")])
        run_mix_bench(a.out / "mix", engine=a.engine, max_trials=a.max_trials, rounds=rounds, log=say)
        say(f"wrote {a.out / 'mix' / 'bench_mix.json'}")
    elif a.what == "ablation":
        real = sorted(Path(a.real).glob("*/tune*/trials.json")) if a.real else []
        if a.real and not real:
            raise InputError([Problem(str(a.real), "--real", "no tuning's trials.json under it",
                                      "give the folder `tritonkit bench versus` wrote (out/bench/versus)")])
        run_ablation(a.out / "ablation", real=real, seeds=SEEDS, case=(a.case or [None])[0], engine=a.engine,
                     log=say)
        say(f"wrote {a.out / 'ablation' / 'bench_ablation.json'}")
    elif a.what == "refusal":
        raise_flag_problems([("--runs", a.runs >= 1, "measure each condition at least once, e.g. 3"),
                             ("--rps", a.rate > 0, "a rate to refuse, e.g. 300"),
                             ("--seconds", a.seconds > 0, "use a window of more than 0 s")])
        spec = load_spec(a.spec, a.repo)
        run_refusal_bench(spec, a.model or spec.models[0].name, a.out / "refusal_repo", a.state_dir, a.out,
                          rate=a.rate, seconds=a.seconds, runs=a.runs, log=say)
        say(f"wrote {a.out / 'bench_refusal.json'}")
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
    sp = sub.add_parser("bench", help="benchmarks, printed as ratios measured in one run")
    sp.add_argument("what", choices=["generators", "tuner", "floor", "overload", "refusal", "buckets", "serving",
                                     "footprint", "routing", "peer", "versus", "ablation", "mix", "remote"],
                    help="generators: Locust HTTP vs asyncio gRPC capacity and distortion, and one load through all "
                         "three engines; "
                         "peer: Model Analyzer's quick search (the [peer] extra), then perf_analyzer judging its "
                         "winner against the spec's config side by side; "
                         "versus: the tuner against Model Analyzer from a naive start on built-in cases "
                         "(--case), both winners judged by perf_analyzer; "
                         "tuner: the tuner against an exhaustive grid over the same knobs; "
                         "remote: tune --url against a running server (a second model under steady load), next to "
                         "local tunes with each trial engine, the three winners judged together; "
                         "mix: three models under one traffic mix, tuned alone then together (tune --mix), "
                         "both judged on the mix's scale and load-tested at it; "
                         "ablation: each of the tuner's noise rules switched off, on a simulated noisy world "
                         "(and counted in the real tunings under --real); "
                         "floor: one config's figure measured again and again (how closely two figures "
                         "measured on this box can agree); "
                         "overload: eight ways of refusing load (Triton's queue policies; the gateway at "
                         "Little's law with room for bursts, at L, at the limit measured by closed loops, and "
                         "adaptive below it, in front of no queues, of priority levels and of the policies; "
                         "the client's throttle) at 0.8x to 3x the claim, for the spec's and the tuned config; "
                         "refusal: how fast Envoy's refusal reaches the client, alone and beside a busy "
                         "neighbour, at the chart's weights and at equal ones; "
                         "buckets: variable-width traffic unpadded, padded to the max and to tuned bucket "
                         "edges (waste, mean batch, P95, claim); "
                         "serving: raw ONNX Runtime against the same model served by the kit; "
                         "footprint: install size per extra, idle memory of the server and the tuner sidecar; "
                         "routing: the edge/cloud router over a delayed link (shares, time to switch)")
    spec_arg(sp)
    sp.add_argument("--model", help="tuner, floor, overload, refusal: the model (default: the spec's first)")
    sp.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    sp.add_argument("--max-trials", type=int, default=TuneSettings.max_trials, help="tuner: the tuner's trial budget")
    sp.add_argument("--p95-ms", type=float, help="tuner, floor: the P95 SLO (default: the model's slo.p95_ms)")
    noise_args(sp)
    sp.add_argument("--rounds", type=int, default=None,
                    help="floor: how many times the config's figure is measured (default 12); tuner, versus, "
                         "remote, mix: the judge's rounds (default 3); generators: rounds of the three engines' "
                         "agreement runs (default 3)")
    sp.add_argument("--case", action="append", choices=list(CASES),
                    help="versus: a case to run (repeatable; default: all of them); ablation: the real case to "
                         "tune once per rule switched off")
    sp.add_argument("--real", type=Path,
                    help="ablation: the folder `bench versus` wrote, whose tunings' trials are counted too")
    sp.add_argument("--hold-loads", type=int, default=0,
                    help="versus: 30 s load tests of each confirmed kit winner at its promised rate (default none)")
    sp.add_argument("--kit-runs", type=int, default=1,
                    help="versus: run `tune` this many times per case, every winner judged in the same rounds")
    sp.add_argument("--noise-source", action="store_true",
                    help="versus: run each case beside a process that burns one core in random bursts, about a "
                         "third of the time (a noisy edge node)")
    sp.add_argument("--quiet-judge", action="store_true",
                    help="versus: with --noise-source, stop the source before the judge, so it ranks what each "
                         "side wrote beside the noise rather than the noise of its own runs")
    sp.add_argument("--rejudge-from", type=Path,
                    help="versus: search nothing; judge again, quietly, the picks of an earlier run's folder (or "
                         "bench_versus.json) of each case")
    sp.add_argument("--table", action="store_true",
                    help="versus: run nothing; print the markdown table of every case already under --out "
                         "(also written as versus/versus.md after each run)")
    sp.add_argument("--model-analyzer-from", type=Path,
                    help="versus: Model Analyzer's result from an earlier run's folder (or bench_versus.json) "
                         "instead of a new search")
    sp.add_argument("--ma-wall-s", type=float, default=MA_WALL_S,
                    help="peer: stop Model Analyzer after this many seconds (default: %(default)g)")
    sp.add_argument("--bystander-rps", type=float, default=50.0,
                    help="remote: the steady load on the server's second model during the remote tune (0: idle)")
    sp.add_argument("--out", type=Path, default=Path("out/bench"))
    sp.add_argument("--seconds", type=float, default=5.0, help="steady window of each run")
    sp.add_argument("--users", type=int, default=16, help="closed-loop clients for the capacity runs")
    sp.add_argument("--rps", "--rate", dest="rate", type=float, default=200.0,
                    help="generators: open-loop rate for the distortion runs; refusal: the rate refused")
    sp.add_argument("--max-batch", type=int, default=16, help="serving: the largest batch (also 1 and 8)")
    sp.add_argument("--threads", type=int, default=1, help="serving: ONNX Runtime threads, raw and per instance")
    sp.add_argument("--instances", type=int, default=1, help="serving: instances of the served model")
    sp.add_argument("--runs", type=int, default=3, help="routing: step runs (edge slows down, then recovers); "
                                                                 "refusal: runs per condition; "
                                                                 "overload: runs per approach and load")
    sp.add_argument("--approach", action="append", choices=APPROACHES,
                    help="overload: measure only this approach (repeat for more; default: all eight)")
    sp.add_argument("--throttle-k", type=float, default=THROTTLE_K,
                    help="overload: the client throttle's K, the ratio of requests sent to requests accepted "
                         "it allows (default %(default)g, the SRE book's)")
    sp.add_argument("--flat-cgroup", action="store_true",
                    help="overload: leave the server and the gateways in this process's CPU cgroup instead of "
                         "one per container, weighted by the chart's requests as in a pod")
    sp.add_argument("--requests", type=int, default=300, help="routing: requests per fixed case")
    sp.add_argument("--concurrency", type=int, default=4, help="routing: requests in flight")
    sp.add_argument("--delay-ms", type=float, default=15.0, help="routing: the cloud link's delay, each way")
    sp.add_argument("--phase-s", type=float, default=3.0, help="routing: seconds per phase of a step run")
    sp.set_defaults(func=cmd_bench)
