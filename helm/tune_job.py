"""`tritonkit deploy --tune`: the chart's tune Job, waited for, and its tuned.yaml read back.

The Job (helm/triton-edge/templates/tune/job.yaml) runs `tritonkit tune --url <Service>:<grpc>` for
each model, one after another, on the Triton pod's node, and prints each model's tuned.yaml to its
log between two marker lines. Here: what the Job will run (for --dry-run), waiting for it with
`kubectl wait`, reading its log with `kubectl logs`, and writing the decisions beside deploy.yaml.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tritonkit.errors import InputError, KitError, Problem
from tritonkit.files import write_bytes_atomic
from tritonkit.helm.chart import Rendered
from tritonkit.spec import TUNED_FILE, TUNED_KEYS, Spec

# The marker lines the Job's script prints (keep in step with templates/tune/job.yaml).
BEGIN = re.compile(r"^--- tuned\.yaml (\S+) ---$")
END = "--- end tuned.yaml ---"
FAILED = re.compile(r"^--- tune failed (\S+): exit (\d+) ---$")
CONTAINER = "tune"
WAIT_SLACK_S = 120  # past the Job's activeDeadlineSeconds, Kubernetes has marked it Failed
POLL_S = 20  # one `kubectl wait` at a time, so a failed Job is seen within this long
HEADER = ("# Written by `tritonkit deploy --tune` from the chart's tune Job: these keys override deploy.yaml's\n"
          "# for the models named here. Delete a model's entry, or this file, to go back.\n")


def job_name(fullname: str, revision: int) -> str:
    """The Job's name for a release revision, as the chart's `triton-edge.tuneJob` builds it."""
    suffix = f"tune-{revision}"
    return f"{fullname[:62 - len(suffix)].removesuffix('-')}-{suffix}"


@dataclass(frozen=True)
class JobPlan:
    """What the rendered tune Job does, read from its manifest."""

    name: str  # as rendered, i.e. for revision 1 (a first install)
    fullname: str  # the release's Service and Deployment name
    namespace: str
    models: list[str]
    commands: list[list[str]]  # one `tritonkit tune ...` per model, in the order they run
    deadline_s: int

    def wait_s(self) -> int:
        return self.deadline_s + WAIT_SLACK_S


def plan(rendered: Rendered) -> JobPlan:
    """The tune Job of a render (tune.enabled), and the command it runs for each model."""
    jobs = [m.doc for m in rendered.manifests if m.kind == "Job"
            and m.doc["metadata"]["labels"].get("app.kubernetes.io/component") == "tune"]
    if len(jobs) != 1:
        raise KitError(f"the rendered chart has {len(jobs)} tune Jobs, not one (fix: check tune.enabled and "
                       "deploy.values)")
    job = jobs[0]
    server = next(m.doc for m in rendered.manifests if m.kind == "Deployment"
                  and m.doc["metadata"]["labels"].get("app.kubernetes.io/component") == "triton")
    c = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == CONTAINER)
    env = {e["name"]: e.get("value") for e in c["env"]}
    models = env["TUNE_MODELS"].split()
    work = env["TUNE_WORK"]
    commands = [["tritonkit", "tune", "--model", m, "--spec", f"{work}/spec/deploy.yaml", "--out", f"{work}/out/{m}",
                 *c["args"]] for m in models]
    return JobPlan(job["metadata"]["name"], server["metadata"]["name"], job["metadata"]["namespace"], models,
                   commands, int(job["spec"]["activeDeadlineSeconds"]))


# -- the log ------------------------------------------------------------------------------------

@dataclass
class TuneLog:
    tuned: dict[str, dict] = field(default_factory=dict)  # model: its tuned.yaml entry
    failed: dict[str, int] = field(default_factory=dict)  # model: the exit code of its `tritonkit tune`


def read_log(text: str, job: str = "the tune Job") -> TuneLog:
    """Each model's tuned.yaml entry from the Job's log (between `--- tuned.yaml <model> ---` and
    `--- end tuned.yaml ---`), and the models whose tune failed. Raises KitError for a log with no
    marker at all, a block cut off, or a block that is not a tuned.yaml for its model."""
    out = TuneLog()
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\r")
        if m := FAILED.match(line):
            out.failed[m[1]] = int(m[2])
        elif m := BEGIN.match(line):
            model = m[1]
            try:
                end = next(j for j in range(i + 1, len(lines)) if lines[j].rstrip("\r") == END)
            except StopIteration:
                raise KitError(f"{job}'s log stops inside the tuned.yaml block of {model} (no `{END}` line) "
                               "(fix: read the whole log with `kubectl logs`, or run the tune again)") from None
            out.tuned[model] = _entry(model, "\n".join(lines[i + 1:end]), job)
            i = end
        i += 1
    if not out.tuned and not out.failed:
        raise KitError(f"{job}'s log has no `--- tuned.yaml <model> ---` block and no failed tune: it is not "
                       "the chart's tune Job, or it stopped before its first model (fix: look at `kubectl logs` "
                       "and `kubectl describe` of the Job)")
    return out


def _entry(model: str, text: str, job: str) -> dict:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise KitError(f"{job}'s tuned.yaml block of {model} is not YAML: {getattr(e, 'problem', e)}") from None
    entry = data.get("models", {}).get(model) if isinstance(data, dict) and isinstance(data.get("models"), dict) \
        else None
    if not isinstance(entry, dict) or not entry or set(entry) - set(TUNED_KEYS):
        raise KitError(f"{job}'s tuned.yaml block of {model} has no entry for {model} with only "
                       f"{', '.join(TUNED_KEYS)} (fix: check the kit image's version against this kit's)")
    return entry


def write_tuned(spec: Spec, tuned: dict[str, dict]) -> Path:
    """Merge the Job's decisions into tuned.yaml beside deploy.yaml (other models' entries kept),
    written atomically: a reader sees the old file or the new one."""
    known = [m.name for m in spec.models]
    unknown = sorted(set(tuned) - set(known))
    if unknown:
        raise KitError(f"the tune Job tuned {', '.join(unknown)}, which {spec.shown} has no model of "
                       f"(fix: deploy this deploy.yaml again; its models are {', '.join(known)})")
    path = spec.path.parent / TUNED_FILE
    data = yaml.safe_load(path.read_text()) if path.is_file() else None  # read and checked by the parse
    data = data if isinstance(data, dict) and isinstance(data.get("models"), dict) else {"models": {}}
    data["models"].update(tuned)
    write_bytes_atomic(path, (HEADER + yaml.safe_dump(data, sort_keys=False)).encode())
    return path


# -- the cluster --------------------------------------------------------------------------------

def kubectl_binary() -> str:
    """kubectl on PATH, or the InputError that says how to get it (before any work is done)."""
    found = shutil.which("kubectl")
    if not found:
        raise InputError([Problem("command line", "--tune", "needs kubectl on PATH to wait for the tune Job and "
                                  "read its log", "install kubectl (on k3s: the `k3s kubectl` link; on MicroK8s: "
                                  "`snap alias microk8s.kubectl kubectl`), or render only with --tune --dry-run")])
    return found


def tune_problems(spec: Spec) -> list[Problem]:
    """The deploy block's rules for --tune: one Triton pod, or the Service would spread the tune's
    requests, and its shadow model, over several."""
    d = spec.data.deploy
    problems = []
    if d.autoscaling.enabled:
        problems.append(Problem(spec.shown, "deploy.autoscaling.enabled", "--tune needs one Triton pod",
                                "set it to false for the tune (deploy with autoscaling afterwards)"))
    elif d.replicas != 1:
        problems.append(Problem(spec.shown, "deploy.replicas", f"is {d.replicas}; --tune needs one Triton pod",
                                "set deploy.replicas: 1 for the tune (scale out afterwards)"))
    return problems


@dataclass
class Kubectl:
    binary: str
    namespace: str
    kubeconfig: Path | None = None
    context: str | None = None

    def run(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
        cmd = [self.binary, "--namespace", self.namespace]
        if self.kubeconfig:
            cmd += ["--kubeconfig", str(self.kubeconfig)]
        if self.context:
            cmd += ["--context", self.context]
        try:
            return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise KitError(f"kubectl {' '.join(args)} did not answer in {timeout_s:.0f} s (fix: check the "
                           "cluster is reachable with `kubectl get nodes`)") from None


def one_line(text: str) -> str:
    return " ".join(text.split())


def wait_for(kubectl: Kubectl, job: str, timeout_s: int, log: Callable[[str], None] = print) -> str | None:
    """Wait until the Job completes (None) or fails (Kubernetes' reason, e.g. BackoffLimitExceeded or
    DeadlineExceeded), at most `timeout_s`; `kubectl wait --for=condition=complete` in short
    slices, so a failed Job is noticed without waiting out the timeout."""
    log(f"tune: waiting for job/{job} in namespace {kubectl.namespace} (at most {timeout_s} s)")
    end = time.monotonic() + timeout_s
    while True:
        left = int(end - time.monotonic())
        if left <= 0:
            raise KitError(f"tune: job/{job} did not finish in {timeout_s} s (fix: kubectl -n {kubectl.namespace} "
                           f"logs job/{job} -c {CONTAINER}; a larger tune.activeDeadlineSeconds in deploy.values)")
        slice_s = min(POLL_S, left)
        p = kubectl.run("wait", "--for=condition=complete", f"job/{job}", f"--timeout={slice_s}s",
                        timeout_s=slice_s + 60)
        if p.returncode == 0:
            return None
        if "timed out" not in (p.stderr + p.stdout):
            raise KitError(f"tune: kubectl wait job/{job} failed: {one_line(p.stderr or p.stdout)} (fix: check "
                           f"the cluster with `kubectl -n {kubectl.namespace} get jobs`)")
        q = kubectl.run("get", f"job/{job}", "-o", 'jsonpath={.status.conditions[?(@.type=="Failed")].reason}')
        if q.returncode == 0 and q.stdout.strip():
            return q.stdout.strip()


def job_log(kubectl: Kubectl, job: str) -> str:
    p = kubectl.run("logs", f"job/{job}", "-c", CONTAINER)
    if p.returncode != 0:
        raise KitError(f"tune: kubectl logs job/{job} failed: {one_line(p.stderr or p.stdout)} (fix: the Job's "
                       "pod is gone, e.g. past tune.ttlSecondsAfterFinished or activeDeadlineSeconds: run "
                       "`tritonkit deploy --tune` again)")
    return p.stdout


@dataclass
class TuneOutcome:
    job: str
    tuned_path: Path | None
    log: TuneLog
    failure: str | None  # the Job's Failed reason, None when it completed


def run_job(spec: Spec, kubectl: Kubectl, job: str, timeout_s: int,
            log: Callable[[str], None] = print) -> TuneOutcome:
    """Wait for the tune Job, read its log, write tuned.yaml beside deploy.yaml from what it tuned.
    Raises KitError when nothing was tuned."""
    failure = wait_for(kubectl, job, timeout_s, log)
    text = job_log(kubectl, job)
    try:
        result = read_log(text, f"job/{job}")
    except KitError:
        if failure:
            raise KitError(f"tune: job/{job} failed ({failure}) before any model was tuned (fix: kubectl -n "
                           f"{kubectl.namespace} logs job/{job} --all-containers)") from None
        raise
    for model, code in result.failed.items():
        log(f"tune: {model}: `tritonkit tune` exited {code} ({'nothing met the SLO' if code == 1 else 'failed'}; "
            f"its report is in the log: kubectl -n {kubectl.namespace} logs job/{job} -c {CONTAINER})")
    if not result.tuned:
        raise KitError(f"tune: job/{job} tuned no model ({', '.join(result.failed)} failed): nothing was written "
                       f"(fix: read its log, kubectl -n {kubectl.namespace} logs job/{job} -c {CONTAINER})")
    path = write_tuned(spec, result.tuned)
    log(f"tune: wrote {path} ({', '.join(result.tuned)} tuned)")
    return TuneOutcome(job, path, result, failure)
