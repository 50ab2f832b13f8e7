"""Triton python-backend model that runs an ONNX file with ONNX Runtime (copied in as model.py).

The dynamic batcher hands `execute` several requests at once. Requests whose per-sample shapes
and dtypes agree are concatenated on the batch axis and run as one ONNX Runtime call, then the
outputs are split back per request: that single call is where batching saves time. Requests with
different dynamic dims run as separate groups; they are never padded, because padding changes
results unless the model masks it. A request that cannot run gets its own error response; the
others in the batch still succeed, and the stub never raises out of execute.

Before anything runs, each request's per-sample shapes are checked against the input rules the
config carries (`tritonkit_inputs`: min/max and stride, see tritonkit/inputs.py), so one request
above the range cannot take the box's memory; it gets an error naming the input and the limit.
The rule is the kit's own (tritonkit/input_rules.py, copied in beside this file). A rank-0
input arrives as Triton's reshape left it and is fed to ONNX Runtime as rank 0.
"""

import json
import os
import time

import numpy as np
import runner_timings as rt  # copied in beside this file (tritonkit/runner_timings.py)
import triton_python_backend_utils as pb_utils
from input_rules import PARAMETER, InputRule  # copied in beside this file (tritonkit/input_rules.py)
from ort_session import open_session  # copied in beside this file (tritonkit/ort_session.py)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = open_session(path, int(params.get("intra_op_threads", "1") or 1))
        self.input_names = [i["name"] for i in config["input"]]
        self.output_names = [o["name"] for o in config["output"]]
        self.batched = config.get("max_batch_size", 0) > 0
        rules = json.loads(params.get(PARAMETER) or "[]")
        self.rules = {r["name"]: InputRule.from_json(r) for r in rules}
        self.verdicts = {}  # (input, per-sample shape) -> why it may not be served, None when it may
        # None unless `tritonkit bench serving` asks for them (runner_timings.ENV)
        self.timings = rt.counters(args["model_instance_name"])

    def _run(self, feeds):
        if self.timings is None:
            return self.session.run(self.output_names, feeds)
        t0 = time.perf_counter_ns()
        try:
            return self.session.run(self.output_names, feeds)
        finally:
            self.timings[rt.ORT_CALLS] += 1
            self.timings[rt.ORT_NS] += time.perf_counter_ns() - t0

    def _read(self, request):
        # One pass over the request's tensors (get_input_tensor_by_name walks them once per name).
        feeds = {t.name(): t.as_numpy() for t in request.inputs()}
        for name in self.input_names:
            if name not in feeds:
                raise ValueError(f"input {name!r} is missing")
        for name, rule in self.rules.items():
            feeds[name] = self._checked(name, rule, feeds[name])
        if self.batched and len(feeds) > 1:
            sizes = {a.shape[0] for a in feeds.values()}
            if len(sizes) != 1:
                raise ValueError(f"inputs disagree on the batch size: {sorted(sizes)}")
        return feeds

    def _checked(self, name, rule, array):
        if not rule.dims:  # a scalar: Triton sends [1] per sample, the graph wants rank 0
            return array.reshape(array.shape[:1] if self.batched else ())
        shape = array.shape[1:] if self.batched else array.shape
        # The verdict depends on the shape alone: decided once per shape seen, not per request.
        why = self.verdicts.get((name, shape), _UNSEEN)
        if why is _UNSEEN:
            if len(self.verdicts) >= _VERDICTS_KEPT:
                self.verdicts.clear()
            why = self.verdicts[(name, shape)] = rule.out_of_range(tuple(shape))
        if why:
            raise ValueError(f"unexpected shape for input {name!r}: {why}")
        return array

    def _key(self, feeds):
        # Requests can share one call only if every input matches in dtype and per-sample shape.
        return tuple((n, a.dtype.str, a.shape[1:] if self.batched else a.shape) for n, a in feeds.items())

    def _respond(self, outputs):
        # Without a batch axis a rank-0 output is dims [1] to Triton (no reshape is allowed there).
        # A row range of ORT's C-contiguous output is contiguous already: handed over as a view, the
        # one copy is the backend's into shared memory.
        if not self.batched:
            outputs = [np.ascontiguousarray(np.atleast_1d(o)) for o in outputs]
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor(n, o if o.flags.c_contiguous else np.ascontiguousarray(o))
            for n, o in zip(self.output_names, outputs)])

    def _run_alone(self, i, feeds):
        try:
            return i, self._respond(self._run(feeds))
        except Exception as e:  # noqa: BLE001 - ORT raises many types; each becomes a Triton error
            return i, _error(e)

    def _run_group(self, members):
        """members: [(index, feeds)]. Returns [(index, response)]."""
        if len(members) == 1 or not self.batched:  # nothing to join: the request's own arrays go in
            return [self._run_alone(i, feeds) for i, feeds in members]
        feeds = {n: np.concatenate([f[n] for _, f in members]) for n in self.input_names}
        try:
            outputs = self._run(feeds)
        except Exception:  # noqa: BLE001
            # One bad request must not fail its neighbours: fall back to running each alone.
            return [self._run_alone(i, f) for i, f in members]
        out, start = [], 0
        for i, f in members:  # each request's rows, as views of the batch's outputs
            end = start + len(f[self.input_names[0]])
            out.append((i, self._respond([o[start:end] for o in outputs])))
            start = end
        return out

    def execute(self, requests):
        t0 = time.perf_counter_ns()
        responses = self._execute(requests)
        if self.timings is not None:
            self.timings[rt.EXECUTES] += 1
            self.timings[rt.REQUESTS] += len(requests)
            self.timings[rt.EXECUTE_NS] += time.perf_counter_ns() - t0
        return responses

    def _execute(self, requests):
        responses = [None] * len(requests)
        groups = {}
        for i, request in enumerate(requests):
            try:
                feeds = self._read(request)
            except Exception as e:  # noqa: BLE001
                responses[i] = _error(e)
                continue
            groups.setdefault(self._key(feeds), []).append((i, feeds))
        for members in groups.values():
            for i, response in self._run_group(members):
                responses[i] = response
        return responses

    def finalize(self):
        self.session = None


_UNSEEN = object()
_VERDICTS_KEPT = 4096  # distinct (input, shape) verdicts kept; a model of many lengths starts over


def _error(exc):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{type(exc).__name__}: {exc}"))
