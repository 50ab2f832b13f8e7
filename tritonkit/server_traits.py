"""What the target tritonserver does with a bounded queue, as measured by `tritonkit probe`, and the
one rule that turns it into a warning. Cached per server version; reading it starts nothing.

Why a probe: on Triton 2.51 (core r24.10) a queue policy or any priority level turns the dynamic
batcher's prefetch off (`scheduler_utils.cc`, `support_prefetching_`). The batcher then forms a
batch only while an instance waits for one (`rate_limiter.cc`, `PayloadSlotAvailable`), and the
instance's "done" signal reaches it before the instance waits again (`payload.cc` `Callback()`,
then `backend_model_instance.cc` `BackendThread` re-parks). Only a request that enters the queue
wakes it after that; one refused by a full queue returns before the wake-up
(`dynamic_batch_scheduler.cc` `Enqueue`), so the batcher sleeps its 500 ms default wait
(`BatcherThread`, `default_wait_microseconds`) while the instance idles. Whether a given server
does this is measured, not assumed from its version number.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tritonkit.files import write_bytes_atomic
from tritonkit.spec import Batching, ModelSpec

CACHE_ENV = "TRITONKIT_CACHE"


@dataclass(frozen=True)
class ServerTraits:
    version: str
    stalls: bool  # one instance behind a bounded queue lost most of its capacity, or idled 500 ms
    # The fewest instances with which a bounded queue kept serving under overload; None: none tried held
    safe_instances: int | None
    probed_at: str = ""
    evidence: dict = field(default_factory=dict)

    def describe(self) -> str:
        if not self.stalls:
            return f"Triton {self.version}: a bounded queue keeps serving under overload (probed {self.probed_at})"
        fix = (f"held with {self.safe_instances} instances" if self.safe_instances
               else "held with no instance count tried")
        return f"Triton {self.version}: a bounded queue on one instance stalls the batcher; it {fix} " \
               f"(probed {self.probed_at})"


def prefetch_off(b: Batching) -> bool:
    """Triton turns the batcher's prefetch off for any priority level and any queue policy field."""
    def set_(q) -> bool:
        return q is not None and bool(q.max_queue_size or q.default_timeout_us or q.allow_timeout_override)
    return b.priority_levels > 0 or set_(b.default_queue_policy) or any(map(set_, b.priority_queue_policies.values()))


def stall_risk(m: ModelSpec, traits: ServerTraits | None) -> str | None:
    """The warning for a model whose config stalls on this server, with what to do; None if it is safe
    (or the server was never probed: `configs`/`validate` say so separately)."""
    if traits is None or not traits.stalls or m.max_batch_size == 0 or not m.batching.enabled:
        return None
    if not prefetch_off(m.batching):
        return None
    if traits.safe_instances is not None and m.instances.count >= traits.safe_instances:
        return None
    if traits.safe_instances is not None:
        fix = (f"set instances.count to {traits.safe_instances} or more, or drop the queue policies and "
               f"priority_levels (no bounded queue then)")
    else:
        fix = "drop the queue policies and priority_levels (prefetch stays on; the queue is unbounded then)"
    return (f"model {m.name!r}: batching.priority_levels/queue policies with instances.count "
            f"{m.instances.count} stall the dynamic batcher on Triton {traits.version} (up to 500 ms with the "
            f"instance idle, measured by `tritonkit probe`); fix: {fix}")


# -- the cache: one JSON file, by server version, plus which version the bundled server is ---------

def cache_path() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                     os.path.expanduser("~/.cache"), "tritonkit")
    return Path(root) / "server-probe.json"


def _read() -> dict:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def cached(version: str) -> ServerTraits | None:
    entry = _read().get("versions", {}).get(version)
    return ServerTraits(**entry) if entry else None


def cached_local(fingerprint: str) -> ServerTraits | None:
    """The bundled (or PATH) server's traits, by its binary's fingerprint, without starting it."""
    version = _read().get("local", {}).get(fingerprint)
    return cached(version) if version else None


def save(traits: ServerTraits, local_fingerprint: str | None = None) -> Path:
    data = _read()
    data.setdefault("versions", {})[traits.version] = asdict(traits)
    if local_fingerprint:
        data.setdefault("local", {})[local_fingerprint] = traits.version
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, json.dumps(data, indent=2).encode())
    return path
