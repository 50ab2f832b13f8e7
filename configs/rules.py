"""Every rule a spec must pass before anything is written: one function per rule family.

Most are Triton's own load-time rules (a config that breaks them is refused at load); checking
them here turns a server log line into an error that names the deploy.yaml field and the fix.
"""

from __future__ import annotations

from tritonkit import onnx_io
from tritonkit.configs.pipelines import pipeline_problems
from tritonkit.errors import Problem
from tritonkit.spec import Batching, ModelSpec, QueuePolicy, ServerSpec, Spec, TensorSpec


def spec_problems(spec: Spec, check_onnx: bool = True) -> list[Problem]:
    file = spec.shown
    problems = duplicate_names(file, spec) + server_ports(file, spec.server)
    for i, m in enumerate(spec.models):
        at = f"models[{i}]"
        problems += batching_rules(file, at, m)
        problems += instance_rules(file, at, m)
        io = None
        if check_onnx:
            try:
                io = onnx_io.read_io(spec.onnx_path(m))
            except onnx_io.OnnxReadError as e:
                problems.append(Problem(file, f"{at}.onnx", f"cannot read {spec.onnx_path(m)}: {e}",
                                        "point onnx: at a valid ONNX file (`tritonkit sample-model` writes one)"))
        for kind in ("inputs", "outputs"):
            graph = {t.name: onnx_io.per_sample(t, m.max_batch_size > 0).dims for t in getattr(io, kind, ())}
            for j, t in enumerate(getattr(m, kind) or []):
                dims = t.dims if t.dims is not None else graph.get(t.name)
                if dims is None and io is None:
                    continue  # no graph read yet (`build`): checked once the graph is prepared
                problems += shape_range_rules(file, f"{at}.{kind}[{j}]", t, dims)
                if kind == "inputs":
                    problems += length_rules(file, f"{at}.{kind}[{j}]", t, dims, m)
        problems += crop_rules(file, at, m)
        if io is not None:
            problems += onnx_io.check_against_graph(file, at, m, io)
    return problems + pipeline_problems(spec, served_tensors(spec) if check_onnx else None) + traffic_rules(spec)


def traffic_rules(spec: Spec) -> list[Problem]:
    served = spec.served()
    problems = []
    for name, rps in spec.traffic.items():
        if name not in served:
            problems.append(Problem(spec.shown, f"traffic.{name}", f"no model or pipeline named {name!r}",
                                    f"use one of: {', '.join(served)}"))
        elif not rps > 0:
            problems.append(Problem(spec.shown, f"traffic.{name}", f"{rps!r} requests per second",
                                    "give a rate above 0, e.g. 20"))
    return problems


def served_tensors(spec: Spec):
    """A model's (inputs, outputs) as Triton serves them, None where its graph cannot be read."""
    def tensors(m: ModelSpec) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]] | None:
        try:
            io = onnx_io.read_io(spec.onnx_path(m))
        except onnx_io.OnnxReadError:
            return None
        batched = m.max_batch_size > 0
        try:
            return onnx_io.merged(m.inputs, io.inputs, batched), onnx_io.merged(m.outputs, io.outputs, batched)
        except KeyError:  # a declared tensor the graph lacks: reported by check_against_graph
            return None
    return tensors


def duplicate_names(file: str, spec: Spec) -> list[Problem]:
    problems, seen = [], set()
    for i, m in enumerate(spec.models):
        if m.name in seen:
            problems.append(Problem(file, f"models[{i}].name", f"{m.name!r} is used by more than one model",
                                    "give each model a unique name (it is its folder in the repository)"))
        seen.add(m.name)
    return problems


def server_ports(file: str, server: ServerSpec) -> list[Problem]:
    ports = {"http_port": server.http_port, "grpc_port": server.grpc_port, "metrics_port": server.metrics_port}
    seen: dict[int, str] = {}
    problems = []
    for key, port in ports.items():
        if port and port in seen:
            problems.append(Problem(file, f"server.{key}", f"{port} is also {seen[port]}",
                                    "give each endpoint its own port (0 picks a free one)"))
        seen.setdefault(port, key)
    return problems


def batching_rules(file: str, at: str, m: ModelSpec) -> list[Problem]:
    b: Batching = m.batching
    p = f"{at}.batching"
    problems: list[Problem] = []
    if not b.enabled:
        return problems
    if m.max_batch_size == 0 and b.preferred_batch_sizes:
        problems.append(Problem(file, f"{p}.preferred_batch_sizes", "set, but max_batch_size is 0 (no batch axis)",
                                "remove preferred_batch_sizes or set max_batch_size above 0"))
    else:
        for k, size in enumerate(b.preferred_batch_sizes):
            if size < 1:
                problems.append(Problem(file, f"{p}.preferred_batch_sizes[{k}]", f"{size} is below 1",
                                        "use sizes from 1 to max_batch_size"))
            elif size > m.max_batch_size:
                problems.append(Problem(file, f"{p}.preferred_batch_sizes[{k}]",
                                        f"{size} is above max_batch_size {m.max_batch_size}",
                                        f"lower it to at most {m.max_batch_size} or raise max_batch_size"))
            elif size in b.preferred_batch_sizes[:k]:
                problems.append(Problem(file, f"{p}.preferred_batch_sizes[{k}]", f"{size} is listed twice",
                                        "list each size once"))
    levels = b.priority_levels
    if levels == 0:
        if b.default_priority:
            problems.append(Problem(file, f"{p}.default_priority",
                                    f"{b.default_priority} is set but priority_levels is 0",
                                    "set priority_levels, or remove default_priority"))
        if b.priority_queue_policies:
            problems.append(Problem(file, f"{p}.priority_queue_policies", "set but priority_levels is 0",
                                    "set priority_levels to the number of levels you use"))
    else:
        if not 1 <= b.default_priority <= levels:
            problems.append(Problem(file, f"{p}.default_priority",
                                    f"{b.default_priority} is outside the priority levels 1..{levels}",
                                    f"use a level from 1 (highest) to {levels}"))
        for level in b.priority_queue_policies:
            if not 1 <= level <= levels:
                problems.append(Problem(file, f"{p}.priority_queue_policies.{level}",
                                        f"level {level} is outside the priority levels 1..{levels}",
                                        f"use levels from 1 to {levels}"))
    policies: list[tuple[str, QueuePolicy]] = []
    if b.default_queue_policy:
        policies.append((f"{p}.default_queue_policy", b.default_queue_policy))
    policies += [(f"{p}.priority_queue_policies.{lv}", pol) for lv, pol in b.priority_queue_policies.items()]
    if b.preserve_ordering:
        if levels > 1:
            problems.append(Problem(file, f"{p}.preserve_ordering",
                                    f"cannot be combined with {levels} priority levels (responses would wait "
                                    "behind lower-priority requests)",
                                    "set preserve_ordering: false or priority_levels: 1"))
        for where, pol in policies:
            if pol.timeout_action == "DELAY":
                problems.append(Problem(file, f"{where}.timeout_action",
                                        "DELAY cannot be combined with preserve_ordering",
                                        "use REJECT, or set preserve_ordering: false"))
    for where, pol in policies:
        if pol.default_timeout_us and pol.default_timeout_us <= b.max_queue_delay_us:
            problems.append(Problem(file, f"{where}.default_timeout_us",
                                    f"{pol.default_timeout_us} us is not above max_queue_delay_us "
                                    f"{b.max_queue_delay_us}: requests would time out while the batcher still waits",
                                    f"raise it above {b.max_queue_delay_us} (or lower max_queue_delay_us)"))
    return problems


def instance_rules(file: str, at: str, m: ModelSpec) -> list[Problem]:
    if m.instances.gpus and m.instances.kind == "cpu":
        return [Problem(file, f"{at}.instances.gpus", "set for a cpu instance group",
                        "remove gpus, or set kind: gpu")]
    return []


def shape_range_rules(file: str, at: str, t: TensorSpec, dims: list[int] | None) -> list[Problem]:
    """min/opt/max, `shapes` and `stride` describe per-sample shapes: the rank of `dims` (the spec's,
    else the graph's), ordered, fixed dims unchanged, dynamic dims on the stride; `values` ordered,
    and a constant `value` not mixed with a range of values."""
    problems: list[Problem] = []
    if t.values is not None and t.values[0] > t.values[1]:
        problems.append(Problem(file, f"{at}.values", f"low {t.values[0]:g} is above high {t.values[1]:g}",
                                "write values: [low, high], e.g. [0, 30521] for token ids of a 30522-word vocabulary"))
    if t.values is not None and t.value is not None:
        problems.append(Problem(file, f"{at}.value", "given together with values",
                                "keep value for a constant input, or values for a range"))
    given = {k: getattr(t, k) for k in ("min", "opt", "max") if getattr(t, k) is not None}
    shaped = given or t.shapes or t.stride
    if not shaped:
        return problems
    if dims is None:
        return problems + [Problem(file, f"{at}.dims", "missing, but a shape range (min/opt/max, shapes or "
                                   "stride) is given", "add dims (-1 for dynamic)")]
    named = [*given.items(), *((f"shapes[{k}]", s) for k, s in enumerate(t.shapes or []))]
    for k, shape in named:
        if len(shape) != len(dims):
            problems.append(Problem(file, f"{at}.{k}", f"rank {len(shape)} differs from dims rank {len(dims)}",
                                    f"give {len(dims)} values"))
            continue
        for j, (n, d) in enumerate(zip(shape, dims)):
            if n < 1:
                problems.append(Problem(file, f"{at}.{k}[{j}]", f"{n} is below 1", "use positive sizes"))
            elif d != -1 and n != d:
                problems.append(Problem(file, f"{at}.{k}[{j}]", f"{n} differs from the fixed dim {d}",
                                        f"set it to {d}"))
            elif d == -1 and t.stride and n % t.stride:
                problems.append(Problem(file, f"{at}.{k}[{j}]", f"{n} is not a multiple of stride {t.stride}",
                                        f"use {max(t.stride, n // t.stride * t.stride)} or "
                                        f"{(n // t.stride + 1) * t.stride}"))
            elif k.startswith("shapes") and ((t.min and n < t.min[j]) or (t.max and n > t.max[j])):
                problems.append(Problem(file, f"{at}.{k}[{j}]", f"{n} is outside min..max "
                                        f"{(t.min or dims)[j]}..{(t.max or dims)[j]}", "keep shapes within min..max"))
    if len(given) == 3 and all(len(s) == len(dims) for s in given.values()):
        for j in range(len(dims)):
            lo, mid, hi = t.min[j], t.opt[j], t.max[j]
            if not lo <= mid <= hi:
                problems.append(Problem(file, f"{at}.opt[{j}]", f"min {lo} <= opt {mid} <= max {hi} does not hold",
                                        "order them min <= opt <= max"))
    return problems


def length_rules(file: str, at: str, t: TensorSpec, dims: list[int] | None, m: ModelSpec) -> list[Problem]:
    """`lengths` draws within the input's range along its dynamic dims; `padding` needs a max to
    pad up to, and edges on the stride (a padded length off it would be refused)."""
    dynamic = [j for j, d in enumerate(dims or []) if d == -1]
    if not dynamic:
        if t.lengths is not None:
            return [Problem(file, f"{at}.lengths", "set, but the input has no dynamic dim", "remove lengths")]
        return []
    lo = min(t.min[j] for j in dynamic) if t.min else 1
    hi = min(t.max[j] for j in dynamic) if t.max else None
    problems = []
    L = t.lengths
    if L is not None:
        if L.dist == "histogram":
            drawn = sorted(L.histogram or {})
            if not L.histogram:
                problems.append(Problem(file, f"{at}.lengths.histogram", "missing for dist: histogram",
                                        "give length: weight pairs, e.g. {32: 5, 64: 3, 128: 1}"))
            elif any(w <= 0 for w in L.histogram.values()):
                problems.append(Problem(file, f"{at}.lengths.histogram", "a weight is not above 0",
                                        "give each length a weight above 0"))
        elif L.low is None or L.high is None or L.low > L.high:
            drawn = []
            problems.append(Problem(file, f"{at}.lengths", f"dist {L.dist} needs low <= high",
                                    f"write low and high, e.g. low: {lo}, high: {hi or 4 * lo}"))
        else:
            drawn = [L.low, L.high]
        outside = [n for n in drawn if n < lo or (hi is not None and n > hi)]
        if outside:
            problems.append(Problem(file, f"{at}.lengths", f"{outside[0]} is outside the input's range "
                                    f"{lo}..{hi if hi is not None else 'unbounded'}", "keep lengths within min..max"))
    if m.padding is not None:
        if hi is None:
            problems.append(Problem(file, f"{at}.max", "missing, but the model pads requests (padding)",
                                    "give max: the longest a request may be, the last length padding goes up to"))
        for k, e in enumerate(m.build.bucket_edges):
            if t.stride and e % t.stride:
                problems.append(Problem(file, f"{at.rsplit('.', 1)[0]}.build.bucket_edges[{k}]",
                                        f"{e} is not a multiple of the input's stride {t.stride}: a request padded "
                                        "to it would be refused", f"use multiples of {t.stride}"))
    return problems


def crop_rules(file: str, at: str, m: ModelSpec) -> list[Problem]:
    if m.padding is None or not m.padding.crop:
        return []
    declared = {t.name for t in m.outputs or []}
    problems = []
    for name in m.padding.crop:
        if m.outputs is not None and name not in declared:
            problems.append(Problem(file, f"{at}.padding.crop.{name}", f"no output named {name!r}",
                                    f"use one of: {', '.join(sorted(declared))}"))
    return problems
