"""A Triton server the kit did not start, tuned through its API (`tritonkit tune --url`).

The server a user deploys (an NGC image, the native onnxruntime or TensorRT backend, usually a GPU)
is not the kit's bundled CPU server, so its costs are measured where it runs. Everything goes
through Triton's repository API; nothing on the server's disk is read or written:

- `connect` checks, before anything changes, that the server answers, that model control is
  explicit and the key is right (an unload of the shadow's name, which changes nothing when it is
  not loaded), and that the model is loaded; each failure is an InputError naming the flag.
- Candidates are the served config with the tuner's knobs laid over it (`configs.overlay`): the
  backend, tensors, instance kind and GPUs stay as served.
- By default trials run on a shadow copy, `<model>__tune`, loaded with the model's version folder
  sent in the request (read from the local repository), so live traffic keeps its config.
  `--in-place` tunes the served model itself.
- `session` puts the original back and verifies it on every exit: the end, Ctrl-C, an error.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from tritonkit.build_engines.artifacts import read_record
from tritonkit.clients import AccessDeniedError, Client, TritonRequestError
from tritonkit.configs.generate import parse
from tritonkit.configs.loader import check
from tritonkit.configs.overlay import overlaid
from tritonkit.errors import InputError, ServerError, flag_problem
from tritonkit.spec import Spec
from tritonkit.tuner.apply import load_verified
from tritonkit.tuner.knobs import Knobs

SHADOW_SUFFIX = "__tune"
# gRPC carries at most 2 GiB in one message; a load request with more files than half of it is
# refused here, with the way out (--in-place), rather than by the channel.
MAX_SENT_BYTES = 1 << 30
FOLDERS_SENT = ("warmup",)  # besides the version folder: what a served config may refer to


def backend_of(cfg: mc.ModelConfig) -> str:
    return cfg.platform or cfg.backend or "unknown"


def instances_of(cfg: mc.ModelConfig) -> str:
    kinds = [f"{mc.ModelInstanceGroup.Kind.Name(g.kind)} x{g.count}" + (f" gpus {list(g.gpus)}" if g.gpus else "")
             for g in cfg.instance_group]
    return ", ".join(kinds) or "Triton's default"


@dataclass
class RemoteModel:
    """A model as a server the kit did not start serves it, read before tuning changes anything."""

    url: str
    name: str
    version: str  # the server's
    config: mc.ModelConfig  # as Triton reports it
    shadow: str | None = None  # the shadow copy's name; None: tuned in place
    files: dict[str, bytes] = field(default_factory=dict, repr=False)  # sent with the shadow copy

    @property
    def served_name(self) -> str:
        return self.shadow or self.name

    def describe(self) -> dict:
        """What the outputs say about the server tuned."""
        return {"url": self.url, "started_by": "a server the kit did not start", "version": self.version,
                "backend": backend_of(self.config), "instances": instances_of(self.config),
                "tuned_as": f"shadow copy {self.shadow}" if self.shadow else f"{self.name} itself (--in-place)",
                "files_sent_mb": round(sum(map(len, self.files.values())) / 2**20, 1)}


def connect(url: str, model: str, headers: dict[str, str], key_env: str, in_place: bool) -> RemoteModel:
    """Everything checked that can be checked without changing what the server serves."""
    shadow = None if in_place else model + SHADOW_SUFFIX
    with Client(url, "grpc", headers, network_timeout_s=10) as c:
        if not c.live():
            raise InputError([flag_problem("--url", f"no Triton answers on gRPC at {url}: give the server's gRPC "
                                                    "HOST:PORT (8001 by default) and check that it runs")])
        try:  # model control must be explicit, and the key right: an unload of a name that is not loaded
            c.unload(model + SHADOW_SUFFIX)  # changes nothing (a shadow left by a killed tune goes)
        except AccessDeniedError:
            raise InputError([flag_problem("--key-env", f"the server at {url} refused the repository API's key "
                                                        f"(from ${key_env}): set {key_env} to the server's key, "
                                                        "or name the variable that holds it with --key-env")]) \
                from None
        except TritonRequestError as e:
            if "not allowed" in str(e):
                raise InputError([flag_problem("--url", f"the server at {url} does not take model control "
                                                        f"({e}): start tritonserver with "
                                                        "--model-control-mode=explicit (the chart and "
                                                        "`tritonkit serve` do)")]) from None
            raise
        if not c.model_ready(model):
            raise InputError([flag_problem("--model", f"{model!r} is not loaded on the server at {url}: load it "
                                                      "there first, or name a model it serves")])
        return RemoteModel(url, model, c.server_version(), c.config(model), shadow)


def version_files(repo: Path, remote: RemoteModel) -> dict[str, bytes]:
    """The files a shadow copy is loaded with: the model's newest version folder in `repo` (and the
    folders its config may refer to), which must hold what the server serves."""
    folder = Path(repo) / remote.name
    versions = sorted((p for p in folder.glob("[0-9]*") if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    way_out = ("point --repo at the model repository the server serves (what `tritonkit configs` or `tritonkit "
               "build` wrote, or the chart shipped), or tune the served model itself with --in-place")
    if not versions:
        raise InputError([flag_problem("--repo", f"{folder} has no version folder ({folder}/1/...) to load the "
                                                 f"shadow copy {remote.shadow} from: {way_out}")])
    local = folder / "config.pbtxt"
    if local.is_file():
        mine, served = backend_of(parse(local.read_text())), backend_of(remote.config)
        if mine != served:
            raise InputError([flag_problem("--repo", f"{local} is for {mine}, but the server at {remote.url} serves "
                                                     f"{remote.name} with {served}: {way_out}")])
    roots = [versions[-1]] + [folder / f for f in FOLDERS_SENT if (folder / f).is_dir()]
    files = {str(p.relative_to(folder)): p.read_bytes()
             for root in roots for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}
    size = sum(map(len, files.values()))
    if size > MAX_SENT_BYTES:
        raise InputError([flag_problem("--in-place", f"{folder} holds {size / 2**20:.0f} MB, more than one load "
                                                     f"request carries ({MAX_SENT_BYTES / 2**20:.0f} MB): tune the "
                                                     "served model itself with --in-place")])
    return files


def served_knobs(cfg: mc.ModelConfig) -> Knobs:
    """The knobs the server serves now: the start of the search."""
    db = cfg.dynamic_batching if cfg.HasField("dynamic_batching") else None
    count = cfg.instance_group[0].count if cfg.instance_group else 1
    return Knobs(cfg.max_batch_size, db.max_queue_delay_microseconds if db else 0, max(1, count))


def batch_bound(spec: Spec, remote: RemoteModel, repo: Path | None, limit: int | None) -> tuple[int, str]:
    """The largest max batch tried, and why: the flag or the spec, never above what a TensorRT engine
    accepts (its profile, from the kit's build record, else the max batch served now)."""
    m = spec.model(remote.name)
    bound, why = (limit, "--max-batch") if limit else (m.max_batch_size, "the spec's max_batch_size")
    if remote.config.max_batch_size == 0:
        return 0, "the served model has no batch axis"
    if backend_of(remote.config) == "tensorrt_plan":
        record = read_record(Path(repo), remote.name) if repo else None
        engine = record["plan"]["max_batch"] if record else remote.config.max_batch_size
        source = "its build record" if record else "the max batch served now (no build record in --repo)"
        if engine < bound:
            bound, why = engine, f"the TensorRT engine's profile max ({source})"
    return bound, why


class RemoteServer:
    """The LiveServer a remote tune changes: reached over gRPC; it is not the kit's to restart."""

    r = None

    def __init__(self, url: str, headers: dict[str, str]):
        self.url, self.headers = url, headers

    def client(self) -> Client:
        return Client(self.url, "grpc", self.headers, network_timeout_s=120)

    def alive(self, grace_s: float = 0.0) -> bool:
        deadline = time.monotonic() + grace_s
        with Client(self.url, "grpc", network_timeout_s=5) as c:
            while True:
                if c.live():
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.2)

    def restart(self) -> None:
        raise ServerError(f"the server at {self.url} stopped answering during tuning; it is not the kit's to "
                          "restart (its config was only ever changed through the API)")


class ThroughApi:
    """The ConfigTarget of a remote tune: each candidate loaded through the repository API, its
    config the served one with the knobs laid over it, then verified."""

    def __init__(self, server: RemoteServer, remote: RemoteModel):
        self.server, self.remote = server, remote
        self.served_name = remote.served_name

    def config_for(self, candidate: Spec) -> mc.ModelConfig:
        return overlaid(self.remote.config, candidate.model(self.remote.name), self.served_name)

    def put(self, candidate: Spec) -> None:
        check(candidate, check_onnx=False)  # the kit's rules first: the graph need not be on this machine
        with self.server.client() as c:
            load_verified(c, self.served_name, self.config_for(candidate), override=True,
                          files=self.remote.files or None)

    put_back = put

    def before_restart(self, good: Spec) -> None:
        pass  # a server the kit did not start is never restarted here


def put_back_original(server: RemoteServer, remote: RemoteModel, log: Callable[[str], None]) -> None:
    """The served model as it was before tuning, verified field by field; a shadow copy unloaded."""
    with server.client() as c:
        if remote.shadow:
            with contextlib.suppress(TritonRequestError):
                c.unload(remote.shadow)
        else:
            try:
                load_verified(c, remote.name, remote.config, override=True, whole=True)
            except (TritonRequestError, ServerError) as e:
                raise ServerError(f"{remote.name} on {remote.url} does not serve its original config again: "
                                  f"{e}") from None
        if not c.model_ready(remote.name):
            raise ServerError(f"{remote.name} on {remote.url} does not serve its original config again: not ready")
    log(f"{remote.name} on {remote.url}: the original config is in force (verified)"
        + (f"; the shadow copy {remote.shadow} is unloaded" if remote.shadow else ""))


@contextlib.contextmanager
def session(url: str, model: str, headers: dict[str, str], key_env: str, repo: Path | None, in_place: bool,
            log: Callable[[str], None]) -> Iterator[tuple[RemoteServer, RemoteModel]]:
    """Connect, prepare the shadow copy's files, and put the original back whatever happens."""
    remote = connect(url, model, headers, key_env, in_place)
    if in_place:
        log(f"warning: tuning {model} in place on {url}: its live traffic is served by every candidate config "
            "and shares each trial's measurement; the original config is put back at the end")
    else:
        remote.files = version_files(repo, remote) if repo else {}
        if not remote.files:
            raise InputError([flag_problem("--repo", "a shadow copy needs the model's files: give --repo, the "
                                                     "repository the server serves, or tune in place with --in-place")])
    server = RemoteServer(url, headers)
    log(f"tuning {model} on Triton {remote.version} at {url}: {backend_of(remote.config)}, "
        f"{instances_of(remote.config)}, as {remote.describe()['tuned_as']}")
    try:
        yield server, remote
    finally:
        put_back_original(server, remote, log)
