"""The client-side adaptive throttle (clients/throttle.py): the SRE formula over a trailing window."""

import random

import pytest

from tritonkit.clients.throttle import AdaptiveThrottle


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_nothing_is_refused_while_the_backend_accepts_everything():
    clock = Clock()
    th = AdaptiveThrottle(k=1.5, window_s=2.0, clock=clock, rng=random.Random(1))
    for _ in range(1000):
        clock.t += 0.001
        assert th.admit()
        th.done(True)
    assert th.reject_probability() == 0.0 and th.refused == 0


def test_a_backend_taking_a_third_of_the_offer_gets_about_k_times_what_it_accepts():
    """3,000 req/s offered to a backend that accepts 1,000 a second: once the window is steady the
    client sends about K x 1,000 and refuses the rest itself, without a round trip."""
    clock = Clock()
    th = AdaptiveThrottle(k=1.5, window_s=2.0, clock=clock, rng=random.Random(2))
    taken: list[float] = []  # when the backend accepted, for its one-second capacity
    sent = accepted = 0
    for i in range(30000):  # 10 s; the last 6 s are counted
        clock.t += 1 / 3000
        if not th.admit():
            continue
        while taken and taken[0] <= clock.t - 1.0:
            taken.pop(0)
        ok = len(taken) < 1000
        if ok:
            taken.append(clock.t)
        th.done(ok)
        sent += i >= 12000
        accepted += ok and i >= 12000
    assert accepted / 6 == pytest.approx(1000, rel=0.05)
    assert sent / accepted == pytest.approx(1.5, rel=0.15)
    assert th.refused > 10000


def test_refusals_count_as_requests_and_the_client_recovers():
    clock = Clock()
    th = AdaptiveThrottle(k=2.0, window_s=1.0, clock=clock, rng=random.Random(4))
    for _ in range(500):  # the backend refuses everything for a second
        clock.t += 0.002
        if th.admit():
            th.done(False)
    assert th.reject_probability() > 0.9
    clock.t += 1.5  # the window forgets; the backend is back
    assert th.reject_probability() == 0.0
    for _ in range(200):
        clock.t += 0.002
        if th.admit():
            th.done(True)
    assert th.reject_probability() == 0.0


def test_k_below_one_is_refused():
    with pytest.raises(ValueError, match="K below 1"):
        AdaptiveThrottle(k=0.9)
