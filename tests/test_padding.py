"""Traffic whose lengths vary, padded up to length buckets where requests are made: a text-line
recogniser ([3, 48, W], W from 32 to 320 on a stride of 8) served by the real tritonserver, with
and without padding, from the same length distribution."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.conftest import write_spec
from tritonkit.benchmarks.cases import line_recogniser
from tritonkit.loadtests.load import Load

pytestmark = [pytest.mark.server]

LINE = {"name": "line", "dtype": "FP32", "dims": [3, 48, -1], "min": [3, 48, 32], "opt": [3, 48, 160],
        "max": [3, 48, 320], "stride": 8, "lengths": {"dist": "uniform", "low": 32, "high": 320}}
BATCHING = {"max_queue_delay_us": 8000, "preferred_batch_sizes": [8]}


def _model(name: str, **extra) -> dict:
    return {"name": name, "onnx": "line.onnx", "max_batch_size": 8, "inputs": [LINE], "batching": BATCHING,
            "instances": {"count": 1}, **extra}


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    from tritonkit.configs.generate import generate
    from tritonkit.configs.loader import load_spec
    from tritonkit.serving import running

    root = tmp_path_factory.mktemp("padding")
    line_recogniser(root / "line.onnx")
    padded = {"padding": {"crop": {"logits": {"dim": 0, "per": 4}}}, "build": {"bucket_edges": [64, 160]}}
    spec_path = write_spec(root, {"models": [_model("plain"), _model("padded", **padded)],
                                  "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}})
    generate(load_spec(spec_path, root / "repo"), root / "repo")
    with running(load_spec(spec_path), root / "repo", root / "state") as r:
        r.root = root
        yield r


def test_padded_requests_answer_what_the_unpadded_line_gives(lines):
    """Lengths between and on the edges, padded, served, cut back: equal to ONNX Runtime on the
    line alone."""
    import onnxruntime as ort

    from tritonkit.clients.padding import crop_outputs, pad_request

    session = ort.InferenceSession(str(lines.root / "line.onnx"), providers=["CPUExecutionProvider"])
    with lines.client() as c:
        rules = c.metadata("padded").rules
        worst = 0.0
        for width in (32, 72, 160, 168, 320):
            x = np.random.default_rng(width).standard_normal((1, 3, 48, width)).astype(np.float32)
            sent, length = pad_request({"line": x}, rules, batched=True)
            assert sent["line"].shape[-1] == {32: 64, 72: 160, 160: 160, 168: 320, 320: 320}[width]
            got = crop_outputs(c.infer("padded", sent), length, {"logits": (0, 4)}, batched=True)["logits"]
            want = session.run(None, {"line": x})[0]
            assert got.shape == want.shape == (1, width // 4, 40)
            worst = max(worst, float(np.abs(got - want).max()))
    assert worst <= 1e-4, worst


def test_padding_to_buckets_lets_the_batcher_fill_batches(lines):
    """The same lengths at the same rate: unpadded, nearly every length is its own shape and
    batches stay small; padded to three lengths, they batch, at a padding cost the run counts."""
    from tritonkit.loadtests.asyncgen import run_load
    from tritonkit.loadtests.server_stats import breakdown

    load = Load(rate=250, duration_s=3.0, warmup_s=0.5)
    figures = {}
    for name in ("plain", "padded"):
        out = asyncio.run(run_load(lines.endpoints.grpc, name, load))
        assert out.samples and all(s.latency_s is not None for s in out.samples), out.error_examples
        figures[name] = (breakdown(out.stats_before, out.stats_after)["mean_batch"],
                         out.sent_elements / out.real_elements)
    (plain_batch, plain_waste), (padded_batch, padded_waste) = figures["plain"], figures["padded"]
    assert plain_waste == 1.0 and 1.1 < padded_waste < 2.0, figures  # uniform lengths, edges 64/160/320
    assert plain_batch < 1.15 and padded_batch > 1.25 * plain_batch, figures
