"""`tritonkit bench footprint`: what the kit takes on an edge box, measured here.

- Install size per role: the kit's requirements followed through the installed packages' own
  metadata (importlib.metadata), for the base install and with each extra, summing the disk
  blocks of the files each package's RECORD lists (as `du` counts them: schema folders of many
  small files take more disk than bytes). pip and setuptools, which every virtual environment
  brings, are left out.
- Idle memory of the server with the sample model loaded: tritonserver and its python-backend
  stub, RSS and PSS (PSS shares each library page among the processes that map it, so the sum is
  what the box really spends).
- Memory of the tuner sidecar (`tritonkit tune --online` against that server, as the chart runs
  it), its peak over a few observation windows.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tritonkit import sample_model
from tritonkit.configs.generate import generate
from tritonkit.configs.loader import load_spec
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.results import SCHEMA
from tritonkit.serving import running

KIT = "triton-edge-kit"
ENVIRONMENT = {"pip", "setuptools", "wheel"}  # what a virtual environment brings on its own
MB = 1e6


def _dist(name: str) -> md.Distribution | None:
    try:
        return md.distribution(name)
    except md.PackageNotFoundError:
        return None


def requirement_closure(extras: tuple[str, ...] = ()) -> tuple[set[str], set[str]]:
    """The packages the kit with `extras` needs, by canonical name: (installed, missing)."""
    seen: set[str] = set()
    missing: set[str] = set()
    todo = [(KIT, extras)]
    while todo:
        name, wanted = todo.pop()
        dist = _dist(name)
        if dist is None:
            missing.add(canonicalize_name(name))
            continue
        key = canonicalize_name(dist.metadata["Name"])
        if (key, wanted) in seen:
            continue
        seen.add((key, wanted))
        for text in dist.requires or []:
            req = Requirement(text)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, tuple(sorted(req.extras))))
    installed = {k for k, _ in seen} - ENVIRONMENT
    return installed, missing - ENVIRONMENT


def dist_size(name: str) -> int:
    dist = _dist(name)
    total = 0
    for f in (dist.files or []) if dist else []:
        path = Path(str(dist.locate_file(f)))
        if path.is_file():
            total += path.stat().st_blocks * 512
    return total


def install_sizes(extras: tuple[str, ...] = ("deploy", "dev")) -> dict:
    """MB of the base install and of what each extra adds, with the largest packages of each."""
    base, base_missing = requirement_closure()
    sizes = {name: dist_size(name) for name in base}
    out = {"base": {"mb": round(sum(sizes.values()) / MB, 1), "packages": len(base),
                    "missing": sorted(base_missing), "largest": _largest(sizes)}}
    for extra in extras:
        names, missing = requirement_closure((extra,))
        added = {n: dist_size(n) for n in names - base}
        out[extra] = {"adds_mb": round(sum(added.values()) / MB, 1), "packages": len(added),
                      "missing": sorted(missing - base_missing), "largest": _largest(added)}
    return out


def _largest(sizes: dict[str, int], n: int = 6) -> dict[str, float]:
    return {k: round(v / MB, 1) for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])[:n]}


def _memory(procs: list[psutil.Process]) -> dict:
    rss = pss = 0
    for p in procs:
        try:
            full = p.memory_full_info()
        except psutil.Error:
            continue
        rss += full.rss
        pss += getattr(full, "pss", full.rss)
    return {"rss_mb": round(rss / MB, 1), "pss_mb": round(pss / MB, 1), "processes": len(procs)}


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def sidecar_memory(spec_path: Path, model: str, url: str, out_dir: Path, seconds: float) -> dict:
    """Peak memory of `tritonkit tune --online --dry-run` over `seconds` against a live server."""
    cmd = [sys.executable, "-m", "tritonkit.cli", "tune", "--online", "--dry-run", "--spec", str(spec_path),
           "--model", model, "--url", url, "--interval", "1", "--cooldown", "1", "--duration", str(seconds),
           "--out", str(out_dir / "sidecar")]
    peak = {"rss_mb": 0.0, "pss_mb": 0.0}
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        while proc.poll() is None:
            now = _memory(_tree(proc.pid)) if psutil.pid_exists(proc.pid) else peak
            peak = {k: max(peak[k], now[k]) for k in peak}
            time.sleep(0.2)
        err = proc.stderr.read()
    return {**peak, "exit_code": proc.returncode, "stderr_tail": err[-400:]}


def run_footprint(out_dir: Path, *, settle_s: float = 3.0, sidecar_s: float = 6.0,
                  log: Callable[[str], None] = print) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = install_sizes()
    onnx = out_dir / "edge_mlp.onnx"
    if not onnx.exists():
        sample_model.write(onnx)
    spec_path = out_dir / "deploy.yaml"
    spec_path.write_text(yaml.safe_dump({"models": [{"name": "edge_mlp", "onnx": str(onnx.resolve()),
                                                     "max_batch_size": 16, "slo": {"p95_ms": 25}}],
                                         "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}}))
    spec = load_spec(spec_path, out_dir / "repo")
    generate(spec, out_dir / "repo")
    with running(spec, out_dir / "repo", out_dir / "state", log=log) as r:
        time.sleep(settle_s)  # warm-up done; let the allocator settle before reading
        server = _memory(_tree(r.server.proc.pid))
        log(f"== tuner sidecar against it for {sidecar_s:g} s")
        sidecar = sidecar_memory(spec_path, "edge_mlp", r.endpoints.grpc, out_dir, sidecar_s)
    result = {"schema": SCHEMA, "kind": "bench/footprint", "python": sys.version.split()[0],
              "environment": sys.prefix, "install": sizes, "server_idle": server, "tuner_sidecar": sidecar}
    write_bytes_atomic(out_dir / "footprint.json", json.dumps(result, indent=2).encode())
    log(format_footprint(result))
    return result


def format_footprint(f: dict) -> str:
    i = f["install"]
    lines = [f"install size (this environment's packages, {f['environment']}):",
             f"  base       {i['base']['mb']:>7.1f} MB  {i['base']['packages']:>3} packages; largest "
             + ", ".join(f"{k} {v:g}" for k, v in i["base"]["largest"].items())]
    for extra in (k for k in i if k != "base"):
        e = i[extra]
        note = f" (not installed here: {', '.join(e['missing'])})" if e["missing"] else ""
        lines.append(f"  [{extra}]{'':<{8 - len(extra)}}+{e['adds_mb']:>6.1f} MB  {e['packages']:>3} packages; largest "
                     + ", ".join(f"{k} {v:g}" for k, v in e["largest"].items()) + note)
    s, t = f["server_idle"], f["tuner_sidecar"]
    lines.append(f"server idle, sample model loaded: RSS {s['rss_mb']:.0f} MB, PSS {s['pss_mb']:.0f} MB "
                 f"({s['processes']} processes: tritonserver and its python-backend stub)")
    ok = "" if t["exit_code"] == 0 else f" (exit {t['exit_code']}: {t['stderr_tail'].strip()[-200:]})"
    lines.append(f"tuner sidecar (tune --online), peak: RSS {t['rss_mb']:.0f} MB, PSS {t['pss_mb']:.0f} MB{ok}")
    return "\n".join(lines)
