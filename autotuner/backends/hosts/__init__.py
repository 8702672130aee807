"""This machine and SSH hosts: `hosts` is the backend (HostsBackend, the Ssh settings, the hostfile's cluster),
`routing` hands each attempt to the local or the SSH executor by its first host."""
from __future__ import annotations
