"""The controller: watch pending GPU pods and reshape free capacity so they fit.

One direction, as everywhere in Tessera: observe (pods, nodes, NodePartitions, policies) ->
plan (the pure planner) -> write each changed NodePartition spec -> wait for the agent to
report it applied -> pin each pod to its node and lift its scheduling gate once the node
advertises its slice. The pure parts (:mod:`demand`, :mod:`snapshot`, :mod:`policies`,
:mod:`decide`) take plain Kubernetes payloads; :mod:`operator` is the only module with I/O.
"""
