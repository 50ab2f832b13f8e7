"""The knobs the tuner (and the sweep) turns, and how a set of them becomes a spec variant (and so
a config.pbtxt).

Everything goes through the spec and `configs.generate`, the one place where config.pbtxt is
written and checked, so a tuned config obeys every rule a hand-written one does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from tritonkit.input_rules import edges_text
from tritonkit.spec import ModelSpec, QueuePolicy, Spec
from tritonkit.tuner.rules import RULES, Rules


@dataclass(frozen=True)
class Knobs:
    """max_batch 0: a model without a batch axis (a stateful model, one with a data-dependent
    output): Triton batches nothing there, so instances are its only knob."""

    max_batch: int
    delay_us: int
    instances: int = 1
    # The queue policies in force, and only these: None is no policy (an unbounded queue), never the
    # spec's, so that a trial measures the batching alone and no policy the tuner never checked
    # stays in force. The tuner sets one that protects the SLO last (tuner/protect.py), with the
    # policies of the levels above the default one.
    queue: QueuePolicy | None = None
    level_queues: tuple[tuple[int, QueuePolicy], ...] = ()
    # None: the tuner's rule below; the sweep keeps the spec's sizes that fit the max batch
    preferred_sizes: tuple[int, ...] | None = None
    # The length-bucket edges requests are padded up to (`build.bucket_edges`; () pads every request
    # to the max): None keeps the spec's. Padding happens where requests are made, so an edge set is
    # put in force by the config's input rules alone; a TensorRT engine wants a rebuild to get one
    # profile per edge.
    edges: tuple[int, ...] | None = None

    @property
    def preferred(self) -> list[int]:
        if self.preferred_sizes is not None:
            return list(self.preferred_sizes)
        # Dispatch as soon as a full batch is there; otherwise the delay decides.
        return [self.max_batch] if self.max_batch > 1 else []

    @property
    def batching(self) -> bool:
        return self.max_batch > 0

    @property
    def schedule(self) -> tuple[int, int, int]:
        """How it batches (max batch, delay, instances), whatever queue policy it carries: what a
        search's verdicts compare, as the policy is set after the search."""
        return self.max_batch, self.delay_us, self.instances

    @property
    def items(self) -> int:
        """Requests one execution serves at most (1 without a batch axis)."""
        return max(1, self.max_batch)

    def label(self) -> str:
        if not self.batching:
            return f"no batch axis x{self.instances}"
        q = f" queue {_queue_label(self.queue)}" if self.queue else ""
        q += "".join(f" p{lv} {_queue_label(p)}" for lv, p in self.level_queues)
        return f"batch {self.max_batch:>2} delay {self.delay_us:>5} us x{self.instances}{q}{self._edges_label()}"

    def _edges_label(self) -> str:
        return "" if self.edges is None else f" pad {edges_text(self.edges)}"

    def model(self, m: ModelSpec) -> ModelSpec:
        if self.edges is not None:
            m = m.model_copy(update={"build": m.build.model_copy(update={"bucket_edges": list(self.edges)})})
        instances = m.instances.model_copy(update={"count": self.instances})
        if not self.batching:
            return m.model_copy(update={"instances": instances})
        update = {"preferred_batch_sizes": self.preferred, "max_queue_delay_us": self.delay_us,
                  "default_queue_policy": self.queue, "priority_queue_policies": dict(self.level_queues)}
        batching = m.batching.model_copy(update=update)
        return m.model_copy(update={"max_batch_size": self.max_batch, "batching": batching, "instances": instances})

    def apply(self, spec: Spec, model: str) -> Spec:
        return spec.with_model(self.model(spec.model(model)))

    def to_json(self) -> dict:
        out = {"max_batch_size": self.max_batch, "max_queue_delay_us": self.delay_us, "instances": self.instances,
               "preferred_batch_sizes": self.preferred}
        if self.queue is not None:
            out["default_queue_policy"] = self.queue.model_dump()
        if self.level_queues:
            out["priority_queue_policies"] = {lv: p.model_dump() for lv, p in self.level_queues}
        if self.edges is not None:
            out["bucket_edges"] = list(self.edges)
        return out

    @classmethod
    def from_json(cls, d: dict) -> Knobs:
        """The knobs a record's `to_json` wrote (a bench's written config, judged again later)."""
        levels = d.get("priority_queue_policies") or {}
        knobs = cls(d["max_batch_size"], d["max_queue_delay_us"], d["instances"],
                    queue=None if d.get("default_queue_policy") is None else
                    QueuePolicy.model_validate(d["default_queue_policy"]),
                    level_queues=tuple((int(lv), QueuePolicy.model_validate(p)) for lv, p in levels.items()),
                    edges=None if d.get("bucket_edges") is None else tuple(d["bucket_edges"]))
        # sizes the default rule gives stay the rule's, so a round trip returns equal knobs
        sizes = tuple(d.get("preferred_batch_sizes", knobs.preferred))
        return knobs if list(sizes) == knobs.preferred else replace(knobs, preferred_sizes=sizes)


def _queue_label(q: QueuePolicy) -> str:
    if not q.max_queue_size and not q.default_timeout_us:
        return "unbounded"
    size = q.max_queue_size or "-"
    return f"{size}/{q.default_timeout_us / 1000:g}ms"


def from_spec(m: ModelSpec) -> Knobs:
    return Knobs(m.max_batch_size, m.batching.max_queue_delay_us, m.instances.count)


def max_instances() -> int:
    return max(1, os.cpu_count() or 1)


def powers_of_two(bound: int) -> list[int]:
    """The batch ladder every search and sweep uses: 1, 2, 4 ... up to `bound`."""
    sizes, b = [], 1
    while b <= bound:
        sizes.append(b)
        b *= 2
    return sizes


def neighbours(k: Knobs, bound: int, most_instances: int | None = None, rules: Rules = RULES) -> list[Knobs]:
    """One step along each knob: batch x2 and /2, delay up or down the ladder, one instance more or
    less (at most `most_instances`, default this machine's cores)."""
    out = []
    if k.batching:
        for b in (k.max_batch * 2, k.max_batch // 2):
            if 1 <= b <= bound:
                out.append(replace(k, max_batch=b))
        ladder = rules.delays_us
        i = _ladder_index(k.delay_us, ladder)
        for j in (i + 1, i - 1, i - 2):  # two rungs down too: under load, queueing fills batches anyway
            if 0 <= j < len(ladder):
                out.append(replace(k, delay_us=ladder[j]))
    for n in (k.instances + 1, k.instances - 1):
        if 1 <= n <= (most_instances or max_instances()):
            out.append(replace(k, instances=n))
    return out


def _ladder_index(delay_us: int, ladder: tuple[int, ...]) -> int:
    return min(range(len(ladder)), key=lambda j: abs(ladder[j] - delay_us))


def on_ladder(delay_us: int, rules: Rules = RULES) -> int:
    return rules.delays_us[_ladder_index(delay_us, rules.delays_us)]


def grid(batches, delays=RULES.delays_us, instances=None,
         preferred_of: Callable[[int], list[int]] | None = None) -> list[Knobs]:
    """Every combination of the knobs' values, delay by delay, batch by batch: what an exhaustive
    search measures (`tritonkit bench tuner`) and what the batch-size sweep runs (one instance
    count, the spec's preferred sizes that fit each max batch)."""
    return [Knobs(b, d, i, preferred_sizes=None if preferred_of is None else tuple(preferred_of(b)))
            for i in (instances or range(1, max_instances() + 1)) for d in delays for b in batches]
