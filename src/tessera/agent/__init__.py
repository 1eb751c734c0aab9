"""The node agent: the only writer of a node's GPU state.

It observes the cards (NVML) and their users (the kubelet's PodResources), plans the steps
towards its NodePartition's spec, applies them without ever destroying a slice in use, reports
what is really there, and keeps the device plugins' inventory in step, all in one direction:
observe -> plan -> apply -> report.
"""
