"""`tritonkit sweep` and `tritonkit tune` (offline and --online)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
from pathlib import Path

from tritonkit.commandline import DEFAULT_REPO, DEFAULT_STATE, say, spec_arg
from tritonkit.configs.generate import generate
from tritonkit.configs.lengths_flag import with_lengths
from tritonkit.configs.loader import load_spec
from tritonkit.configs.steps import serve_configured
from tritonkit.errors import InputError, flag_problem, input_error
from tritonkit.input_rules import edges_text
from tritonkit.loadtests.commands import FREE_PORTS, lengths_here, load_args, load_from
from tritonkit.server import read_state
from tritonkit.spec import TUNED_FILE, Spec, parse_spec
from tritonkit.tuner.buckets import model_edge_sets
from tritonkit.tuner.knobs import powers_of_two
from tritonkit.tuner.mix import format_mix, tune_mix
from tritonkit.tuner.online import OnlineSettings, run_online
from tritonkit.tuner.rules import RULES
from tritonkit.tuner.run import tune_offline, tune_remote
from tritonkit.tuner.settings import TuneSettings
from tritonkit.tuner.sweep import MAX_BATCH, sweep, sweep_remote
from tritonkit.tuner.trials import TrialWindow


def cmd_sweep(a: argparse.Namespace) -> int:
    load = load_from(a)
    lengths_here(a)
    sizes = powers_of_two(a.max_batch)
    if a.url:  # a server the kit did not start: its rows on a shadow copy, like `tune --url`
        if a.max_rss_mb is not None:
            raise InputError([flag_problem("--max-rss-mb", "a running server's memory is not this machine's to "
                                                           "read: drop it with --url")])
        if a.buckets:
            raise InputError([flag_problem("--buckets", "bucket edges are swept on the kit's own server: drop "
                                                        "--url or --buckets")])
        spec = load_spec(a.spec, None, check_onnx=False)
        if spec.pipeline(a.model) is not None:
            raise InputError([flag_problem("--url", f"{a.model} is a pipeline: a pipeline's sweep runs on the "
                                                    "kit's own server; drop --url")])
        key_env = a.key_env or spec.server.restricted_key.value_env
        say(f"sweep over max batch sizes {sizes}: {load.describe()}")
        with _stopped_by_sigterm():
            files = sweep_remote(a.url, spec, a.repo, a.model, load, a.out, headers=_key_headers(spec, key_env),
                                 key_env=key_env, in_place=a.in_place, batch_sizes=sizes, delays_us=a.delay_us,
                                 input_data=a.input_data, log=say)
        say(f"report: {files['report.md']}")
        return 0
    if a.in_place or a.key_env:
        raise InputError([flag_problem("--in-place" if a.in_place else "--key-env",
                                       "applies to a sweep of a running server (--url): drop it")])
    spec = with_lengths(load_spec(a.spec, a.repo), a.model, a.lengths)
    edges = _swept_edges(spec, a.model, a.buckets, a.input_data)
    with serve_configured(spec, a.repo, a.state_dir, models=[a.model], ports=FREE_PORTS, log=say) as r:
        say(f"sweep over max batch sizes {sizes}"
            + (f" x padding to {', '.join(edges_text(e) for e in edges)}" if edges else "") + f": {load.describe()}")
        files = sweep(r, spec, a.repo, a.model, load, a.out, batch_sizes=sizes, delays_us=a.delay_us,
                      input_data=a.input_data, max_rss_mb=a.max_rss_mb, edge_sets=edges, log=say)
    say(f"report: {files['report.md']}")
    return 0


def _swept_edges(spec: Spec, model: str, counts: list[int] | None, input_data: Path | None
                 ) -> list[tuple[int, ...]] | None:
    """`--buckets`: for each count, the edges that pad least for the model's length distribution."""
    if not counts:
        return None
    m = spec.model(model)
    at = f"models[{spec.models.index(m)}]"
    if bad := [n for n in counts if n < 1]:
        raise InputError([flag_problem("--buckets", f"{bad[0]} buckets: give counts of at least 1, e.g. 1 3")])
    if input_data is not None:
        raise InputError([flag_problem("--buckets", "real request data (--input-data) brings its own lengths: "
                                                    "drop one of the two")])
    if m.padding is None:
        raise input_error(spec.shown, f"{at}.padding", "missing: --buckets pads requests up to bucket edges",
                          "add padding: {} to the model (with crop for outputs that follow the length)")
    sets = model_edge_sets(spec, model, tuple(counts))
    if not sets:
        raise input_error(spec.shown, f"{at}.inputs", "no padded input draws its lengths from a distribution",
                          "give the input lengths: {dist: uniform, low: ..., high: ...}")
    return sets


# The modes of `tritonkit tune`, and the flags that mean something in each: any other flag given is
# refused, never ignored.
MODES = {
    "local": "offline on the kit's own server",
    "remote": "offline against --url",
    "online": "--online",
    "mix": "--mix",
}
APPLIES = {
    "--p95-ms": {"local", "remote", "online"}, "--rps": {"local", "remote"},
    "--max-trials": {"local", "remote", "mix"}, "--max-errors": {"local", "remote", "mix"},
    "--max-batch": {"local", "remote"}, "--margin": {"local", "remote", "mix"},
    "--max-trial-s": {"local", "remote"}, "--engine": {"local", "remote"}, "--input-data": {"local", "remote"},
    "--url": {"remote", "online"}, "--in-place": {"remote"}, "--key-env": {"remote", "online"},
    "--metrics-url": {"online"}, "--dry-run": {"online"}, "--interval": {"online"}, "--cooldown": {"online"},
    "--duration": {"online"}, "--lengths": {"local"},
}


def _given(a: argparse.Namespace) -> list[str]:
    return [flag for flag in APPLIES if getattr(a, flag[2:].replace("-", "_")) not in (None, False)]


def _mode(a: argparse.Namespace) -> str:
    if a.mix == bool(a.model):
        raise InputError([flag_problem("--model/--mix", "give one model to tune (--model NAME), or --mix for "
                                                        "every model of the spec's traffic mix together")])
    if a.mix and a.online:
        raise InputError([flag_problem("--mix", "the traffic mix is tuned offline: drop --online")])
    mode = "mix" if a.mix else "online" if a.online else "remote" if a.url else "local"
    wrong = [flag for flag in _given(a) if mode not in APPLIES[flag]]
    if wrong:
        raise InputError([flag_problem(flag, f"{flag} means nothing to `tune` {MODES[mode]}: it applies "
                                             f"{' or '.join(MODES[m] for m in sorted(APPLIES[flag]))}; drop it")
                          for flag in wrong])
    return mode


def _settings(a: argparse.Namespace) -> TuneSettings:
    values = {"p95_ms": a.p95_ms, "rps": a.rps, "max_trials": a.max_trials, "max_errors": a.max_errors,
              "max_batch": a.max_batch, "interval_s": a.interval, "cooldown_s": a.cooldown,
              "duration_s": a.duration, "margin": a.margin, "max_trial_s": a.max_trial_s, "engine": a.engine}
    return TuneSettings(**{k: v for k, v in values.items() if v is not None})


def cmd_tune(a: argparse.Namespace) -> int:
    mode = _mode(a)
    s = _settings(a)
    if mode == "mix":
        return _tune_mix(a, s)
    if mode == "online":
        # The sidecar reads the spec for the SLO and the key only: no ONNX file where it runs, so no graph rules.
        spec = parse_spec(a.spec)
        # The server `tritonkit serve` started from here, unless --url names another one.
        local = read_state(a.state_dir)
        url = a.url or (local.grpc if local else "127.0.0.1:8001")
        headers = local.key_headers if local and local.grpc == url and not a.key_env else _key_headers(spec, a.key_env)
        settings = OnlineSettings(interval_s=s.interval_s, cooldown_s=s.cooldown_s, dry_run=a.dry_run)
        run_online(spec, a.model, url, settings, repo=a.repo, p95_ms=s.p95_ms, duration_s=s.duration_s,
                   out_dir=a.out, key_headers=headers, log=say)
        return 0
    window = TrialWindow(max_s=s.max_trial_s, engine=s.engine)
    common = {"p95_ms": s.p95_ms, "rps": s.rps, "max_trials": s.max_trials, "max_error_ratio": s.max_errors,
              "max_batch": s.max_batch, "input_data": a.input_data, "rules": s.rules, "window": window, "log": say}
    if mode == "remote":
        # No ONNX graph needs to be here: the server has the model; the spec gives the SLO and the rules.
        spec = load_spec(a.spec, None, check_onnx=False)
        key_env = a.key_env or spec.server.restricted_key.value_env
        with _stopped_by_sigterm():
            result = tune_remote(spec, a.model, a.url, a.out, headers=_key_headers(spec, key_env), key_env=key_env,
                                 repo=a.repo, in_place=a.in_place, **common)
    else:
        repo = a.repo or DEFAULT_REPO
        spec = load_spec(a.spec, repo)  # a model `tritonkit build` prepared is tuned as built
        result = tune_offline(with_lengths(spec, a.model, a.lengths), a.model, repo, a.state_dir, a.out, **common)
        if a.lengths:  # the trials' lengths were this run's: the repository serves the spec's again
            generate(load_spec(a.spec, repo), repo, models=[a.model])
    t = result.tuning
    if t.kept:
        say(f"\nkept: {t.best.knobs.label()} (no other batching held more; see the report)")
    else:
        say(f"\nbefore: {t.baseline.knobs.label()}  ->  after: {t.best.knobs.label()}")
    for name in ("report.md", "trials.json", "tuned.yaml"):
        if name in result.files:
            say(f"wrote {result.files[name]}")
    if t.written and not t.confirmed:
        say("the winner beat the start beside it, but no rate it was measured at again was confirmed within "
            f"the trials left: it is written, {t.claim_note or 'without a confirmed claim'} (see the report)")
    elif not t.confirmed:
        say("no config beat the start, and the start held no rate on a second measurement: nothing was "
            "changed (see the report)")
        return 1
    return 0


def _key_headers(spec, key_env: str | None) -> dict[str, str]:
    """The repository API's key header, its value from the environment (never from a file)."""
    key = spec.server.restricted_key
    value = os.environ.get(key_env or key.value_env, "")
    return {key.header: value} if value else {}


@contextlib.contextmanager
def _stopped_by_sigterm():
    """SIGTERM (a Job's deadline, `kill`) unwinds like Ctrl-C, so the original config goes back."""
    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _tune_mix(a: argparse.Namespace, s: TuneSettings) -> int:
    repo = a.repo or DEFAULT_REPO
    spec = load_spec(a.spec, repo)
    tuning, runs, seconds = tune_mix(spec, repo, a.state_dir, a.out, max_trials=s.max_trials,
                                     rules=s.rules, max_errors=s.max_errors, write_decision=True, log=say)
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
    sp.add_argument("--buckets", type=int, nargs="+", metavar="N",
                    help="for a model that pads (padding, inputs[].lengths): sweep each row padded to the "
                         "least-padding edges of N buckets, for each N given (1: everything to the max)")
    sp.add_argument("--max-rss-mb", type=float, help="recommend only settings whose server peak RSS (stubs "
                                                     "included) stays under this, less 20%% headroom (local only)")
    sp.add_argument("--url", help="sweep a running Triton the kit did not start (gRPC HOST:PORT), through its "
                                  "repository API, on a shadow copy of the model (files from --repo)")
    sp.add_argument("--in-place", action="store_true", help="with --url: sweep the served model itself, not a "
                                                            "shadow copy")
    sp.add_argument("--key-env", metavar="VAR", help="with --url: the environment variable holding the repository "
                                                     "API's key (default: the spec's server.restricted_key.value_env)")
    sp.set_defaults(func=cmd_sweep)

    # Defaults stay None here, so that a flag given in a mode it means nothing in can be told from
    # one left out (cmd_tune refuses it); TuneSettings fills in the defaults.
    sp = sub.add_parser("tune", help="rewrite config.pbtxt from measured P95: offline search (on the kit's own "
                                     "server, or --url any running Triton) or --online sidecar")
    spec_arg(sp)
    sp.add_argument("--model", help="the model to tune (or --mix)")
    sp.add_argument("--mix", action="store_true",
                    help="offline: every model of the spec's traffic mix together, for the highest common scale "
                         "of the mix at which every SLO holds")
    sp.add_argument("--p95-ms", type=float, help="the P95 SLO (default: the model's slo.p95_ms)")
    sp.add_argument("--rps", type=float, help="offline: the lowest P95 at this rate (default: the highest rate "
                                              "that meets the SLO)")
    sp.add_argument("--max-trials", type=int, help=f"offline: measurement runs at most (default "
                                                   f"{TuneSettings.max_trials}; a model whose bucket edges "
                                                   "are tuned gets two more per edge set and three)")
    sp.add_argument("--max-errors", type=float, help=f"offline: error ratio a trial may have (default "
                                                     f"{TuneSettings.max_errors})")
    sp.add_argument("--max-batch", type=int, help="offline: the largest max batch to try (default: the spec's; "
                                                  "never above the memory plan's bound or a TensorRT engine's profile)")
    noise_args(sp, defaults=False)
    sp.add_argument("--repo", type=Path, help=f"the model repository (offline default: {DEFAULT_REPO}; with --url: "
                                               "the one the server serves, whose files load the shadow copy; "
                                               "online: accepted configs are also written there)")
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    sp.add_argument("--out", type=Path, default=Path("out/tune"))
    sp.add_argument("--input-data", type=Path, metavar="FILE|DIR",
                    help="offline: real request data the trials cycle through (perf_analyzer's --input-data "
                         "JSON, or a folder of NAME.npy); default: generated by the spec's rules")
    sp.add_argument("--lengths", action="append", metavar="NAME=DIST:...",
                    help="offline, the kit's own server: the trials' length distribution for an input "
                         "(repeatable), in place of the spec's lengths: NAME=uniform:LOW:HIGH, "
                         "NAME=loguniform:LOW:HIGH or NAME=histogram:LEN=WEIGHT,LEN=WEIGHT")
    sp.add_argument("--url", help="Triton's gRPC HOST:PORT. Offline: tune that running server (a server the kit did "
                                  "not start: an NGC image, the chart's) through its repository API, on a shadow "
                                  "copy of the model; online: the server to watch (default 127.0.0.1:8001)")
    sp.add_argument("--in-place", action="store_true",
                    help="with --url: tune the served model itself, not a shadow copy (its live traffic sees every "
                         "candidate); for models too large to send, or with no repository here")
    sp.add_argument("--key-env", metavar="VAR", help="with --url or --online: the environment variable holding the "
                                                     "repository API's key (default: the spec's "
                                                     "server.restricted_key.value_env)")
    sp.add_argument("--online", action="store_true", help="watch a live server and adjust the queue delay and "
                                                          "preferred sizes within guardrails")
    sp.add_argument("--metrics-url", help="online: accepted for the sidecar; the decisions use the statistics API")
    sp.add_argument("--dry-run", action="store_true", help="online: only log what would change")
    sp.add_argument("--interval", type=float, help=f"online: seconds per observation (default "
                                                   f"{TuneSettings.interval_s:g})")
    sp.add_argument("--cooldown", type=float, help=f"online: seconds between two changes (default "
                                                   f"{TuneSettings.cooldown_s:g})")
    sp.add_argument("--duration", type=float, help="online: stop after this many seconds (default: until Ctrl-C)")
    sp.set_defaults(func=cmd_tune)


def noise_args(sp, defaults: bool = True) -> None:
    """The trial flags `tune` and the benches share; `defaults` False leaves them None when not given."""
    sp.add_argument("--margin", type=float, default=RULES.slo_margin if defaults else None,
                    help="offline: share of the SLO held back; trials must meet the SLO times (1 - margin) "
                         f"(default {RULES.slo_margin})")
    sp.add_argument("--max-trial-s", type=float, default=TuneSettings.max_trial_s if defaults else None,
                    help="offline: the longest steady window of one trial (each holds about 3000 requests "
                         f"at its rate, within this; a confirmation run takes all of it; default "
                         f"{TuneSettings.max_trial_s:g})")
    sp.add_argument("--engine", default=TuneSettings.engine if defaults else None,
                    help="offline: the client that measures each trial: perf_analyzer (default: C++, the least "
                         "CPU beside the server; asyncio where it cannot send a load) or asyncio")
