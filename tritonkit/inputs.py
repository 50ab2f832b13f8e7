"""What a model's requests look like, and the one sampler that makes them.

Every generated request comes from `Sampler`: warm-up, `infer`, both load generators, the sweep
and the tuner, so that what is measured is what production sends. A model's input rules come
from the spec (`inputs:` with min/opt/max, stride, shapes, values, value) and travel in its
config.pbtxt as the parameter `tritonkit_inputs`, so a client that has only the server (a Locust
worker, the online tuner) samples the same way, and the runner refuses shapes outside the range.

Shapes: a per-sample shape drawn from `shapes` when given, else `opt` (never 1 for a dynamic dim
that has a range), every dynamic dim a multiple of `stride`. Values: floats standard-normal;
integers and booleans uniform within `values` (inclusive) when given, else zero, which cannot
index past an embedding; `value` makes an input a constant (a sample rate). Real data, from
perf_analyzer's `--input-data` JSON or a folder of .npy files, replaces the draw: requests cycle
through the samples.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

from tritonkit.errors import input_error
from tritonkit.input_rules import CROP_PARAMETER, PARAMETER, InputRule


def crop_from_config(cfg) -> dict[str, tuple[int, int]]:
    """The outputs a padded request's answer is cut back along (name -> (dim, per)): none where
    the config says none, or the kit did not write it."""
    param = cfg.parameters.get(CROP_PARAMETER)
    if param is None or not param.string_value:
        return {}
    return {name: (int(dim), int(per)) for name, (dim, per) in json.loads(param.string_value).items()}


def rules_from_config(cfg) -> list[InputRule]:
    """The rules in a ModelConfig: the kit's parameter when it wrote the config, else what the
    config's dims say (a config the kit did not write)."""
    param = cfg.parameters.get(PARAMETER)
    if param is not None and param.string_value:
        return [InputRule.from_json(d) for d in json.loads(param.string_value)]
    from tritonclient.grpc import model_config_pb2 as mc

    rules = []
    for t in cfg.input:
        dims = tuple(t.reshape.shape) if t.HasField("reshape") else tuple(t.dims)
        rules.append(InputRule(t.name, mc.DataType.Name(t.data_type).removeprefix("TYPE_"), dims))
    return rules


class Sampler:
    """Request inputs for one model: `sampler(batch)` gives arrays ready to send."""

    def __init__(self, rules: list[InputRule], batched: bool, samples: list[dict[str, np.ndarray]] | None = None,
                 rng: np.random.Generator | None = None):
        self.rules, self.batched, self.samples = rules, batched, samples or []
        self.rng = rng or np.random.default_rng(0)
        self._next = 0
        self.real_elements = self.sent_elements = 0  # of every array made: padding's waste is their ratio

    @property
    def varies(self) -> bool:
        """Do successive requests differ in more than their random values (real data, several
        shapes, a length distribution)?"""
        return bool(self.samples) or any((r.shapes and len(r.shapes) > 1) or r.lengths for r in self.rules)

    def shape(self, rule: InputRule, length: int | None = None) -> tuple[int, ...]:
        if rule.shapes:
            return rule.shapes[int(self.rng.integers(len(rule.shapes)))]
        if length is not None and rule.lengths:
            return tuple(length if d == -1 else d for d in rule.dims)
        return rule.default_shape()

    def length(self) -> int | None:
        """One request's length, shared by every input with `lengths` (ids and mask of one sequence)."""
        rule = next((r for r in self.rules if r.lengths), None)
        return None if rule is None else draw_length(rule, self.rng)

    def _draw(self, rule: InputRule, shape: tuple[int, ...]) -> np.ndarray:
        return draw(rule, shape, self.rng)

    def spread(self, count: int) -> list[dict[str, np.ndarray]]:
        """`count` requests of one sample that stand for the traffic as a set (a client that cycles
        through a few payloads, perf_analyzer's): where lengths vary, one at each of `count`
        quantiles of their distribution. Sixteen lengths drawn at random miss its mean by a fifth
        often enough to mislead a measurement of the padding or of the compute."""
        rule = next((r for r in self.rules if r.lengths), None)
        if rule is None or self.samples:
            return [self(1) for _ in range(count)]
        return [self(1, n) for n in spread_lengths(rule, count, self.rng)]

    def __call__(self, batch: int = 1, length: int | None = None) -> dict[str, np.ndarray]:
        """`length`: of the dynamic dims of the inputs with `lengths` (default: one drawn)."""
        if self.samples:
            return self._real(batch)
        out = {}
        length = self.length() if length is None else length
        shapes = {r.name: self.shape(r, length) for r in self.rules}
        lead = (batch,) if self.batched else ()
        for r in self.rules:
            per_sample = shapes[r.name] or (1,)  # a scalar travels as [1]
            a = self._draw(r, lead + tuple(per_sample))
            self.real_elements += a.size
            out[r.name] = pad(r, a, len(lead))
            self.sent_elements += out[r.name].size
        return out

    def _real(self, batch: int) -> dict[str, np.ndarray]:
        """The next `batch` samples, stacked on the batch axis (cycling through the file). One
        request holds one shape: a sample of another shape is left for the next request, and the
        batch is filled with copies of its first sample."""
        first = self._padded(self.samples[self._next % len(self.samples)])
        self._next += 1
        if not self.batched:
            return dict(first)
        picked = [first]
        while len(picked) < batch:
            nxt = self._padded(self.samples[self._next % len(self.samples)])
            if any(nxt[n].shape != first[n].shape for n in first):
                picked += [first] * (batch - len(picked))
                break
            picked.append(nxt)
            self._next += 1
        return {name: np.stack([p[name] for p in picked]) for name in first}

    def _padded(self, sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A real sample as padding sends it: real requests of one bucket then share a shape."""
        by_name = {r.name: r for r in self.rules}
        out = {}
        for name, a in sample.items():
            out[name] = pad(by_name[name], a, 0) if name in by_name else a
            self.real_elements += a.size
            self.sent_elements += out[name].size
        return out


def draw(rule: InputRule, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """One input's values by its rule: the constant `value`, integers and booleans uniform within
    `values` (else zero), floats standard-normal."""
    dtype = rule.numpy_dtype
    if rule.value is not None:
        return np.full(shape, rule.value, dtype=dtype)
    if dtype is np.object_:
        return np.full(shape, b"x", dtype=np.object_)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if rule.values is not None:
        low, high = int(rule.values[0]), int(rule.values[1])
        return rng.integers(low, high + 1, shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def draw_length(rule: InputRule, rng: np.random.Generator) -> int:
    """A length from the rule's distribution, on its stride (rounded up, within the high bound)."""
    kind, *args = rule.lengths
    step = rule.stride or 1
    if kind == "histogram":
        lengths = [n for n, _ in args[0]]
        weights = np.array([w for _, w in args[0]], dtype=float)
        n = int(lengths[int(rng.choice(len(lengths), p=weights / weights.sum()))])
        return -(-n // step) * step
    low, high = args
    grid = np.arange(-(-low // step) * step, high + 1, step)  # the lengths the stride allows
    if kind == "uniform":
        return int(grid[int(rng.integers(len(grid)))])
    n = float(np.exp(rng.uniform(np.log(low), np.log(high + 1))))  # log-uniform: short ones common
    return int(grid[min(int(np.searchsorted(grid, n)), len(grid) - 1)])


def spread_lengths(rule: InputRule, count: int, rng: np.random.Generator, draws: int = 4096) -> list[int]:
    """`count` lengths at the quantiles (i + 0.5) / count of the rule's distribution, shuffled."""
    drawn = np.sort([draw_length(rule, rng) for _ in range(draws)])
    picks = [int(drawn[int((i + 0.5) / count * draws)]) for i in range(count)]
    rng.shuffle(picks)
    return picks


def pad(rule: InputRule, a: np.ndarray, lead: int = 1) -> np.ndarray:
    """`a` (with `lead` leading batch axes) padded with the rule's value along its dynamic dims up
    to the length padding sends them at; unchanged where the rule does not pad."""
    if not rule.pad_to:
        return a
    widths = [(0, 0)] * lead
    for j, d in enumerate(rule.dims):
        n = a.shape[lead + j]
        widths.append((0, rule.padded_length(n) - n) if d == -1 else (0, 0))
    if all(w == (0, 0) for w in widths):
        return a
    return np.pad(a, widths, constant_values=np.asarray(rule.pad_value or 0, dtype=a.dtype))


def sampler_for(rules: list[InputRule], batched: bool, input_data: Path | None = None, seed: int = 0) -> Sampler:
    samples = read_input_data(input_data, rules) if input_data else None
    return Sampler(rules, batched, samples, np.random.default_rng(seed))


# -- real request data ------------------------------------------------------------------------------

def read_input_data(path: Path, rules: list[InputRule]) -> list[dict[str, np.ndarray]]:
    """Samples from perf_analyzer's real-data JSON (`{"data": [{"IN": [..] | {"content": [..],
    "shape": [..]} | {"b64": ".."}}, ...]}`, shapes per sample) or a folder with `NAME.npy` per
    input (axis 0 = samples) or `NAME/*.npy` (one sample a file). Every sample is checked against
    the rules; an InputError names the file, the sample and the fix."""
    path = Path(path)
    where = str(path)
    if path.is_dir():
        samples = _read_npy_folder(path, rules)
    elif path.is_file():
        samples = _read_json(path, rules)
    else:
        raise input_error("command line", "--input-data", f"{path} does not exist",
                          "give perf_analyzer's JSON file or a folder of NAME.npy files")
    if not samples:
        raise input_error(where, "data", "no samples", "add at least one sample")
    for i, sample in enumerate(samples):
        for r in rules:
            if r.name not in sample:
                raise input_error(where, f"data[{i}].{r.name}", "missing",
                                  f"give every input: {[x.name for x in rules]}")
            a = sample[r.name]
            shape = tuple(a.shape) if r.dims else ()
            why = r.out_of_range(shape) if r.dims else (None if a.size == 1 else f"{a.size} values for a scalar")
            if why:
                raise input_error(where, f"data[{i}].{r.name}", f"shape {list(a.shape)}: {why}",
                                  "send shapes within the model's range (per sample, no batch axis)")
            sample[r.name] = (a.reshape(1) if not r.dims else a).astype(r.numpy_dtype, copy=False)
    return samples


def _read_json(path: Path, rules: list[InputRule]) -> list[dict[str, np.ndarray]]:
    try:
        doc = json.loads(path.read_text())
        entries = doc["data"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise input_error(str(path), "data", f"not perf_analyzer's input-data JSON ({e})",
                          'write {"data": [{"INPUT": {"content": [...], "shape": [...]}}, ...]}') from None
    by_name = {r.name: r for r in rules}
    samples = []
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        sample = {}
        for name, item in entry.items():
            r = by_name.get(name)
            if r is None:
                raise input_error(str(path), f"data[{i}].{name}", "is not an input of the model",
                                  f"use the inputs: {list(by_name)}")
            sample[name] = _decode(item, r, f"data[{i}].{name}", str(path))
        samples.append(sample)
    return samples


def _decode(item, r: InputRule, at: str, where: str) -> np.ndarray:
    dtype = r.numpy_dtype
    shape = None
    if isinstance(item, dict):
        shape = item.get("shape")
        if "b64" in item:
            flat = np.frombuffer(base64.b64decode(item["b64"]), dtype=dtype)
        elif "content" in item:
            flat = np.asarray(item["content"], dtype=dtype).reshape(-1)
        else:
            raise input_error(where, at, "has neither content nor b64", 'write {"content": [...], "shape": [...]}')
    else:
        flat = np.asarray(item, dtype=dtype).reshape(-1)
    if shape is None:
        if -1 in r.dims:
            raise input_error(where, at, "has no shape and the input has dynamic dims", 'add "shape": [...] per sample')
        shape = list(r.dims) or [1]
    try:
        return flat.reshape(shape)
    except ValueError:
        raise input_error(where, at, f"{flat.size} values do not fill the shape {shape}",
                          "give as many values as the shape holds") from None


def _read_npy_folder(path: Path, rules: list[InputRule]) -> list[dict[str, np.ndarray]]:
    columns: dict[str, list[np.ndarray]] = {}
    for r in rules:
        stacked, folder = path / f"{r.name}.npy", path / r.name
        if stacked.is_file():
            columns[r.name] = list(np.load(stacked, allow_pickle=False))
        elif folder.is_dir():
            columns[r.name] = [np.load(f, allow_pickle=False) for f in sorted(folder.glob("*.npy"))]
        else:
            raise input_error(str(path), r.name, "no data for this input",
                              f"add {r.name}.npy (samples on axis 0) or {r.name}/*.npy (one sample a file)")
    counts = {len(v) for v in columns.values()}
    if len(counts) != 1:
        raise input_error(str(path), "data", f"the inputs have different sample counts {sorted(counts)}",
                          "give every input the same number of samples")
    return [{name: col[i] for name, col in columns.items()} for i in range(counts.pop())]
