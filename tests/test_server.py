"""Against a real tritonserver: the spec's batching fields as Triton loaded them, priorities,
timeouts, queue-full rejection, batching in the python-backend runner, and reload under load."""

from __future__ import annotations

import asyncio
import copy
import threading

import numpy as np
import onnxruntime as ort
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from tests.checks import settled_histogram
from tests.conftest import SERVED_SPEC, write_spec
from tritonkit.clients import AsyncClient, BadInputError, QueueFullError, RequestTimeoutError
from tritonkit.clients.burst import burst
from tritonkit.configs.generate import generate
from tritonkit.configs.loader import load_spec

pytestmark = pytest.mark.server


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_batching_fields_round_trip_through_triton(served, protocol):
    """What Triton reports for the loaded model is what deploy.yaml said, field by field."""
    want = SERVED_SPEC["models"][0]["batching"]
    with served.client(protocol) as c:
        cfg = c.config("all_fields")
    db = cfg.dynamic_batching
    assert list(db.preferred_batch_size) == want["preferred_batch_sizes"]
    assert db.max_queue_delay_microseconds == want["max_queue_delay_us"]
    assert db.priority_levels == want["priority_levels"]
    assert db.default_priority_level == want["default_priority"]
    assert db.preserve_ordering is False
    dq = want["default_queue_policy"]
    assert mc.ModelQueuePolicy.TimeoutAction.Name(db.default_queue_policy.timeout_action) == dq["timeout_action"]
    assert db.default_queue_policy.default_timeout_microseconds == dq["default_timeout_us"]
    assert db.default_queue_policy.allow_timeout_override == dq["allow_timeout_override"]
    assert db.default_queue_policy.max_queue_size == dq["max_queue_size"]
    assert sorted(db.priority_queue_policy) == sorted(want["priority_queue_policies"])
    for level, p in want["priority_queue_policies"].items():
        got = db.priority_queue_policy[level]
        assert mc.ModelQueuePolicy.TimeoutAction.Name(got.timeout_action) == p.get("timeout_action", "REJECT")
        assert got.default_timeout_microseconds == p["default_timeout_us"]
        assert got.allow_timeout_override == p["allow_timeout_override"]
        assert got.max_queue_size == p["max_queue_size"]
    assert cfg.response_cache.enable
    assert cfg.instance_group[0].count == 2
    with served.client(protocol) as c:
        assert c.config("ordered").dynamic_batching.preserve_ordering is True


def test_request_with_priority_and_timeout(served):
    with served.client() as c:
        meta = c.metadata("all_fields")
        x = meta.random_inputs(2, np.random.default_rng(1))
        out = c.infer("all_fields", x, priority=1, timeout_us=1_000_000)
        again = c.infer("all_fields", x, priority=3, timeout_us=500_000)
    assert out["output"].shape == (2, 256)
    np.testing.assert_allclose(out["output"], again["output"], rtol=1e-6)


def test_request_that_outlives_its_timeout_gets_the_timeout_error(served):
    """A 1 us timeout cannot survive the 1.5 ms batching window: Triton rejects it, typed."""
    with served.client() as c:
        x = c.metadata("all_fields").random_inputs(1)
        with pytest.raises(RequestTimeoutError):
            c.infer("all_fields", x, priority=2, timeout_us=1)


def test_bad_shape_is_a_typed_error(served):
    with served.client("http") as c, pytest.raises(BadInputError, match="unexpected shape"):
        c.infer("all_fields", {"input": np.zeros((1, 3), np.float32)})


def test_queue_overflow_gives_queue_full(served):
    """max_queue_size 2 and one busy instance: of 64 simultaneous requests most are turned away
    at once with the queue-full error, and every request is accounted for."""
    result = asyncio.run(burst(served.endpoints.grpc, "tiny_queue", 64, 64))
    assert result.sent == 64
    assert result.errors["queue_full"] > 0, result.examples
    assert result.ok + result.errors["queue_full"] == 64, result.examples
    assert result.ok >= 1


def test_queue_full_is_raised_as_its_type(served):
    async def main():
        async with AsyncClient(served.endpoints.grpc) as c:
            x = (await c.metadata("tiny_queue")).random_inputs(1)
            outcomes = await asyncio.gather(*(c.infer("tiny_queue", x) for _ in range(48)), return_exceptions=True)
        return outcomes

    outcomes = []
    for _ in range(5):  # another burst if a starved client's sends trickled out slower than the model
        outcomes += asyncio.run(main())
        if any(isinstance(o, QueueFullError) for o in outcomes):
            break
    assert any(isinstance(o, QueueFullError) for o in outcomes)
    assert all(isinstance(o, (dict, QueueFullError)) for o in outcomes)


def test_runner_batches_requests_and_groups_different_lengths_without_padding(served):
    """Requests of lengths 3, 5 and 3 arrive in one 20 ms window: the two of length 3 run as one
    batch, the one of length 5 alone, and every mean equals ONNX Runtime's on that request alone."""
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1, n)).astype(np.float32) for n in (3, 5, 3, 3, 5, 3)]

    async def main():
        async with AsyncClient(served.endpoints.grpc) as c:
            return await asyncio.gather(*(c.infer("seq_mean", {"x": x}) for x in xs))

    with served.client() as c:
        before = c.statistics("seq_mean")
        outs = asyncio.run(main())
        hist = settled_histogram(c, "seq_mean", before, len(xs))
    for x, out in zip(xs, outs):
        np.testing.assert_allclose(out["mean"], x.mean(axis=1, keepdims=True), rtol=1e-5)
    print(f"seq_mean batch histogram: {hist}")
    assert sum(size * n for size, n in hist.items()) == len(xs)
    assert max(hist) >= 2, f"no request was batched: {hist}"


def test_a_request_that_fails_at_run_time_fails_alone(served):
    """Four requests share one 20 ms batching window; one carries an id outside the table, so ONNX
    Runtime fails on it. That request gets an error; the other three get correct rows."""
    ids = [np.array([[1, 2]]), np.array([[3, 99]]), np.array([[0, 9]]), np.array([[4, 4]])]

    async def main():
        async with AsyncClient(served.endpoints.grpc) as c:
            return await asyncio.gather(*(c.infer("lookup", {"ids": x}) for x in ids), return_exceptions=True)

    with served.client() as c:
        before = c.statistics("lookup")
        outcomes = asyncio.run(main())
        hist = settled_histogram(c, "lookup", before, len(ids))
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    for x, out in zip(ids, outcomes):
        if 99 in x:
            assert isinstance(out, Exception) and "indices" in str(out).lower(), out
        else:
            np.testing.assert_array_equal(out["rows"], table[x])
    assert hist and max(hist) >= 2, f"the four requests were not batched together: {hist}"


def test_runner_matches_onnxruntime(served, onnx_dir):
    session = ort.InferenceSession(str(onnx_dir / "mlp.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(3).standard_normal((4, 256)).astype(np.float32)
    with served.client() as c:
        got = c.infer("steady", {"input": x})["output"]
    np.testing.assert_allclose(got, session.run(None, {"input": x})[0], rtol=1e-4, atol=1e-5)


def test_reload_with_changed_config_under_load_loses_no_request(served):
    """Rewrite config.pbtxt and reload through model control three times while 8 clients keep
    sending: every request sent gets its answer, and the new config is what Triton serves."""
    stop = asyncio.Event()
    box: dict = {}
    loop = asyncio.new_event_loop()

    def load_thread():
        box["result"] = loop.run_until_complete(
            burst(served.endpoints.grpc, "reloadable", 10_000_000, 8, stop=stop))

    t = threading.Thread(target=load_thread)
    t.start()
    try:
        data = copy.deepcopy(SERVED_SPEC)
        for delay in (3000, 500, 2000):
            data["models"][4]["batching"]["max_queue_delay_us"] = delay
            spec = load_spec(write_spec(served.spec_path.parent, data), served.repo)
            generate(spec, served.repo, models=["reloadable"])
            served.load("reloadable")
            with served.client() as c:
                assert c.config("reloadable").dynamic_batching.max_queue_delay_microseconds == delay
    finally:
        loop.call_soon_threadsafe(stop.set)
        t.join(60)
        loop.close()
        # the spec's own config back in the repository and in force
        generate(load_spec(write_spec(served.spec_path.parent, SERVED_SPEC), served.repo), served.repo,
                 models=["reloadable"])
        served.load("reloadable")
    result = box["result"]
    print(f"reload under load: {result.sent} sent, {result.ok} ok")
    assert result.sent > 50, "the load did not overlap the reloads"
    assert result.ok == result.sent, (dict(result.errors), result.examples)
