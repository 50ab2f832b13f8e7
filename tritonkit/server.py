"""Start and stop a real `tritonserver` on this machine.

The binary comes from `$TRITONSERVER` or PATH when the user has one, else from the `nvidia-pytriton`
wheel (Triton 2.51, python backend only). The wheel keeps one python-backend stub per Python version,
and the backend looks for its stub beside `libtriton_python.so`, so the kit lays out a backend folder
of its own under the state dir instead of writing into site-packages. Which backends an install has
(`Install.backends`) is read from its backend folder, once, here: `runtime: auto` asks it.

A server is started with the models it serves (`--load-model`), so that Triton loads them before
its endpoints answer: with `--strict-readiness`, ready means every one of them is ready.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tritonkit.errors import ServerError
from tritonkit.files import copy_file_atomic, write_bytes_atomic
from tritonkit.spec import ServerSpec

STATE_FILE = "server.json"


class CrashedAtStart(ServerError):
    """tritonserver was killed by a signal while loading its models, and refused none of them."""


# The python backend's shared-memory region per stub, first size and each growth. Triton's own
# 1 MB grows a step at a time as batched tensors of a few MB arrive together, and on 2.51 that
# growth under concurrent requests can take the server down (SIGSEGV, boost lock_exception; Triton
# issue 8882). Pages of /dev/shm are only used as written, so a larger region costs nothing idle.
PYTHON_SHM_BYTES = 64 * 1024 * 1024
# A tritonserver killed by a signal while its models load, none of them refused, is started once
# more: 2.51's python backend can abort (a boost lock_exception) when several stubs start together
# on a busy box, a race rather than anything the config or the user can fix.
START_TRIES = 2
DEFAULT_BACKEND_DIR = Path("/opt/tritonserver/backends")  # where a tritonserver looks without --backend-directory


@dataclass(frozen=True)
class Install:
    binary: Path
    backend_dir: Path | None  # None: the binary's own default (DEFAULT_BACKEND_DIR)
    cache_dir: Path | None
    lib_dirs: tuple[Path, ...] = ()
    bundled: bool = False  # the nvidia-pytriton wheel's server (python backend only, laid out by prepare_backends)

    @property
    def fingerprint(self) -> str:
        """Which server this is without starting it: what a probe's result is cached under."""
        st = self.binary.stat()
        return f"{self.binary.resolve()}:{st.st_size}:{int(st.st_mtime)}"

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends this server can load: each `<backend dir>/<name>/libtriton_<name>.so`."""
        root = self.backend_dir or DEFAULT_BACKEND_DIR
        try:
            found = [d.name for d in root.iterdir() if (d / f"libtriton_{d.name}.so").is_file()]
        except OSError:
            return ()
        return tuple(sorted(found))

    def has_backend(self, name: str) -> bool:
        return name in self.backends

    def describe(self) -> str:
        kind = "bundled with nvidia-pytriton" if self.bundled else "a full build"
        where = self.backend_dir or DEFAULT_BACKEND_DIR
        return f"{self.binary} ({kind}); backends in {where}: {', '.join(self.backends) or 'none'}"


@dataclass
class Endpoints:
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    key_header: str = ""
    key_value: str = field(default="", repr=False)
    pid: int = 0

    @property
    def http(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def key_headers(self) -> dict[str, str]:
        """Headers for the restricted model-repository API (load/unload)."""
        return {self.key_header: self.key_value} if self.key_header else {}


def _bundle_root() -> Path | None:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def find_install() -> Install:
    explicit = os.environ.get("TRITONSERVER")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise ServerError(f"TRITONSERVER={explicit} is not an executable file "
                              "(fix: point it at a tritonserver binary, or unset it to use the bundled one)")
        return _full_install(Path(explicit))
    on_path = _which("tritonserver")
    if on_path:
        return _full_install(Path(on_path))
    root = _bundle_root()
    if root is None or not (root / "tritonserver/bin/tritonserver").exists():
        raise ServerError("no tritonserver found: none on PATH and the nvidia-pytriton wheel is not installed "
                          "(fix: run `make setup`, or put tritonserver on PATH)")
    dist = root / "tritonserver"
    return Install(dist / "bin/tritonserver", dist / "backends", dist / "caches",
                   (root.parent / "nvidia_pytriton.libs",), bundled=True)


def _full_install(binary: Path) -> Install:
    """A tritonserver of the user's: its backends are in `<root>/backends` beside `<root>/bin/tritonserver`
    (an NGC image's /opt/tritonserver, an unpacked release) when that folder exists, else in the default."""
    beside = binary.resolve().parent.parent / "backends"
    return Install(binary, beside if beside.is_dir() else None, None)


def _which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


def prepare_backends(install: Install, state_dir: Path) -> Install:
    """Copy the bundled backend and cache into state_dir, with this Python's stub beside the backend."""
    if not install.bundled:
        return install
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = install.binary.parent.parent / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise ServerError(f"the bundled tritonserver has no python-backend stub for Python {version} "
                          "(fix: use Python 3.8-3.13, or put a tritonserver with its backends on PATH)")
    backends = state_dir / "tritonserver" / "backends"
    py = backends / "python"
    for f in ("libtriton_python.so", "triton_python_backend_utils.py"):
        copy_file_atomic(install.backend_dir / "python" / f, py / f)
    copy_file_atomic(stub, py / "triton_python_backend_stub")
    (py / "triton_python_backend_stub").chmod(0o755)
    caches = state_dir / "tritonserver" / "caches"
    cache_lib = Path("local") / "libtritoncache_local.so"
    copy_file_atomic(install.cache_dir / cache_lib, caches / cache_lib)
    return Install(install.binary, backends, caches, install.lib_dirs, bundled=True)


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _stub_env(install: Install) -> dict[str, str]:
    """The stub embeds libpython: point it at this interpreter's libpython and site-packages, so
    the model code sees the same numpy and onnxruntime as the kit."""
    env = os.environ.copy()
    libdirs = [str(d) for d in install.lib_dirs]
    libpython_dir = sysconfig.get_config_var("LIBDIR")
    if libpython_dir and Path(libpython_dir, sysconfig.get_config_var("LDLIBRARY") or "").exists():
        libdirs.insert(0, libpython_dir)
    if env.get("LD_LIBRARY_PATH"):
        libdirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(libdirs)
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = ":".join(dict.fromkeys(paths))
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


# A small process that blocks reading a pipe whose only writer is the kit process. The kernel
# closes the pipe however the kit ends (exit, SIGKILL, the OOM killer); the watchdog then kills
# the server's whole process group, python-backend stubs included, so no server outlives the kit.
WATCHDOG = """
import os, signal, sys
while os.read(0, 1):
    pass
try:
    os.killpg(int(sys.argv[1]), signal.SIGKILL)
except OSError:
    pass
"""


def stop_group(proc: subprocess.Popen, timeout: float) -> int | None:
    """Stop a session leader started here by its own pid (SIGTERM, then SIGKILL after `timeout`),
    then its whole process group, which reaches children a killed leader left behind. Its exit code."""
    pid = proc.pid
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            proc.wait(5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    return proc.returncode


SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"  # the python backend's, one per model instance


def shm_regions(pgid: int) -> set[str]:
    """The python backend's shared-memory regions in use by process group `pgid`: each stub is
    started with its region's name. A server that shuts down removes its own; one killed (or one
    whose stubs were) leaves them in /dev/shm, where they stay until the machine restarts."""
    import psutil

    regions = set()
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(p.pid) == pgid:
                regions |= {arg for arg in p.info["cmdline"] or () if arg.startswith(SHM_PREFIX)}
    return regions


def watch_group(pgid: int) -> int:
    """Start the watchdog of process group `pgid`; returns the pipe's write end, held until stop()."""
    read_end, write_end = os.pipe()  # not inherited by other children (PEP 446)
    try:
        subprocess.Popen([sys.executable, "-I", "-S", "-c", WATCHDOG, str(pgid)], stdin=read_end,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    finally:
        os.close(read_end)
    return write_end


# What the server's log says about the models it loads at start (Triton 2.51's wording).
_STAMP = re.compile(r"^[IWEF]\d{4} (\d\d):(\d\d):(\d\d(?:\.\d+)?) ")
_LOADING = re.compile(r"\] \"loading: (.+):\d+\"$")
_LOADED = re.compile(r"\] \"successfully loaded '(.+?)'")
_FAILED = re.compile(r"\] \"failed to load '(.+?)' version \d+: (.*?)\"?$")
# error lines on every CPU-only machine, never a reason a server stopped
_BENIGN = ("CudaDriverHelper has not been initialized",)


def _seconds(line: str) -> float | None:
    m = _STAMP.match(line)
    return None if m is None else int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])


class LocalTriton:
    """One tritonserver process with explicit model control, started with `models` loaded (Triton
    loads them before its endpoints answer, so it is ready only when they are; more are loaded
    later through the API). Use as a context manager, or call start() and stop(). stop() signals
    the server by its own pid, then sweeps its process group so that no python-backend stub
    outlives it."""

    def __init__(self, repository: Path, server: ServerSpec, state_dir: Path, *, use_cache: bool = False,
                 http_port: int | None = None, grpc_port: int | None = None, metrics_port: int | None = None,
                 log_verbose: int = 0, cpus: set[int] | None = None, restricted: bool = True,
                 models: Sequence[str] = ()):
        self.repository = Path(repository).resolve()
        self.models = tuple(models)  # loaded at start, in this order (a pipeline after its models)
        # False only for a peer tool that loads models itself and cannot send the key header (Model
        # Analyzer's remote mode)
        self.restricted = restricted
        self.cpus = cpus  # pin the server (and the backend stubs it starts later) to these cores
        self.server = server
        self.state_dir = Path(state_dir).resolve()
        self.use_cache = use_cache
        self.log_verbose = log_verbose
        self._ports = {"http_port": http_port if http_port is not None else server.http_port,
                       "grpc_port": grpc_port if grpc_port is not None else server.grpc_port,
                       "metrics_port": metrics_port if metrics_port is not None else server.metrics_port}
        self.proc: subprocess.Popen | None = None
        self._watchdog: int | None = None  # see WATCHDOG
        self.endpoints: Endpoints | None = None
        self.log_path = self.state_dir / "tritonserver.log"

    # -- start -------------------------------------------------------------------------------
    def _choose_ports(self) -> dict[str, int]:
        host = self.server.host
        chosen: dict[str, int] = {}
        for key, port in self._ports.items():
            if port == 0:
                port = free_port(host)
                while port in chosen.values():
                    port = free_port(host)
            elif not _port_free(host, port):
                raise ServerError(f"port {port} (server.{key}) is already in use on {host} "
                                  f"(fix: stop what uses it, or set server.{key} / --{key.replace('_', '-')} to "
                                  "another port, 0 for a free one)")
            chosen[key] = port
        return chosen

    def command(self, install: Install, ports: dict[str, int], key: tuple[str, str]) -> list[str]:
        restricted = f"model-repository:{key[0]}={key[1]}"
        cmd = [
            str(install.binary),
            f"--model-repository={self.repository}",
            "--model-control-mode=explicit",
            f"--http-address={self.server.host}", f"--http-port={ports['http_port']}",
            f"--grpc-address={self.server.host}", f"--grpc-port={ports['grpc_port']}",
            f"--metrics-address={self.server.host}", f"--metrics-port={ports['metrics_port']}",
            "--allow-metrics=true", "--allow-gpu-metrics=false", "--allow-cpu-metrics=true",
            "--metrics-config=summary_latencies=true",
            "--strict-readiness=true",
            "--exit-timeout-secs=10",
            f"--log-verbose={self.log_verbose}",
            f"--backend-config=python,shm-default-byte-size={PYTHON_SHM_BYTES}",
            f"--backend-config=python,shm-growth-byte-size={PYTHON_SHM_BYTES}",
        ]
        cmd += [f"--load-model={name}" for name in self.models]
        if self.restricted:
            cmd += [f"--http-restricted-api={restricted}", f"--grpc-restricted-protocol={restricted}"]
        if install.backend_dir:
            cmd.append(f"--backend-directory={install.backend_dir}")
        if install.cache_dir:
            cmd.append(f"--cache-directory={install.cache_dir}")
        if self.use_cache:
            cmd.append(f"--cache-config=local,size={self.server.response_cache_mb * 1024 * 1024}")
        return cmd

    def start(self) -> Endpoints:
        for attempt in range(1, START_TRIES):
            try:
                return self._start_once()
            except CrashedAtStart:
                # the crashed server's log stays beside the next one's, for its reason
                copy_file_atomic(self.log_path, self.log_path.with_name(f"tritonserver.crashed-{attempt}.log"))
        return self._start_once()

    def _start_once(self) -> Endpoints:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        install = prepare_backends(find_install(), self.state_dir)
        ports = self._choose_ports()
        key = (self.server.restricted_key.header,
               os.environ.get(self.server.restricted_key.value_env) or secrets.token_urlsafe(24))
        cmd = self.command(install, ports, key)
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child for its whole life
        try:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=_stub_env(install), start_new_session=True)
        finally:
            log.close()
        if self.cpus:
            os.sched_setaffinity(self.proc.pid, self.cpus)  # before any model loads: the stubs inherit it
        self._watchdog = watch_group(self.proc.pid)
        self.endpoints = Endpoints(self.server.host, ports["http_port"], ports["grpc_port"], ports["metrics_port"],
                                   key[0], key[1], self.proc.pid)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self._write_state()
        return self.endpoints

    def _wait_ready(self) -> None:
        """Until /v2/health/ready answers 200: the server is up and (strict readiness) every model
        it loaded at start is ready. A model that fails to load makes tritonserver exit."""
        import urllib.error
        import urllib.request

        url = f"http://{self.endpoints.http}/v2/health/ready"
        deadline = time.monotonic() + self.server.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                crashed = self.proc.returncode < 0 and not self.failed_models()
                raise (CrashedAtStart if crashed else ServerError)(self._start_failure())
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):  # HTTPError (not ready) included
                pass
            time.sleep(0.05)
        loaded = self.load_times()
        pending = [n for n in self.models if n not in loaded]
        still = f"; still loading {', '.join(pending)}" if pending else ""
        raise ServerError(f"tritonserver was not ready within {self.server.startup_timeout_s:.0f} s{still} "
                          f"(fix: raise server.startup_timeout_s; log: {self.log_path})")

    def _start_failure(self) -> str:
        """Why the server exited while starting: each model that failed to load with Triton's reason
        (tritonserver exits when a --load-model fails), else the log's most telling line."""
        code = self.proc.returncode
        failed = self.failed_models()
        named = [n for n in self.models if n in failed] + [n for n in failed if n not in self.models]
        if named:
            why = "; ".join(f"model {n!r} failed to load: {failed[n]}" for n in named)
            return f"{why} (tritonserver exited at start with code {code}; server log: {self.log_path})"
        return (f"tritonserver exited with code {code} while starting: {self.failure_reason()} "
                f"(full log: {self.log_path})")

    def _log_lines(self) -> list[str] | None:
        try:
            return [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return None

    def failed_models(self) -> dict[str, str]:
        """Models the log says failed to load, with Triton's reason (the first for each)."""
        failed: dict[str, str] = {}
        for ln in self._log_lines() or []:
            m = _FAILED.search(ln)
            if m:  # a python backend's reason goes on with its traceback (escaped newlines): its first line
                failed.setdefault(m[1], m[2].split("\\n")[0].strip()[:400])
        return failed

    def load_times(self) -> dict[str, float | None]:
        """Each model the log says loaded, with the seconds from `loading` to `successfully loaded`
        (None where a stamp is missing)."""
        started: dict[str, float | None] = {}
        took: dict[str, float | None] = {}
        for ln in self._log_lines() or []:
            if m := _LOADING.search(ln):
                started[m[1]] = _seconds(ln)
            elif m := _LOADED.search(ln):
                t0, t1 = started.get(m[1]), _seconds(ln)
                took[m[1]] = None if t0 is None or t1 is None else (t1 - t0) % 86400
        return took

    def failure_reason(self) -> str:
        """The most telling line of the server log: tritonserver's last `error:` (what it exits
        with), else its first error line, else its last line."""
        lines = self._log_lines()
        if lines is None:
            return "no log"
        fatal = [ln for ln in lines if ln.startswith("error:")]
        errors = [ln for ln in lines if (ln.startswith("E") or "error" in ln.lower())
                  and not any(b in ln for b in _BENIGN)]
        return (fatal[-1:] or errors or lines or ["empty log"])[0][:400]

    def _write_state(self) -> None:
        data = json.dumps(asdict(self.endpoints) | {"repository": str(self.repository)}, indent=2).encode()
        write_bytes_atomic(self.state_dir / STATE_FILE, data)
        (self.state_dir / STATE_FILE).chmod(0o600)  # it holds the repository-API key

    # -- stop --------------------------------------------------------------------------------
    def alive(self, grace_s: float = 0.0) -> bool:
        """Is the server running? With `grace_s`, a server that is dying (a client already saw its
        socket close) is given that long to exit, so that its death is not taken for an answer."""
        if self.proc is None:
            return False
        if grace_s:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace_s)
        return self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None:
            return
        # The server was its own session leader, so its group id is its pid: the group's kill
        # reaches stubs left behind by a server that was killed rather than shut down.
        regions = shm_regions(self.proc.pid)
        stop_group(self.proc, timeout)
        for name in regions:  # what a killed group left behind; a clean shutdown removed them already
            (SHM_DIR / name).unlink(missing_ok=True)
        if self._watchdog is not None:  # its job is done: let it exit
            os.close(self._watchdog)
            self._watchdog = None
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)
        self.proc = None

    def __enter__(self) -> LocalTriton:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def read_state(state_dir: Path) -> Endpoints | None:
    """Endpoints of a server started by `tritonkit serve` from this folder, if it still runs."""
    path = Path(state_dir) / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    data.pop("repository", None)
    ep = Endpoints(**data)
    try:
        os.kill(ep.pid, 0)
    except ProcessLookupError:
        return None
    return ep

