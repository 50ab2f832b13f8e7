"""Where the kit's configs and engines can run: NGC release x platform x runtime, in one table.

A deploy target is the node, never the machine that runs `tritonkit`: the release (NGC YY.MM), the
platform (x86-64 or arm64 SBSA data-centre GPUs, Jetson) and whether the pod gets a GPU decide the
runtime of every `runtime: auto` model, the instance kind, the images and their architectures.

Facts are pinned only where a source was read for them (docs/support.md names each):
- the Triton version of each release is its branch's TRITON_VERSION file;
- a release's TensorRT is pinned where its release notes list it; elsewhere the engine build reads
  it from the build image on the node, and the engine cache is keyed by what it read;
- `-py3-igpu` images (JetPack 6) exist from 23.11; 26.02 is the last Jetson release, and from 26.03
  Jetson AGX runs the SBSA (arm64) `-py3` image (Triton 2.66.0 and 2.67.0 release notes);
- `-py3` images are multi-arch (amd64 and arm64 SBSA).
TensorRT 10 is the floor (the kit's profiles and trtexec flags are TensorRT 10's), so the table
starts at 24.05, the first release on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonkit.errors import InputError, Problem

PLATFORMS = ("x86", "sbsa", "jetson")
ARCH = {"x86": "amd64", "sbsa": "arm64", "jetson": "arm64"}
LOCAL_RELEASE = "24.10"  # the bundled server (nvidia-pytriton's tritonserver 2.51)


@dataclass(frozen=True)
class Release:
    release: str  # NGC YY.MM
    triton: str  # server version, as perf_analyzer and the server report it
    tensorrt: str | None  # pinned from the release notes; None: read from the build image on the node
    cuda: str | None
    min_driver: int | None  # the NVIDIA driver branch the release needs (data-centre GPUs: see the notes)


# Triton version: the release branch's TRITON_VERSION. CUDA and driver: NGC release notes.
RELEASES = tuple(Release(*row) for row in (
    ("24.05", "2.46.0", None, "12.4", 545),
    ("24.06", "2.47.0", None, "12.5.0", 545),
    ("24.07", "2.48.0", None, "12.5.1", 555),
    ("24.08", "2.49.0", None, "12.6", 560),
    ("24.09", "2.50.0", None, None, None),
    ("24.10", "2.51.0", None, "12.6.2", 560),
    ("24.11", "2.52.0", None, None, None),
    ("24.12", "2.53.0", "10.7.0", "12.6.3", 560),
    ("25.01", "2.54.0", "10.8.0", "12.8.0", 560),
    ("25.02", "2.55.0", None, "12.8.0", 560),
    ("25.03", "2.56.0", None, "12.8.1", 560),
    ("25.04", "2.57.0", None, "12.9.0", 575),
    ("25.05", "2.58.0", None, None, None),
    ("25.06", "2.59.0", None, "12.9.1", 575),
    ("25.07", "2.59.1", None, None, None),
    ("25.08", "2.60.0", None, "13.0.0", 575),
    ("25.09", "2.61.0", None, None, None),
    ("25.10", "2.62.0", None, "13.0.2", 575),
    ("25.11", "2.63.0", None, None, None),
    ("25.12", "2.64.0", None, None, None),
    ("26.01", "2.65.0", None, None, None),
    ("26.02", "2.66.0", None, "13.1.1", 575),
    ("26.03", "2.67.0", None, None, None),
    ("26.04", "2.68.0", None, "13.2.1", 575),
    ("26.05", "2.69.0", None, None, None),
    ("26.06", "2.70.0", None, "13.3.0", None),
    ("26.07", "2.71.0", None, "13.3.1", None),
))
BY_RELEASE = {r.release: r for r in RELEASES}
LAST_IGPU = "26.02"  # the last release with a -py3-igpu image; Jetson runs the SBSA image after it


@dataclass(frozen=True)
class Target:
    """The node a deploy serves on."""

    release: Release
    platform: str  # x86 | sbsa | jetson
    gpu: bool

    @property
    def arch(self) -> str:
        return ARCH[self.platform]

    @property
    def flavor(self) -> str:
        """The image tag's suffix: Jetson's own image up to the last igpu release, the SBSA one after."""
        return "py3-igpu" if self.platform == "jetson" and self.release.release <= LAST_IGPU else "py3"

    @property
    def server_image(self) -> str:
        return f"nvcr.io/nvidia/tritonserver:{self.release.release}-{self.flavor}"

    @property
    def build_image(self) -> str:
        """Where engines are built on the node: the TensorRT image of the same release (same CUDA and
        TensorRT as the server, with trtexec); on Jetson's igpu images, the server image itself,
        whose JetPack TensorRT is the one that serves."""
        if self.flavor == "py3-igpu":
            return self.server_image
        return f"nvcr.io/nvidia/tensorrt:{self.release.release}-py3"

    @property
    def image_arches(self) -> tuple[str, ...]:
        return ("arm64",) if self.flavor == "py3-igpu" else ("amd64", "arm64")

    def runtime(self, asked: str) -> str:
        """A model's runtime on this node: `auto` is TensorRT (built on the node) where the pod has a
        GPU, ONNX Runtime where it has none. The bundled python runner exists only locally."""
        if asked != "auto":
            return asked
        return "tensorrt" if self.gpu else "onnxruntime"

    def instance_kind(self, runtime: str) -> str:
        return "gpu" if self.gpu and runtime in ("tensorrt", "onnxruntime") else "cpu"

    def describe(self) -> str:
        return (f"NGC {self.release.release} (Triton {self.release.triton}) on {self.platform} "
                f"({self.arch}), {'GPU' if self.gpu else 'no GPU'}")


# The first Triton whose gRPC frontend survives a request cancelled while in flight (Triton issue
# 7368, fixed on the 24.12 branch, released from 25.01). Before it, a gateway's deadline (Envoy
# resets the stream) or a client's gRPC deadline can crash the server under the very overload a
# deadline is for: bench overload crashed 2.51 so.
SAFE_CANCEL_FROM = (2, 54, 0)


def cancels_safely(triton_version: str) -> bool:
    """Whether a server of this version may be sent requests that get cancelled."""
    try:
        return tuple(int(x) for x in triton_version.split(".")[:3]) >= SAFE_CANCEL_FROM
    except ValueError:
        return False


def local_triton() -> str:
    """The bundled server's Triton version (`serve`, the demo and the benches start it)."""
    return next(r.triton for r in RELEASES if r.release == LOCAL_RELEASE)


def nearest(release: str) -> Release:
    """The supported row closest to `release` by months (the newer of two as close)."""
    def months(r: str) -> int:
        y, m = r.split(".")
        return int(y) * 12 + int(m)
    return min(RELEASES, key=lambda r: (abs(months(r.release) - months(release)), -months(r.release)))


def target_problems(file: str, release: str, platform: str, runtimes: dict[str, str], gpus: int) -> list[Problem]:
    """Refusals for a target outside the table, each naming the nearest supported row."""
    problems = []
    if platform not in PLATFORMS:
        problems.append(Problem(file, "deploy.platform", f"{platform!r} is not a supported platform",
                                f"use one of: {', '.join(PLATFORMS)}"))
        return problems
    if release not in BY_RELEASE:
        near = nearest(release)
        problems.append(Problem(file, "deploy.triton_version",
                                f"NGC {release} on {platform} is not in the support matrix "
                                f"({RELEASES[0].release} to {RELEASES[-1].release}; docs/support.md)",
                                f"use the nearest supported release, {near.release} (Triton {near.triton})"))
    for at, runtime in runtimes.items():
        if runtime == "python-onnxruntime":
            problems.append(Problem(file, f"{at}.runtime", "python-onnxruntime is the bundled local server's runner; "
                                    "NGC images serve ONNX with their onnxruntime backend",
                                    "set runtime: onnxruntime (or auto) for a deploy"))
        elif runtime == "tensorrt" and gpus == 0:
            problems.append(Problem(file, f"{at}.runtime", "tensorrt needs a GPU, and deploy.gpus is 0",
                                    "set deploy.gpus: 1, or runtime: onnxruntime (or auto)"))
    return problems


def spec_problems(spec) -> list[Problem]:
    """The spec's deploy target against the table: release, platform, and each model's runtime."""
    d = spec.data.deploy
    runtimes = {f"models[{i}]": m.runtime for i, m in enumerate(spec.models)}
    return target_problems(spec.shown, d.triton_version, d.platform, runtimes, d.gpus)


def spec_target(spec) -> Target:
    """The node the spec's deploy block describes; a release outside the table is refused (exit 2)."""
    problems = spec_problems(spec)
    if problems:
        raise InputError(problems)
    d = spec.data.deploy
    return Target(BY_RELEASE[d.triton_version], d.platform, d.gpus > 0)
