"""The Ray backend: a sweep on a Ray cluster (and through KubeRay, on Kubernetes), each attempt a placement
group with one bundle per node and an actor per bundle running DeepSpeed's per-node launcher.

Ray itself is imported only by the modules that run once a cluster is reached (connect.connect, driver.py, the
tasks and actors); importing this package, or the backend, loads no Ray. Nothing is imported here: each
attempt's driver (`python -m autotuner.backends.ray.driver`) loads only what it needs.
"""
