"""Property: for any two valid layouts of a model, the ordered diff applies on the simulator.

This is where the pure layout model meets NVML's rules: the simulator checks every create with
placement against the card, so an order that could fail (a create before the destroy that frees
its slices) would show up here as an NVML error.
"""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.core import catalogue, layout
from tessera.nvml import sim
from tessera.nvml.backend import PynvmlBackend
from tessera.nvml.sim.state import new_node_state


@cache
def _layouts(model_name: str) -> list[frozenset[layout.Slice]]:
    return sorted(layout.enumerate_layouts(catalogue.model(model_name)), key=sorted)


def _apply(backend: PynvmlBackend, model: catalogue.GpuModel,
           current: frozenset[layout.Slice], target: frozenset[layout.Slice]) -> None:
    diff = layout.diff_layouts(model, current, target)
    by_slice = {layout.Slice(i.profile, i.start): i.id for i in backend.gpu_instances(0)}
    for item in diff.destroy:
        backend.destroy_slice(0, by_slice[item])
    for item in diff.create:
        backend.create_slice(0, item.profile, item.start)


@pytest.mark.parametrize("model_name", ["A30-24GB", "A100-SXM4-40GB", "H100-80GB"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_diff_between_any_two_valid_layouts_always_applies(
    model_name: str, data: st.DataObject
) -> None:
    model = catalogue.model(model_name)
    layouts = _layouts(model_name)
    current = data.draw(st.sampled_from(layouts), label="current")
    target = data.draw(st.sampled_from(layouts), label="target")
    sim.install(sim.MemoryStore(new_node_state("prop", [model_name])))
    backend = PynvmlBackend()
    try:
        _apply(backend, model, frozenset(), current)
        _apply(backend, model, current, target)
        observed = {layout.Slice(i.profile, i.start) for i in backend.gpu_instances(0)}
        assert observed == target
        assert all(i.compute_instances for i in backend.gpu_instances(0))
    finally:
        backend.close()
        sim.uninstall()
