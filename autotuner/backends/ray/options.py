"""The Ray backend's flag (`--ray [ADDRESS]`), declared for the command line, standard library only. Picked by
--ray or by the sweep's record."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..flags import Declared, Flag

# What `--ray VALUE` takes as its address, rather than as the next argument (a spec file, an option): a word Ray
# knows, any scheme:// (ray://; http:// is Ray's to refuse, with its own advice), host:port, [v6]:port.
ADDRESS = re.compile(r"auto|local|[A-Za-z][A-Za-z0-9+.-]*://\S+|\[[0-9A-Fa-f:.]+\]:\d+|[A-Za-z0-9._-]+:\d+")

DECLARED = Declared("ray", (
    Flag("ray", ("--ray",), str | None, "Run on a Ray cluster (KubeRay, `ray up`), as a client: the one at ADDRESS, "
                                        "else RAY_ADDRESS, else auto (a cluster this machine is a node of). Never "
                                        "starts one.", frozenset({"run", "tune", "resume", "plan"}),
         metavar="[ADDRESS]", bare=ADDRESS),
    Flag("ray", ("--ray",), str | None, "The nodes of this Ray cluster (ADDRESS, else RAY_ADDRESS, else auto) "
                                        "instead of a hostfile.", frozenset({"hosts"}), metavar="[ADDRESS]",
         bare=ADDRESS),
), picked="--ray [ADDRESS], or the sweep's record", backend="autotuner.backends.ray.backend:RayBackend")


@dataclass(frozen=True)
class RayGiven:
    """The Ray backend's options, as given: the cluster's address ("": RAY_ADDRESS, else auto; None: not given)."""

    ray: str | None = None
