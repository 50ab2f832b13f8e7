"""The one way a config is put in force on a live server, used by the tuner's trials, the sweep,
the tuner bench (through the trials) and the online sidecar:

    apply knobs -> write the config -> reload through model control -> verify what Triton
    reports -> on any failure, restore the last-known-good config (restarting the server if it died)

- `LiveConfig` works from the spec: a candidate is a spec variant (`Knobs.apply`), written by
  `configs.generate` (every rule checked, atomic write, `.last-good` kept) and loaded from the
  repository. Used where the kit owns the repository (offline tuning, the sweep).
- The target says where a config goes (`ConfigTarget`): the kit's repository (`Repository`), the
  API of a server the kit did not start (`tuner.remote.ThroughApi`, a shadow copy or in place), or
  a ModelConfig loaded as it is (`AsServed`: the online sidecar, which may have no repository).
- `load_verified` is the reload-and-verify step every target ends with.

"Last-known-good" is the last config that loaded, matched what was asked, and served.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from tritonkit.clients import Client, TritonRequestError
from tritonkit.configs.generate import generate, parse, write_config
from tritonkit.errors import ServerError
from tritonkit.serving import Running
from tritonkit.spec import Spec
from tritonkit.tuner.knobs import Knobs

C = TypeVar("C", Spec, mc.ModelConfig)  # what a target serves: a spec variant, or a ModelConfig as it is


class LiveServer(Protocol):
    """What LiveConfig needs of the server it changes."""

    r: Running | None

    def alive(self, grace_s: float = 0.0) -> bool: ...

    def restart(self) -> Running: ...


class Served:
    """A server someone else started and owns (the sweep's): it cannot be restarted here."""

    def __init__(self, r: Running):
        self.r = r

    @property
    def url(self) -> str:
        return self.r.endpoints.grpc

    def alive(self, grace_s: float = 0.0) -> bool:
        return self.r.server.alive(grace_s)

    def restart(self) -> Running:
        raise ServerError(f"tritonserver stopped: {self.r.server.failure_reason()}")


def mismatch(asked: mc.ModelConfig, reported: mc.ModelConfig) -> str | None:
    """Why the config Triton reports is not the one asked for (the knobs the kit turns)."""
    fields = {
        "max_batch_size": (asked.max_batch_size, reported.max_batch_size),
        "max_queue_delay_microseconds": (asked.dynamic_batching.max_queue_delay_microseconds,
                                         reported.dynamic_batching.max_queue_delay_microseconds),
        "preferred_batch_size": (list(asked.dynamic_batching.preferred_batch_size),
                                 list(reported.dynamic_batching.preferred_batch_size)),
        "instances": (sum(g.count for g in asked.instance_group), sum(g.count for g in reported.instance_group)),
    }
    if not fields["preferred_batch_size"][0]:
        del fields["preferred_batch_size"]  # none asked: Triton may fill in its own (e.g. [1] at max batch 1)
    bad = [f"{k} {want} (Triton reports {got})" for k, (want, got) in fields.items() if want != got]
    return f"Triton serves a different config: {', '.join(bad)}" if bad else None


def config_diff(before: mc.ModelConfig, after: mc.ModelConfig) -> list[str]:
    """Lines of a served config that differ (an empty list: the same config)."""
    a = json_format.MessageToDict(before, preserving_proto_field_name=True)
    b = json_format.MessageToDict(after, preserving_proto_field_name=True)
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def load_verified(client: Client, model: str, asked: mc.ModelConfig, override: bool,
                  files: dict[str, bytes] | None = None, whole: bool = False) -> None:
    """Reload `model` (with `asked` passed through the API when `override`, else from its file; with
    `files`, the version folder sent along) and check what Triton reports: the knobs the kit turns,
    or with `whole` every field (an original config put back). Raises TritonRequestError (refused)
    or ServerError (mismatch, or not ready)."""
    client.load(model, asked if override else None, files)
    reported = client.config(model)
    if whole:
        diff = config_diff(asked, reported)
        why = f"Triton serves a different config: {'; '.join(diff)}" if diff else None
    else:
        why = mismatch(asked, reported)
    if why is None and not client.model_ready(model):
        why = f"{model} is not ready after its load"
    if why:
        raise ServerError(why)


class ConfigTarget(Protocol[C]):
    """Where a live config goes, and how it is put in force: the kit's repository (`Repository`),
    or the repository API of a server the kit did not start (`tuner/remote.py`)."""

    served_name: str  # the model the load is sent to (a shadow copy has a name of its own)

    def put(self, candidate: C) -> None:
        """Serve `candidate`. The kit's rules refusing it raise InputError before anything changes;
        Triton refusing it, or serving something else, raises TritonRequestError or ServerError."""

    def put_back(self, good: C) -> None:
        """Serve `good` again: it served before, so a refusal now is an error."""

    def before_restart(self, good: C) -> None:
        """The server died: leave `good` where a restart will load it (nothing, where the server
        is not the kit's to restart)."""


class Repository:
    """The kit's own repository: the candidate is written by `configs.generate` (every rule
    checked, atomic write, `.last-good` kept) and loaded from the file."""

    def __init__(self, server: LiveServer, repo: Path, model: str):
        self.server, self.repo, self.model = server, Path(repo), model
        self.served_name = model

    @property
    def config_path(self) -> Path:
        return self.repo / self.model / "config.pbtxt"

    def put(self, candidate: Spec) -> None:
        generate(candidate, self.repo, models=[self.model])
        with self.server.r.client() as c:
            load_verified(c, self.model, parse(self.config_path.read_text()), override=False)

    put_back = put

    def before_restart(self, good: Spec) -> None:
        generate(good, self.repo, models=[self.model])


class Models:
    """A ConfigTarget for several models of the kit's repository changed together (a traffic mix, a
    pipeline's steps): the whole variant written by `configs.generate`, then the models whose config
    changed, and the pipelines that run them, reloaded from their files."""

    served_name = ""  # no one model: the mix's own load says where it goes

    def __init__(self, r: Running, repo: Path, spec: Spec):
        self.r, self.repo, self.in_force = r, Path(repo), spec

    def put(self, candidate: Spec) -> None:
        changed = [m.name for m in candidate.models if m != self.in_force.model(m.name)]
        generate(candidate, self.repo)
        self.in_force = candidate  # what the files say from here, whether the reloads go through or not
        pipelines = [p.name for p in candidate.pipelines if any(s.model in changed for s in p.steps)]
        with self.r.client() as c:
            for name in changed:
                load_verified(c, name, parse((self.repo / name / "config.pbtxt").read_text()), override=False)
        for name in pipelines:
            self.r.load(name)

    put_back = put

    def before_restart(self, good: Spec) -> None:
        generate(good, self.repo)


class AsServed:
    """A ConfigTarget for configs that are ModelConfigs, loaded through the API as they are (the online
    sidecar, which changes the served config in place); with `persist`, an accepted one is also
    written to the model's file in that repository, so that a restart keeps it."""

    def __init__(self, client: Client, model: str, persist: Path | None = None):
        self.client, self.served_name, self.persist = client, model, persist

    def put(self, cfg: mc.ModelConfig) -> None:
        load_verified(self.client, self.served_name, cfg, override=True)
        if self.persist is not None:
            write_config(cfg, Path(self.persist) / self.served_name / "config.pbtxt")

    put_back = put

    def before_restart(self, good: mc.ModelConfig) -> None:
        pass  # the sidecar's server is not the kit's to restart


class Reached:
    """A LiveServer reached through a client only: someone else started it, so it is not restarted here."""

    r = None

    def __init__(self, client: Client):
        self.client = client

    def alive(self, grace_s: float = 0.0) -> bool:
        return self.client.live()

    def restart(self) -> None:
        raise ServerError("the server stopped answering; it is not the kit's to restart")


class LiveConfig(Generic[C]):
    """The config of one model of a live server, changed only through `apply` and `restore`: the
    one owner of what is in force and of the last-known-good config. What a config `C` is depends
    on the target: a spec variant (the kit's repository, `Models`, `tuner.remote.ThroughApi`) or a
    ModelConfig (`AsServed`, the online sidecar)."""

    def __init__(self, server: LiveServer, spec: C, repo: Path | None, model: str,
                 log: Callable[[str], None] = lambda s: None, target: ConfigTarget[C] | None = None):
        self.server, self.model, self.log = server, model, log
        self.target = target or Repository(server, repo, model)
        self.start: C = spec  # what served before any change
        self.good: C = spec  # exactly what served last; the spec's own config to begin with
        self.current: C = spec
        # the knobs behind `good` and `current` where they came from `apply_knobs` (None: the spec's
        # own config, or a spec applied whole): the tuner's trials ask here what is in force
        self.good_knobs: Knobs | None = None
        self.current_knobs: Knobs | None = None
        self.restarts = 0
        self.max_restarts = 3

    @property
    def served_name(self) -> str:
        return self.target.served_name

    def apply(self, candidate: C) -> str | None:
        """Make `candidate` the serving config. None when it serves as asked; otherwise why not
        (and the last-known-good config is serving again). The kit's own rules refusing it is an
        InputError, raised before anything is written."""
        try:
            self.target.put(candidate)
        except (TritonRequestError, ServerError) as e:
            alive = self.server.alive(grace_s=1.0)  # a refusal, or the server dying under the load call?
            if not alive:
                reason = "tritonserver died while loading it"
            elif isinstance(e, TritonRequestError):
                reason = f"Triton refused it: {str(e)[:300]}"
            else:
                reason = str(e)[:300]
            self.log(f"    {reason}; back to the last-known-good config")
            self.restore()
            return reason
        self.current, self.current_knobs = candidate, None
        return None

    def apply_knobs(self, spec: Spec, knobs: Knobs) -> str | None:
        refused = self.apply(knobs.apply(spec, self.model))
        if not refused:
            self.current_knobs = knobs
        return refused

    def reset(self) -> None:
        """Serve the config this LiveConfig started from again, verified, and make it the
        last-known-good (a sweep's end: the spec's own config back)."""
        self.good, self.good_knobs = self.start, None
        self.restore(restart=False)

    def keep(self) -> None:
        """The config in force served a measurement: it is the last-known-good now."""
        self.good, self.good_knobs = self.current, self.current_knobs

    def restore(self, restart: bool = True) -> None:
        """Serve the last-known-good config again (restarting a dead server, if allowed)."""
        self.current, self.current_knobs = self.good, self.good_knobs
        if self.server.alive():
            self.target.put_back(self.good)
            return
        self.target.before_restart(self.good)
        if restart:
            self.restarts += 1
            if self.restarts > self.max_restarts:
                raise ServerError(f"tritonserver died more than {self.max_restarts} times during tuning; the "
                                  "last-known-good config is back in the repository")
            self.log("    tritonserver is gone: restarting it with the last-known-good config")
            self.server.restart()
