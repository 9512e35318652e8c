"""Fault tools for the cluster scenarios (docs/CLUSTER.md): a TCP proxy per broker
(:mod:`.proxy`), node faults and role lookups (:mod:`.nodes`), a constant load with a live
reply reader (:mod:`.workload`) and the history checker (:mod:`.history`)."""
