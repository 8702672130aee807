"""Where the dashboard listens, and which names it answers to.

`--host` is an address (`127.0.0.1`, `::1`, `[::1]`, `0.0.0.0`, `::`) or a name (`localhost`, the machine's
own): a name is bound on every address it resolves to, and `::` on both IPv6 and IPv4 where the system allows,
so the URL printed always answers. The names a request may carry in its Host header (and a browser in its
Origin) are those the server was started for, with its port: anything else is refused, which is what defeats DNS
rebinding (a foreign name made to resolve to this machine).
"""
from __future__ import annotations

import errno
import ipaddress
import os
import socket
from dataclasses import dataclass

from ..errors import UserError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
PORT_TRIES = 20  # a name on several addresses with --port 0: the first's free port may be taken on another


@dataclass(frozen=True)
class Listening:
    """The sockets bound, their port, the host the printed URL names, and the names requests may carry."""

    host: str  # as --host gave it
    sockets: tuple[socket.socket, ...]
    port: int
    shown: str  # the URL's host: answers on every socket family bound ([...] for IPv6)
    names: frozenset[str]  # lower case, IPv6 in brackets
    wildcard: bool  # bound on every interface: any IP address of this machine reaches it
    exposed: bool  # reachable from other machines (not loopback only)

    def serves(self, authority: str) -> bool:
        """Whether `authority` (a Host header's value, or an Origin's host and port) names this server."""
        found = split_authority(authority)
        if found is None or found[1] != self.port:
            return False
        name = found[0]
        if name in self.names:
            return True
        # On every interface, the machine's addresses are many and may change: an address is no name an attacker
        # can make resolve here, so any IP address is served (names, only those known).
        return self.wildcard and _literal(name.strip("[]")) is not None

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def split_authority(authority: str) -> tuple[str, int] | None:
    """`host[:port]` as (lower-case host, port; 80 when none), an IPv6 address in brackets and in its short form;
    None when malformed."""
    text = authority.strip().lower()
    if not text or len(text) > 300 or any(c in text for c in "/@\\?# \t"):
        return None
    if text.startswith("["):
        host, close, rest = text[1:].partition("]")
        ip = _literal(host)
        if not close or ip is None or ip.version != 6:
            return None
        host = f"[{ip}]"
    else:
        host, colon, port = text.partition(":")
        rest = colon + port
    if not rest:
        return host, 80
    digits = rest[1:]
    if rest[0] != ":" or not digits.isascii() or not digits.isdigit() or len(digits) > 5 or int(digits) > 65535:
        return None
    return host, int(digits)


def _literal(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _addresses(host: str) -> list[tuple[socket.AddressFamily, str]]:
    """The addresses `--host` stands for: itself when an address, else every one its name resolves to."""
    literal = _literal(host)
    if literal is not None:
        return [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, str(literal))]
    try:
        host.encode("idna")  # what getaddrinfo does first: a label too long or empty fails here, not with OSError
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (UnicodeError, OSError) as e:
        raise UserError(f"--host {_shown(host)}: not an address, nor a name this machine resolves ({_why(e)})") \
            from None
    addresses: dict[tuple[socket.AddressFamily, str], None] = {}
    for family, _, _, _, where in found:
        if family in (socket.AF_INET, socket.AF_INET6):
            addresses[(family, str(where[0]))] = None
    if not addresses:
        raise UserError(f"--host {_shown(host)}: the name resolves to no IP address")
    return list(addresses)


def _why(error: BaseException) -> str:
    if isinstance(error, UnicodeError):
        return "a part of the name is empty or longer than 63 characters"
    if isinstance(error, OSError) and error.errno and not isinstance(error, socket.gaierror):
        return os.strerror(error.errno)  # create_server's own text names the address again
    return str(getattr(error, "strerror", None) or error)


def _shown(host: str) -> str:
    """`--host` as a refusal quotes it: a long one cut."""
    return repr(host) if len(host) <= 80 else f"{host[:60]!r}... ({len(host)} characters)"


def _bind(addresses: list[tuple[socket.AddressFamily, str]], port: int) -> tuple[list[socket.socket], int]:
    """One socket per address, all on one port (`port`, or the first one's free port when 0); an address this
    system cannot bind (IPv6 off, say) is left out while another is bound."""
    bound: list[socket.socket] = []
    error: OSError | None = None
    try:
        for family, address in addresses:
            dual = address == "::" and socket.has_dualstack_ipv6()
            try:
                sock = socket.create_server((address, port), family=family, reuse_port=False, dualstack_ipv6=dual)
            except OSError as e:
                if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) and len(addresses) > 1:
                    error = error or e
                    continue
                raise
            bound.append(sock)
            port = sock.getsockname()[1]
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    if not bound:
        raise error or OSError(errno.EADDRNOTAVAIL, "no address to bind")
    return bound, port


def listen(host: str, port: int) -> Listening:
    """The server's sockets, bound before the URL is printed (port 0: a free one, named in the URL)."""
    if not host.strip():  # Python binds every interface, and the URL printed would be http://:PORT
        raise UserError(f"--host {_shown(host)}: name the address to listen on (127.0.0.1, or 0.0.0.0 for every "
                        "interface)")
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host != host.strip() or any(c in name for c in "/@[]") or (":" in name and _literal(name) is None):
        raise UserError(f"--host {_shown(host)}: give an address or a name alone (127.0.0.1, ::1, localhost), "
                        "without a scheme or a port (--port says the port)")
    addresses = _addresses(name)
    for _ in range(PORT_TRIES):
        try:
            sockets, bound = _bind(addresses, port)
            break
        except OSError as e:
            if not (port == 0 and e.errno == errno.EADDRINUSE and len(addresses) > 1):
                raise UserError(f"cannot listen on {_bracketed(name)}:{port}: {_why(e)}") from None
    else:
        raise UserError(f"cannot listen on {_bracketed(name)}: no port free on all of its addresses")
    ips = [_literal(s.getsockname()[0]) for s in sockets]
    wildcard = any(ip is not None and ip.is_unspecified for ip in ips)
    loopback = all(ip is not None and ip.is_loopback for ip in ips)
    names = {_bracketed(str(ip)) for ip in ips if ip is not None and not ip.is_unspecified}
    if _literal(name) is None:
        names.add(name.lower())
    if loopback:
        names |= LOOPBACK_NAMES
    if wildcard:
        names |= {"localhost", socket.gethostname().lower()}
        dual = any(s.family == socket.AF_INET or s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
                   for s in sockets)
        shown = "127.0.0.1" if dual else "[::1]"
    else:
        shown = _bracketed(str(_literal(name))) if _literal(name) is not None else name
    return Listening(host, tuple(sockets), bound, shown, frozenset(names), wildcard, exposed=not loopback)
