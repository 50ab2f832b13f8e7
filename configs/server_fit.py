"""Warnings about what the target server does with a valid config: Triton loads it, and it stalls.

The rule is `tritonkit.server_traits.stall_risk`; the facts come from the probe's cache (nothing is
started here). A warning, not an error: the config is legal and some servers handle it well.
"""

from __future__ import annotations

from tritonkit import server_traits
from tritonkit.errors import ServerError
from tritonkit.server import find_install
from tritonkit.spec import Spec


def server_warnings(spec: Spec, target: str = "local") -> list[str]:
    if target != "local":
        return []  # an NGC image's version is only known once it runs: `tritonkit probe --url`
    at_risk = [m for m in spec.models if m.max_batch_size and server_traits.prefetch_off(m.batching)]
    if not at_risk:
        return []
    try:
        traits = server_traits.cached_local(find_install().fingerprint)
    except ServerError:
        return []  # no local server to speak of
    if traits is None:
        names = ", ".join(m.name for m in at_risk)
        return [f"{names}: queue policies or priority levels, and the local tritonserver was never probed; "
                f"`tritonkit probe` measures whether they stall its batcher (they do on Triton 2.51 with "
                f"one instance; docs/overload.md)"]
    return [w for m in at_risk if (w := server_traits.stall_risk(m, traits))]
