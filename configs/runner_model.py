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
        feeds = {}
        for name in self.input_names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise ValueError(f"input {name!r} is missing")
            array = tensor.as_numpy()
            rule = self.rules.get(name)
            if rule is not None:
                array = self._checked(name, rule, array)
            feeds[name] = array
        if self.batched:
            sizes = {a.shape[0] for a in feeds.values()}
            if len(sizes) != 1:
                raise ValueError(f"inputs disagree on the batch size: {sorted(sizes)}")
        return feeds

    def _checked(self, name, rule, array):
        if not rule.dims:  # a scalar: Triton sends [1] per sample, the graph wants rank 0
            return array.reshape(array.shape[:1] if self.batched else ())
        why = rule.out_of_range(tuple(array.shape[1:] if self.batched else array.shape))
        if why:
            raise ValueError(f"unexpected shape for input {name!r}: {why}")
        return array

    def _key(self, feeds):
        # Requests can share one call only if every input matches in dtype and per-sample shape.
        return tuple((n, a.dtype.str, a.shape[1:] if self.batched else a.shape) for n, a in feeds.items())

    def _respond(self, outputs):
        # Without a batch axis a rank-0 output is dims [1] to Triton (no reshape is allowed there).
        fit = np.atleast_1d if not self.batched else np.asarray
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor(n, np.ascontiguousarray(fit(o))) for n, o in zip(self.output_names, outputs)])

    def _run_group(self, members):
        """members: [(index, feeds)]. Returns [(index, response)]."""
        if len(members) == 1 or not self.batched:
            out = []
            for i, feeds in members:
                try:
                    out.append((i, self._respond(self._run(feeds))))
                except Exception as e:  # noqa: BLE001 - ORT raises many types; each becomes a Triton error
                    out.append((i, _error(e)))
            return out
        feeds = {n: np.concatenate([f[n] for _, f in members]) for n in self.input_names}
        try:
            outputs = self._run(feeds)
        except Exception:  # noqa: BLE001
            # One bad request must not fail its neighbours: fall back to running each alone.
            return [r for m in members for r in self._run_group([m])]
        bounds = np.cumsum([next(iter(f.values())).shape[0] for _, f in members])[:-1]
        parts = [np.split(o, bounds) for o in outputs]
        return [(i, self._respond([p[k] for p in parts])) for k, (i, _) in enumerate(members)]

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


def _error(exc):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{type(exc).__name__}: {exc}"))
