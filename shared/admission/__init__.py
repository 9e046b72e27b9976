"""Admission: quotas, flavors, fair share, preemption and the decision cycle over an immutable snapshot,
its explanations, the waiting queue, the invariants and `simulate`. Pure: no I/O.
"""
