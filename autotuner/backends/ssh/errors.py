"""What goes wrong over SSH: a host that cannot be used (`HostDown`, one thing for callers to catch to mark a
host down), and a command that could not be started on a host that answered (`RemoteStartError`)."""
from __future__ import annotations


class HostDown(Exception):
    """A host could not be reached or used over SSH. `reason` says why, in a few words."""

    def __init__(self, host: str, reason: str):
        super().__init__(host, reason)
        self.host = host
        self.reason = reason

    def __str__(self) -> str:
        return f"host {self.host}: {self.reason}"


class HostKeyError(HostDown):
    """The host's key is not in known_hosts (and the user did not opt in), or differs from the known one."""


class CommandTimeout(HostDown):
    """A short command did not finish within its timeout: the host is not answering in time."""


class RemoteStartError(RuntimeError):
    """A remote process could not be started (missing working directory, unwritable log directory, ...)."""

    def __init__(self, host: str, exit_code: int | None, stderr: str):
        super().__init__(host, exit_code, stderr)
        self.host = host
        self.exit_code = exit_code
        self.stderr = stderr

    def __str__(self) -> str:
        detail = self.stderr.strip().splitlines()[-1] if self.stderr.strip() else "no output"
        return f"host {self.host}: could not start the command (exit {self.exit_code}): {detail}"


def describe(e: BaseException) -> str:
    """A failure to reach a host, in a few words."""
    if isinstance(e, EOFError):
        return "connection closed by the remote end"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return str(e) or type(e).__name__
