"""``dynamic`` in the simulator is the controller itself (:mod:`tessera.sim.dynamic`)."""

from __future__ import annotations

import random

import pytest

from tessera.controller.loop import Controller
from tessera.core.catalogue import model
from tessera.sim.cluster import shorthand
from tessera.sim.dynamic import DynamicPolicy
from tessera.sim.engine import simulate
from tessera.sim.workload import synthetic

A100 = model("A100-80GB")


def test_the_policy_is_the_controller_s_decision_loop() -> None:
    policy = DynamicPolicy(shorthand(1, 2, "A100-80GB"))
    assert type(policy.controller) is Controller
    assert policy.controller.writer is policy, "its writes come to the simulated cluster"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_pod_the_controller_releases_gets_its_slices_from_the_kubelet(seed: int) -> None:
    """The simulated kubelet refuses (raises) a pod released onto a node without a free
    advertised slice of its profile; a busy synthetic day must run through."""
    cluster = shorthand(2, 4, "A100-80GB")
    jobs = synthetic(random.Random(seed), 400, A100, rate=0.1, mean_duration=300)
    policy = DynamicPolicy(cluster)
    r = simulate(policy, jobs, capacity=cluster.capacity, horizon=jobs[-1].arrival)
    assert r.placed > r.jobs / 2
    assert policy.created > 0
    assert policy.planner_calls > 10
    assert policy.events > r.placed, "every placed pod was told where it goes"


def test_the_controller_s_settings_show_in_the_simulation() -> None:
    """A change to the controller shows here: a longer batch window delays the one pod."""
    cluster = shorthand(1, 1, "A100-80GB")
    jobs = synthetic(random.Random(5), 1, A100, rate=0.01, mean_duration=100)
    waits = []
    for idle in (0.5, 2.0):
        policy = DynamicPolicy(cluster, batch_idle=idle, batch_max=5.0, reconfig_latency=0.0,
                               capacity_lag=0.0)
        waits.append(simulate(policy, jobs, capacity=7, horizon=jobs[0].arrival + 50).waits[0])
    assert waits[1] - waits[0] == pytest.approx(1.5, abs=0.01)
