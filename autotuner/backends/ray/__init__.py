"""The Ray backend: a sweep on a Ray cluster (and through KubeRay, on Kubernetes), each attempt a lease (a
placement group with one bundle per node and an actor per bundle running DeepSpeed's per-node launcher), taken
by the runner's own connection to Ray and reused by the next attempt of its shape.

Ray itself is imported only once a cluster is reached (connect.connect hands the module to the rest, the
actors' code imports it on the nodes); importing this package, or the backend, loads no Ray.
"""
