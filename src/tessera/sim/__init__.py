"""What-if simulation: replay a workload on a simulated cluster under several policies.

Answers "how many more pods would dynamic MIG fit on my cluster than my static layout?" with
the same planner code that runs in production. A process-level package beside the agent and
the controller: it imports only :mod:`tessera.core` and third-party code.

- :mod:`~tessera.sim.workload`: jobs from the openb traces (profile mapping, replay, Poisson
  arrivals for a target load) or a seeded generator;
- :mod:`~tessera.sim.history`: the user's own pod history (the ``--workload`` CSV that
  ``tessera simulate export`` writes) as jobs on its own clock;
- :mod:`~tessera.sim.cluster`: the cluster, from ``16x8xA100-SXM4-80GB`` or a plan file;
- :mod:`~tessera.sim.policies`: dynamic (the planner), static layouts, nos-style greedy, and
  two fluid bounds, behind one interface;
- :mod:`~tessera.sim.dra`: kube-scheduler allocating MIG placements through DRA counters,
  with or without the controller's curation (``dra``, ``dra:curated``);
- :mod:`~tessera.sim.engine`: the one event loop every policy runs through, and its measures;
- :mod:`~tessera.sim.static_mix`: the best static mix of standard layouts in hindsight;
- :mod:`~tessera.sim.report`: the text table and the HTML report.
"""
