"""Host keys checked as OpenSSH checks them, on every connection the pool opens and every ProxyJump hop.

Fabric's own default is to trust any key it has not seen (paramiko's AutoAddPolicy, and no known_hosts loaded
at all), on every hop of a ProxyJump too: the pool replaces that policy on each connection it opens. An unknown
key is refused with `HostKeyError` unless the user opted in (`accept_new_hosts`, or `StrictHostKeyChecking
accept-new` in the ssh config), in which case it is appended to the user's known_hosts file. A key that differs
from the known one is always refused (by paramiko, reported by the pool with `fingerprint`).
"""
from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any  # paramiko has no type information: its clients and keys are Any

from .errors import HostKeyError


def check_host_keys(conn: Any, alias: str, known_hosts: str | None, accept_new_hosts: bool) -> None:
    """Check host keys on `conn` (a fabric Connection, not yet open) and on every ProxyJump hop before it, as
    OpenSSH would: known_hosts files from the ssh config (or `known_hosts`), StrictHostKeyChecking honoured."""
    from fabric import Connection

    hop, name = conn, alias
    while isinstance(hop, Connection):
        cfg = hop.ssh_config
        if known_hosts is not None:
            user_files = [known_hosts]
        else:
            user_files = _paths(cfg.get("userknownhostsfile"), ["~/.ssh/known_hosts", "~/.ssh/known_hosts2"])
        global_files = _paths(cfg.get("globalknownhostsfile"),
                              ["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"])
        for path in global_files + user_files:
            if os.path.isfile(path):
                hop.client.load_system_host_keys(path)
        strict = str(cfg.get("stricthostkeychecking", "ask")).lower()
        accept = accept_new_hosts or strict in ("accept-new", "no", "off")
        hashed = str(cfg.get("hashknownhosts", "no")).lower() == "yes"
        hop.client.set_missing_host_key_policy(
            _KeyPolicy(name, accept, user_files[0] if user_files else None, hashed))
        hop = hop.gateway
        name = getattr(hop, "original_host", name)


def _paths(value: str | None, defaults: Sequence[str]) -> list[str]:
    if not value:
        return [os.path.expanduser(p) for p in defaults]
    return [os.path.expanduser(p) for p in value.split() if p.lower() != "none"]


class _KeyPolicy:
    """paramiko missing-host-key policy: refuse, or (opted in) append to the user's known_hosts and go on."""

    def __init__(self, alias: str, accept: bool, known_hosts_file: str | None, hash_names: bool):
        self.alias = alias
        self.accept = accept
        self.known_hosts_file = known_hosts_file
        self.hash_names = hash_names

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        if not self.accept:
            raise HostKeyError(self.alias, "unknown host key (not in known_hosts); pass --accept-new-hosts to "
                                           "trust it")
        from paramiko.hostkeys import HostKeys

        name = HostKeys.hash_host(hostname) if self.hash_names else hostname
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.known_hosts_file:
            path = Path(self.known_hosts_file)
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(f"{name} {key.get_name()} {key.get_base64()}\n")


def fingerprint(key: Any) -> str:
    """The key as `ssh-keygen -l` shows it."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"
