"""Find NVIDIA's perf_analyzer for the server's version, or install it, with the libraries it loads.

Where a binary comes from, first match wins:
1. `$TRITONKIT_PERF_ANALYZER`, a path the user chose;
2. `perf_analyzer` on PATH (NGC's SDK image ships one);
3. the kit's cache, `~/.cache/tritonkit/perf_analyzer/<server version>/`, filled on first use from
   the `tritonclient` wheel of the server's own version, which carries `bin/perf_analyzer` up to
   2.60 (the `perf-analyzer` wheels on PyPI need glibc 2.38; many edge images have older).
   `$TRITONKIT_PERF_ANALYZER_DIR` moves that cache: the kit image fills one at build time (its
   Containerfile) and reads it at run time, read-only and without a network. Where it holds no
   binary of the server's version it gives its newest, since perf_analyzer speaks the same KServe
   v2 protocol to every 2.x server, rather than letting the tune fall back to the asyncio client.

The wheel's binary loads `libb64.so.0d` and `libcudart.so.12`. The `nvidia-pytriton` wheel that
bundles the server carries both (under hashed names), so the cache links them beside the binary;
`ldd` then says whether anything is still missing, and the error names it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from tritonkit.errors import KitError

ENV_BINARY = "TRITONKIT_PERF_ANALYZER"
ENV_DIR = "TRITONKIT_PERF_ANALYZER_DIR"
# The libraries the wheel's binary needs that a CPU box lacks, and the glob of the hashed copies in
# nvidia_pytriton.libs
BUNDLED_LIBS = {"libb64.so.0d": "libb64-*.so.0d", "libcudart.so.12": "libcudart-*.so.12*"}
LAST_WHEEL_WITH_BINARY = (2, 60)


@dataclass(frozen=True)
class PerfAnalyzer:
    binary: Path
    version: str
    env: dict[str, str] = field(default_factory=dict)  # extra environment (LD_LIBRARY_PATH)

    def command(self, *args: str) -> list[str]:
        return [str(self.binary), *args]

    def environ(self) -> dict[str, str]:
        env = dict(os.environ)
        for k, v in self.env.items():
            env[k] = f"{v}:{env[k]}" if k == "LD_LIBRARY_PATH" and env.get(k) else v
        return env


class PerfAnalyzerMissing(KitError):
    """No perf_analyzer that runs could be found or installed for the server's version."""


def cache_root() -> Path:
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tritonkit" / "perf_analyzer"


def _version_key(folder: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", folder.name))


def _shipped(server_version: str) -> Path | None:
    """The folder under `$TRITONKIT_PERF_ANALYZER_DIR` to use for this server: its own version's,
    else the newest there."""
    if not os.environ.get(ENV_DIR):
        return None
    root = Path(os.environ[ENV_DIR])
    found = sorted((d for d in root.glob("*") if (d / "perf_analyzer").is_file()), key=_version_key)
    exact = root / server_version
    return exact if exact in found else (found[-1] if found else None)


def find(server_version: str, *, install: bool = True, log=print) -> PerfAnalyzer:
    """The perf_analyzer to drive a server of `server_version` with; installs into the cache when
    none is found and `install` is set. A KitError says exactly what is missing otherwise."""
    chosen = os.environ.get(ENV_BINARY)
    if chosen:
        return _checked(Path(chosen), {}, f"${ENV_BINARY}")
    on_path = shutil.which("perf_analyzer")
    if on_path:
        return _checked(Path(on_path), {}, "PATH")
    folder = _shipped(server_version) or cache_root() / server_version
    if folder.name != server_version:
        log(f"perf_analyzer {folder.name} from ${ENV_DIR} drives Triton {server_version} (one protocol for 2.x)")
    binary = folder / "perf_analyzer"
    if not binary.exists():
        if not install:
            raise PerfAnalyzerMissing(f"no perf_analyzer for Triton {server_version}: none on PATH, none in {folder} "
                           f"(run `tritonkit perf-analyzer` to install it, or set ${ENV_BINARY})")
        _install(server_version, folder, log)
    return _checked(binary, {"LD_LIBRARY_PATH": str(_link_libraries(folder))}, str(folder))


def _install(version: str, folder: Path, log) -> None:
    """Extract bin/perf_analyzer from the tritonclient wheel of `version` into `folder`."""
    major_minor = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    if major_minor > LAST_WHEEL_WITH_BINARY:
        raise PerfAnalyzerMissing(f"tritonclient {version}'s wheel carries no perf_analyzer (the last that does is "
                       f"{'.'.join(map(str, LAST_WHEEL_WITH_BINARY))}): install NVIDIA's perf-analyzer package or "
                       f"use the NGC SDK image, then put perf_analyzer on PATH or set ${ENV_BINARY}")
    log(f"installing perf_analyzer {version} from the tritonclient {version} wheel into {folder}")
    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--dest", tmp, f"tritonclient=={version}"]
        done = subprocess.run(pip, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("tritonclient-*.whl"))
        if done.returncode or not wheels:
            raise PerfAnalyzerMissing(f"could not download tritonclient=={version} to take perf_analyzer from: "
                           f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or ['no wheel']} "
                           f"(on a box without a package index, copy a perf_analyzer {version} binary there and "
                           f"set ${ENV_BINARY})")
        with zipfile.ZipFile(wheels[0]) as z:
            member = next((n for n in z.namelist() if n.endswith("/bin/perf_analyzer")), None)
            if member is None:
                raise PerfAnalyzerMissing(f"{wheels[0].name} has no bin/perf_analyzer: set ${ENV_BINARY} to a "
                                          f"perf_analyzer {version} binary")
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / ".perf_analyzer.partial"
            partial.write_bytes(z.read(member))
            partial.chmod(0o755)
            partial.replace(folder / "perf_analyzer")  # atomic: a half-written binary is never found


def _link_libraries(folder: Path) -> Path:
    """A lib/ beside the cached binary with the bundled libraries under the names it asks for."""
    libs = folder / "lib"
    libs.mkdir(exist_ok=True)
    bundled = _pytriton_libs()
    for name, pattern in BUNDLED_LIBS.items():
        target = libs / name
        found = sorted(bundled.glob(pattern)) if bundled else []
        if found and not target.exists():
            tmp = libs / f".{name}.link"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(found[0])
            tmp.replace(target)
    return libs


def _pytriton_libs() -> Path | None:
    try:
        import pytriton
    except ImportError:
        return None
    folder = Path(pytriton.__file__).resolve().parent.parent / "nvidia_pytriton.libs"
    return folder if folder.is_dir() else None


def _checked(binary: Path, env: dict[str, str], source: str) -> PerfAnalyzer:
    """The binary runs: every library resolves and it reports its version."""
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise PerfAnalyzerMissing(f"perf_analyzer from {source}: {binary} is not an executable file")
    pa = PerfAnalyzer(binary, "", env)
    missing = missing_libraries(pa)
    if missing:
        raise PerfAnalyzerMissing(f"perf_analyzer at {binary} (from {source}) cannot run: missing {', '.join(missing)} "
                       f"(install nvidia-pytriton, which bundles libb64 and libcudart, or put them on "
                       f"LD_LIBRARY_PATH)")
    done = subprocess.run(pa.command("--version"), capture_output=True, text=True, env=pa.environ(), timeout=30)
    m = re.search(r"Version\s+(\S+)", done.stdout + done.stderr)
    if not m:
        raise PerfAnalyzerMissing(f"perf_analyzer at {binary} (from {source}) did not report a version: "
                       f"{(done.stderr or done.stdout).strip()[:200]}")
    return PerfAnalyzer(binary, m.group(1), env)


def missing_libraries(pa: PerfAnalyzer) -> list[str]:
    """The shared libraries the dynamic loader cannot find for the binary, by name."""
    try:
        done = subprocess.run(["ldd", str(pa.binary)], capture_output=True, text=True, env=pa.environ(), timeout=30)
    except FileNotFoundError:
        return []  # no ldd: running it will tell
    return [line.split()[0] for line in done.stdout.splitlines() if "not found" in line]
