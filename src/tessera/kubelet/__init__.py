"""The kubelet adapter: device plugin servers, registration and PodResources clients.

Everything that speaks gRPC to the kubelet lives here, next to the pure policy it applies, so
``tessera.kubelet`` depends on ``tessera.core`` only and never on the NVML backend:

- ``inventory``: :class:`~tessera.kubelet.inventory.DeviceInventory` (what the plugins read),
  its in-memory implementation ``Inventory`` and the ``PluginDevice`` values it holds;
- ``allocation``: what Allocate returns and what GetPreferredAllocation suggests (pure);
- ``health``: which Xid events make a device unhealthy (pure);
- ``resourcenames``: the kubelet's extended-resource-name rule and our socket names (pure);
- ``plugins``: one gRPC server per resource, and ``PluginManager`` that serves, registers and
  re-registers after kubelet restarts;
- ``registration``, ``podresources``: clients of kubelet.sock and the PodResources socket;
- ``_pb`` (generated from proto/ by tools/gen_proto.py) and ``_wire`` (typed access to it).

The kubelet stand-in that tests these against lives in :mod:`tessera.testing`.
"""
