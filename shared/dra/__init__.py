"""DRA semantics: the resource.k8s.io/v1 model, CEL over device attributes, matching, the fleet index,
allocation and the reasons a claim waits. Pure: no I/O.
"""
