"""The server's core shared as a pod shares it: one CPU cgroup per container, weighted by its request.

Kubernetes puts each container of a pod in its own cgroup and weights it by its CPU request
(cgroup v1 `cpu.shares` = millicores x 1024 / 1000; v2 `cpu.weight` converted from those shares).
Under contention the kernel then divides a core between containers by weight, not between their
threads: Triton's many runnable threads count as one container, and a mostly idle Envoy that a
request wakes runs almost at once. In one flat cgroup, as a bench's processes are by default, the
sidecar's single thread waits its turn behind each of Triton's, and a refusal that Envoy answers in
microseconds reaches the client milliseconds later. The bench measures a sidecar, so it places its
processes the way the chart's pod would, with the chart's requests (`helm/triton-edge/values.yaml`).

Making cgroups needs root and a writable CPU controller; where there is none, `pod_cpu` yields
None and the bench says that its processes shared one flat cgroup.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from tritonkit.helm.chart import chart_dir

V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")


def millicores(quantity: str | int | float) -> int:
    """A Kubernetes CPU quantity ("100m", "1", 0.5) in millicores."""
    text = str(quantity)
    return int(text[:-1]) if text.endswith("m") else round(float(text) * 1000)


def shares(mcpu: int) -> int:
    """cgroup v1 cpu.shares for a request, as the kubelet sets it (at least 2)."""
    return max(2, mcpu * 1024 // 1000)


def weight(mcpu: int) -> int:
    """cgroup v2 cpu.weight for a request: the kubelet's conversion from shares."""
    return 1 + (shares(mcpu) - 2) * 9999 // 262142


def chart_requests() -> dict[str, int]:
    """The CPU requests of the chart's Triton and gateway containers, in millicores."""
    values = yaml.safe_load((chart_dir() / "values.yaml").read_text())
    return {"triton": millicores(values["resources"]["requests"]["cpu"]),
            "gateway": millicores(values["gateway"]["resources"]["requests"]["cpu"])}


class Pod:
    """A parent cgroup with one child per container; `member` starts children inside one."""

    def __init__(self, parent: Path, version: int, requests: dict[str, int]):
        self.parent, self.version, self.requests = parent, version, requests
        self.home = _own_cgroup(version)

    def describe(self) -> str:
        per = ", ".join("{} {}m ({} {})".format(n, m, *_knob(self.version, m)) for n, m in self.requests.items())
        return f"a cgroup per container, weighted by the chart's requests: {per}"

    @contextlib.contextmanager
    def member(self, name: str) -> Iterator[None]:
        """This process inside `name`'s cgroup for the block: the children it starts there stay in
        it (a child inherits its parent's cgroup), and this process goes home after."""
        _move(self.parent / name, os.getpid())
        try:
            yield
        finally:
            _move(self.home, os.getpid())


def in_container(pod: Pod | None, container: str):
    """Children started in the block go into `container`'s cgroup of the pod, if there is one."""
    return pod.member(container) if pod else contextlib.nullcontext()


@contextlib.contextmanager
def pod_cpu(requests: dict[str, int], name: str = "tritonkit-bench") -> Iterator[Pod | None]:
    """A pod's CPU cgroups for `requests` (container -> millicores) while the block runs, removed
    after (a cgroup with processes left in it cannot be, so its children must have ended); None
    where this machine lets none be made."""
    made = _make(f"{name}-{os.getpid()}", requests)
    try:
        yield made
    finally:
        if made:
            _remove(made.parent, list(requests))


def _remove(parent: Path, children: list[str], wait_s: float = 10.0) -> None:
    """The pod's cgroups, once the processes in them are gone: a stopped server's backend stubs and
    a stopped Envoy can take a moment to leave, and a cgroup is busy until they have."""
    deadline = time.monotonic() + wait_s
    for path in [*(parent / c for c in children), parent]:
        while path.exists():
            try:
                path.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.1)


def _make(name: str, requests: dict[str, int]) -> Pod | None:
    for version, root in ((1, V1), (2, V2)):
        if version == 1 and not (root / "cpu.shares").exists():
            continue
        if version == 2 and "cpu" not in _read(root / "cgroup.controllers").split():
            continue
        parent = root / name
        try:
            parent.mkdir()
            if version == 2:  # the controller must be handed down to the children
                (parent / "cgroup.subtree_control").write_text("+cpu")
            for child, mcpu in requests.items():
                (parent / child).mkdir()
                knob, value = _knob(version, mcpu)
                (parent / child / knob).write_text(str(value))
            return Pod(parent, version, requests)
        except OSError:
            _remove(parent, list(requests), wait_s=0)
    return None


def _knob(version: int, mcpu: int) -> tuple[str, int]:
    """The file that weights a cgroup's CPU, and its value for a request."""
    return ("cpu.shares", shares(mcpu)) if version == 1 else ("cpu.weight", weight(mcpu))


def _own_cgroup(version: int) -> Path:
    """Where this process's CPU cgroup is: v1's `cpu` line of /proc/self/cgroup, v2's `0::` line."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (version == 1 and "cpu" in controllers.split(",")) or (version == 2 and controllers == ""):
            return (V1 if version == 1 else V2) / path.lstrip("/")
    raise OSError("this process has no CPU cgroup")


def _move(cgroup: Path, pid: int) -> None:
    (cgroup / "cgroup.procs").write_text(str(pid))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
