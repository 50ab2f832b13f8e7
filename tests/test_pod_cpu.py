"""The overload bench's pod: CPU weights as the kubelet sets them from the chart's requests, and
children started inside a container's cgroup staying there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tritonkit.benchmarks.pod_cpu import chart_requests, millicores, pod_cpu, shares, weight


def test_cpu_requests_become_the_weights_the_kubelet_gives_them():
    assert [millicores(q) for q in ("100m", "1", "2.5", 0.25)] == [100, 1000, 2500, 250]
    assert (shares(100), shares(1000), shares(1)) == (102, 1024, 2)  # cpu.shares, at least 2
    assert (weight(100), weight(1000)) == (4, 39)  # cpu.weight, from those shares


def test_the_bench_weights_the_containers_by_the_charts_requests():
    import yaml

    from tritonkit.helm.chart import chart_dir

    values = yaml.safe_load((chart_dir() / "values.yaml").read_text())
    assert chart_requests() == {"triton": millicores(values["resources"]["requests"]["cpu"]),
                                "gateway": millicores(values["gateway"]["resources"]["requests"]["cpu"])}


def test_a_child_started_inside_a_container_stays_in_its_cgroup_and_the_pod_is_removed_after():
    with pod_cpu({"triton": 1000, "gateway": 100}, name="tritonkit-test") as pod:
        if pod is None:
            pytest.skip("this machine lets no CPU cgroup be made (not root, or no writable cpu controller)")
        with pod.member("gateway"):
            child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])  # until killed
        try:
            lines = Path(f"/proc/{child.pid}/cgroup").read_text().splitlines()
            mine = Path("/proc/self/cgroup").read_text().splitlines()
            assert any(line.endswith(f"/{pod.parent.name}/gateway") for line in lines), lines
            assert not any(pod.parent.name in line for line in mine), mine  # this process went home
            knob = "cpu.shares" if pod.version == 1 else "cpu.weight"
            assert (pod.parent / "gateway" / knob).read_text().strip() == str(shares(100) if pod.version == 1
                                                                             else weight(100))
        finally:
            child.kill()
            child.wait()
        parent = pod.parent
    assert not parent.exists()
