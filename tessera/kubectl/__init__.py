"""``kubectl tessera``: a read-only kubectl plugin that shows the cluster's GPU shares and says why a
pod with Tessera claims waits (docs/kubectl-tessera.md).

Modules: ``cli`` (flags, kubeconfig, the four commands), ``snapshot`` (one read of the API objects a
view needs), ``views`` (GPUs, shares and MIG instances as plain data), ``usage`` (live figures from
the exporters, where reachable), ``why`` (a waiting pod judged with the admission check's own fit
code), ``queue`` (Workloads our fit check holds), ``render`` (the views as text), ``text`` (escaping,
bounding, bars and columns).
"""
