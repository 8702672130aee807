"""A Ray cluster's address as `--ray` (or RAY_ADDRESS, or a sweep's record) gives it: read and checked before
anything is asked of the network, and probed in seconds before Ray is handed it.

Ray's own client takes what it is given and retries for minutes (a space, a slash, a host nothing answers on), or
fails deep inside Python's IDNA codec (a 64-character label, `head..svc`); `--ray local` would start a cluster.
So every address is read here, by one grammar: `auto` (a cluster this machine is a node of), `HOST:PORT` (the
head's GCS), `ray://HOST[:PORT]` (Ray's client server; its port 10001 by default). HOST is a DNS name, an IPv4
address or a bracketed IPv6 one. Then `probe` asks it, within CONNECT_WITHIN seconds, whether it is a Ray
cluster at all: a name that does not resolve, a port nobody listens on, something that is not Ray, or that does
not answer, each one line. Stdlib only at import; gRPC (which Ray ships) only when an address is probed.
"""
from __future__ import annotations

import importlib
import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import UserError, shown

CLIENT_PORT = 10001  # Ray client's port when `ray://HOST` names none (`ray start --ray-client-server-port`)
CONNECT_WITHIN = 5.0  # seconds for an address to resolve, accept a connection and answer as a Ray cluster
LONGEST = 300  # characters: a DNS name is at most 253, a port 5, a scheme 6
AUTO = "auto"
Refuse = Callable[[str], UserError]  # a problem -> the one-line refusal that names the value and its source

_SCHEME = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)", re.ASCII | re.DOTALL)
_PORT = re.compile(r"[0-9]{1,5}", re.ASCII)
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?", re.ASCII)
_DOTTED = re.compile(r"[0-9.]+", re.ASCII)


@dataclass(frozen=True)
class Address:
    """A cluster's address, read: `text` is what Ray is handed (`ray://HOST:PORT` with the client's port filled
    in), `host` and `port` what is probed."""

    text: str
    host: str
    port: int
    client: bool  # Ray's client server (ray://), else the GCS


def parse(value: str, source: str = "--ray") -> Address | None:
    """`value` read as an address (None: `auto`), or a UserError naming `source` and the problem."""
    def refuse(problem: str) -> UserError:
        return UserError(f"{source} {shown(value)}: {problem}")

    if len(value) > LONGEST:
        raise refuse(f"{len(value):,} characters: no address is longer than {LONGEST}")
    if value == AUTO:
        return None
    odd = next((c for c in value if not (c.isascii() and c.isprintable()) or c.isspace()), None)
    if odd is not None:
        raise refuse(f"holds {'a space' if odd == ' ' else shown(odd)}: give HOST:PORT or ray://HOST[:PORT]")
    if value.lower() == "local":
        raise refuse("would start a new Ray cluster here, and autotune never starts one: give a running cluster's "
                     "address (HOST:PORT of its head, or ray://HOST[:PORT])")
    rest, client = value, False
    scheme = _SCHEME.fullmatch(value)
    if scheme is not None:
        if scheme["scheme"].lower() != "ray":
            raise refuse(f"{scheme['scheme']}:// is not a Ray cluster's address (the dashboard's is not one): give "
                         "HOST:PORT of the head's GCS (6379 by default), or ray://HOST[:PORT] for Ray's client")
        rest, client = scheme["rest"], True
    if "/" in rest or "?" in rest or "#" in rest or "@" in rest:
        raise refuse("an address is HOST:PORT, with no path, query or user: give HOST:PORT or ray://HOST[:PORT]")
    host, port_text = _split(rest, refuse)
    _check_host(host, refuse)
    if port_text is None:
        if not client:
            raise refuse("names no port: give HOST:PORT (the head's GCS port, 6379 by default), or ray://HOST for "
                         f"Ray's client (port {CLIENT_PORT})")
        port = CLIENT_PORT
    else:
        if not _PORT.fullmatch(port_text) or not 0 < int(port_text) < 65536:
            raise refuse(f"port {shown(port_text)} is not a port number (1 to 65535)")
        port = int(port_text)
    shown_host = f"[{host}]" if ":" in host else host
    return Address(f"ray://{shown_host}:{port}" if client else value, host, port, client)


def _split(rest: str, refuse: Refuse) -> tuple[str, str | None]:
    """HOST and PORT (None when there is none) of `HOST[:PORT]` or `[V6][:PORT]`."""
    if rest.startswith("["):
        inside, bracket, after = rest[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise refuse("an IPv6 address is written [ADDRESS]:PORT")
        try:
            ipaddress.IPv6Address(inside)
        except ValueError:
            raise refuse(f"{shown(inside)} in brackets is not an IPv6 address") from None
        return inside, after[1:] if after else None
    host, colon, port = rest.rpartition(":")
    if not colon:
        return rest, None
    if ":" in host:
        raise refuse("an IPv6 address is written in brackets: [ADDRESS]:PORT")
    return host, port


def _check_host(host: str, refuse: Refuse) -> None:
    """A DNS name (labels of letters, digits, `-` and `_`, up to 63 characters each, 253 in all), an IPv4 or an
    IPv6 address; else the UserError `refuse` builds."""
    if not host:
        raise refuse("names no host: give HOST:PORT or ray://HOST[:PORT]")
    if ":" in host or _DOTTED.fullmatch(host):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise refuse(f"{shown(host)} is not an IP address") from None
        return
    bad = next((label for label in host.removesuffix(".").split(".") if not _LABEL.fullmatch(label)), None)
    if len(host) > 253 or bad is not None:
        why = "longer than a DNS name may be (253)" if bad is None else (
            "has an empty label (two dots in a row, or a leading dot)" if not bad else
            f"has a label of {len(bad)} characters (at most 63)" if len(bad) > 63 else
            f"has a label {shown(bad)} that is not letters, digits, '-' and '_' (no '-' at either end)")
        raise refuse(f"host name {why}")


def probe(address: Address, within: float = CONNECT_WITHIN) -> str | None:
    """Why `address` holds no Ray cluster (its name does not resolve, nobody listens, what listens is not Ray's GCS
    or client server, or it does not answer within `within` seconds); None when it answers as one."""
    try:
        with socket.create_connection((address.host, address.port), timeout=within):
            pass
    except socket.gaierror:
        return f"the host name {shown(address.host)} does not resolve"
    except (OSError, UnicodeError) as e:
        return getattr(e, "strerror", None) or str(e) or type(e).__name__
    return _not_ray(address, within)


def _not_ray(address: Address, within: float) -> str | None:
    """One request Ray answers at that port (the GCS its cluster id, the client server a ping), with a deadline: a
    port of something else (a web server, a raylet, a silent socket) is told apart from a cluster in seconds."""
    grpc = importlib.import_module("grpc")  # Ray's own dependency, untyped: handed in as a module, as Ray is
    generated = "ray.core.generated."
    target = f"[{address.host}]:{address.port}" if ":" in address.host else f"{address.host}:{address.port}"
    with grpc.insecure_channel(target, options=[("grpc.enable_http_proxy", 0)]) as channel:
        try:
            if address.client:
                messages = importlib.import_module(generated + "ray_client_pb2")
                stub = importlib.import_module(generated + "ray_client_pb2_grpc").RayletDriverStub(channel)
                stub.ClusterInfo(messages.ClusterInfoRequest(type=messages.ClusterInfoType.PING), timeout=within)
            else:
                messages = importlib.import_module(generated + "gcs_service_pb2")
                stub = importlib.import_module(generated + "gcs_service_pb2_grpc").NodeInfoGcsServiceStub(channel)
                stub.GetClusterId(messages.GetClusterIdRequest(), timeout=within)
        except grpc.RpcError as e:
            code = e.code() if callable(getattr(e, "code", None)) else None
            what = "Ray's client server (ray://)" if address.client else "a Ray cluster's GCS"
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return f"something listens there but does not answer as {what} within {within:g} s"
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL):
                other = ("; a GCS is HOST:PORT without ray://" if address.client else
                         "; Ray's client server is ray://HOST:PORT")
                return f"what listens there is not {what}{other}"
    return None
