"""The queue policy that protects the SLO under overload, derived from measured times, and the
overload check that gates it: a policy is written only after it held at 1.5x and 3x capacity.

An accepted request costs its queue wait, its batch's compute and the client/network overhead,
so the queue may hold it for at most `SLO - compute(B) - overhead`, the queue budget; the queue
is as long as the server drains in that budget, so a full queue rejects at once instead of
accepting a request that will be late. Interactive levels (above the default priority) come
first, so their queue drains at the whole capacity; the default level shares it.

On a server whose batcher stalls behind a full queue (`tritonkit probe`, tritonkit/server_traits.py),
the levels above the default keep timeouts but no size limit: their arrivals are what wakes the
batcher while the default level's full queue turns work away, and the instance count is raised
to the one the probe found safe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tritonkit.loadtests.load import RequestClass
from tritonkit.server_traits import ServerTraits
from tritonkit.slo import meets
from tritonkit.spec import Batching, QueuePolicy
from tritonkit.tuner.knobs import Knobs, max_instances
from tritonkit.tuner.rules import RULES, Rules
from tritonkit.tuner.trials import Trial


@dataclass(frozen=True)
class Budget:
    slo_ms: float
    compute_ms: float  # one execution at the chosen batch, from Triton's statistics (the cost model)
    overhead_ms: float  # client and network, measured: what the client saw minus what Triton did

    @property
    def queue_ms(self) -> float:
        return self.slo_ms - self.compute_ms - self.overhead_ms

    def describe(self) -> str:
        return (f"queue budget {self.queue_ms:.1f} ms = SLO {self.slo_ms:g} - compute {self.compute_ms:.1f} "
                f"- overhead {self.overhead_ms:.1f}")


def measured_overhead_ms(trials: list[Trial]) -> float:
    """The median client/network overhead over the trials that measured one (0 if none did)."""
    values = sorted(t.overhead_ms for t in trials if t.overhead_ms is not None and t.overhead_ms >= 0)
    return values[len(values) // 2] if values else 0.0


def classes_for(b: Batching) -> list[RequestClass]:
    """The traffic of an overload check: interactive ahead of bulk where the model has priority levels."""
    if b.priority_levels < 2:
        return [RequestClass()]
    return [RequestClass("interactive", weight=1, priority=1),
            RequestClass("bulk", weight=3, priority=b.default_priority)]


def protect(k: Knobs, b: Batching, budget: Budget, capacity_rps: float,
            traits: ServerTraits | None, rules: Rules = RULES) -> tuple[Knobs | None, str]:
    """The winner with its protective policy, and what was decided; None when no policy can help."""
    if budget.queue_ms <= 0:
        return None, f"no queue policy: {budget.describe()} leaves nothing to queue in"
    stalls = traits is not None and traits.stalls
    if stalls and traits.safe_instances is None:
        return None, (f"no queue policy: on Triton {traits.version} a bounded queue stalled the batcher with every "
                      f"instance count the probe tried (docs/overload.md)")
    timeout_us = int(budget.queue_ms * 1e3)
    drained = capacity_rps * budget.queue_ms / 1e3  # requests the server serves within the budget
    default_level = b.default_priority if b.priority_levels else 0
    above = list(range(1, default_level))  # levels served before the default one

    def bounded(share: float) -> QueuePolicy:
        size = max(k.items, math.floor(drained * share))
        return QueuePolicy(timeout_action="REJECT", default_timeout_us=timeout_us, allow_timeout_override=True,
                           max_queue_size=size)

    default = bounded(rules.default_share if above else 1.0)
    levels = []
    for lv in above:
        policy = bounded(1.0)
        if stalls:
            policy = policy.model_copy(update={"max_queue_size": 0})  # the batcher's wake-up (module doc)
        levels.append((lv, policy))
    instances = k.instances
    notes = [budget.describe()]
    if stalls:
        want = traits.safe_instances or 2
        instances = min(max(k.instances, want), max_instances())
        if instances != k.instances:
            notes.append(f"{instances} instances: Triton {traits.version} stalls a bounded queue on fewer "
                         "(tritonkit probe)")
    return replace(k, queue=default, level_queues=tuple(levels), instances=instances), "; ".join(notes)


def tightened(k: Knobs) -> Knobs:
    """The adjustment after a failed check: half the queue, so what is accepted waits half as long."""
    def half(q: QueuePolicy) -> QueuePolicy:
        size = max(k.items, q.max_queue_size // 2) if q.max_queue_size else 0
        return q.model_copy(update={"max_queue_size": size, "default_timeout_us": q.default_timeout_us // 2})
    return replace(k, queue=half(k.queue), level_queues=tuple((lv, half(q)) for lv, q in k.level_queues))


def overload_holds(t: Trial, capacity: float, slo_p95_ms: float, goodput: float = RULES.overload_goodput) -> bool:
    """Did a config keep serving about its capacity within the SLO while more load arrived (the
    rest rejected fast)? Triton 2.51's batcher can collapse instead."""
    return meets(t.p95_ms, slo_p95_ms) and t.ok_rps >= goodput * capacity
