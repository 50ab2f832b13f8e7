"""A spec model's batching laid over a config that a server already serves.

`tritonkit tune --url` tunes a server the kit did not start: its config (backend, platform,
tensors, TensorRT profiles, GPUs, parameters) is what Triton reports, and only the fields the
tuner turns are changed: max batch, the dynamic batcher (preferred sizes, queue delay, priority
levels, queue policies) and the instance count of each group. The spec variant is checked by the
kit's rules first (`configs.loader.check`, without the ONNX graph, which need not be on this machine).
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from tritonkit.spec import ModelSpec, QueuePolicy


def queue_policy(p: QueuePolicy) -> mc.ModelQueuePolicy:
    return mc.ModelQueuePolicy(
        timeout_action=mc.ModelQueuePolicy.TimeoutAction.Value(p.timeout_action),
        default_timeout_microseconds=p.default_timeout_us,
        allow_timeout_override=p.allow_timeout_override,
        max_queue_size=p.max_queue_size,
    )


def set_batching(cfg: mc.ModelConfig, m: ModelSpec) -> None:
    """The dynamic batcher of `m` in `cfg`, replacing whatever `cfg` had (none when `m` does not batch)."""
    cfg.ClearField("dynamic_batching")
    b = m.batching
    if not (b.enabled and m.max_batch_size > 0):
        return
    db = cfg.dynamic_batching
    db.SetInParent()  # an empty dynamic_batching {} still turns the batcher on
    db.preferred_batch_size.extend(b.preferred_batch_sizes)
    db.max_queue_delay_microseconds = b.max_queue_delay_us
    db.preserve_ordering = b.preserve_ordering
    db.priority_levels = b.priority_levels
    db.default_priority_level = b.default_priority
    if b.default_queue_policy:
        db.default_queue_policy.CopyFrom(queue_policy(b.default_queue_policy))
    for level, pol in sorted(b.priority_queue_policies.items()):
        db.priority_queue_policy[level].CopyFrom(queue_policy(pol))


def _warmups_within(cfg: mc.ModelConfig) -> None:
    """Triton refuses a config whose warm-up batch is over its max batch: a warm-up at a larger batch
    runs at the max batch instead (the kit warms at 1 and at the max batch), one per batch size."""
    kept, seen = [], set()
    for w in cfg.model_warmup:
        size = min(w.batch_size, cfg.max_batch_size)
        if size not in seen:
            seen.add(size)
            copy = mc.ModelWarmup()
            copy.CopyFrom(w)
            copy.batch_size = size
            kept.append(copy)
    del cfg.model_warmup[:]
    cfg.model_warmup.extend(kept)


def overlaid(served: mc.ModelConfig, m: ModelSpec, name: str | None = None) -> mc.ModelConfig:
    """`served` with `m`'s max batch, batcher and instance count (each group's), under `name`."""
    cfg = mc.ModelConfig()
    cfg.CopyFrom(served)
    if name:
        cfg.name = name
    if served.max_batch_size > 0:  # a model without a batch axis keeps none
        cfg.max_batch_size = m.max_batch_size
        set_batching(cfg, m)
        _warmups_within(cfg)
    for group in cfg.instance_group:
        group.count = m.instances.count
    return cfg
