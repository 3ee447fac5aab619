"""The SSRF guard of webhook URLs: https only, and no host that resolves to a loopback, private,
link-local or metadata address, unless WEBHOOK_ALLOWED_HOSTS lists it. Submits check a task's or
a batch's URL with it, and the delivery checks it again at send time (DNS may have changed).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from llmtasks.domain.errors import InvalidInput

if TYPE_CHECKING:
    from llmtasks.settings import WebhookTargets

# host, port -> the addresses it resolves to. Injected in tests so no lookup leaves the machine.
Resolver = Callable[[str, int], list[str]]

# Cloud metadata endpoints that are not covered by "private" or "link-local" everywhere.
_METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)


def system_resolver(host: str, port: int) -> list[str]:
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


def no_lookups(host: str, port: int) -> list[str]:
    """For deployments that must not look names up (WEBHOOK_RESOLVE_NAMES=false): addresses
    written as such are checked, every name but an allowed host is refused, saying why (not as
    a name that does not resolve)."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        raise UnsafeWebhookUrl(
            f"webhook_url's host '{host}' is a name, and this deployment looks no names up"
            " (WEBHOOK_RESOLVE_NAMES=false): use an address or one of its allowed hosts."
        ) from None


def resolver_from_settings(settings: WebhookTargets) -> Resolver:
    return system_resolver if settings.webhook_resolve_names else no_lookups


class UnsafeWebhookUrl(InvalidInput):
    def __init__(self, detail: str) -> None:
        super().__init__(detail, field="webhook_url")


# IPv6 prefixes that carry an IPv4 address in their last 32 bits and reach it: NAT64 (RFC 6052's
# well-known prefix and RFC 8215's local one), and IPv4-compatible addresses (deprecated, ::/96).
_IPV4_IN_LOW_BITS = (
    ipaddress.ip_network("64:ff9b::/96"),
    ipaddress.ip_network("64:ff9b:1::/48"),
    ipaddress.ip_network("::/96"),
)
_TEREDO = ipaddress.ip_network("2001::/32")


def _reached(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses a connection to `ip` reaches: itself, and any IPv4 address it embeds
    (NAT64, 6to4, IPv4-compatible), which SSRF uses to reach the metadata service."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return [ip]
    # (IPv4-mapped addresses, ::ffff:0:0/96, are never global to the ipaddress module already.)
    embedded: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [ip]
    if ip.sixtofour is not None:
        embedded.append(ip.sixtofour)
    if any(ip in prefix for prefix in _IPV4_IN_LOW_BITS):
        embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return embedded


def _is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address)  # a link-local answer may carry its zone: fe80::1%eth0
    if ip in _TEREDO:  # a tunnel to an IPv4 host it hides; no webhook receiver needs one
        return False
    return all(
        reached.is_global and not reached.is_multicast and reached not in _METADATA_ADDRESSES
        for reached in _reached(ip)
    )


def _literal_ipv4(host: str) -> str | None:
    """An IPv4 address however it is spelled (decimal 2852039166, hex 0xa9.0xfea9fe, octal
    0251.0376.0251.0376, short 127.1), as the C resolver reads it; None for a name."""
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        return None


def check_webhook_url(
    url: str, *, allowed_hosts: frozenset[str], resolve: Resolver = system_resolver
) -> None:
    """Refuse URLs that could reach inside the network (SSRF): https only, public addresses only.

    Hosts in `allowed_hosts` skip the address check and may use plain http (the local stack).
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeWebhookUrl(f"webhook_url is not a valid URL: {exc}") from exc
    host = (parts.hostname or "").lower()
    if not host:
        raise UnsafeWebhookUrl("webhook_url has no host.")
    allowed = host in allowed_hosts
    if parts.scheme != "https" and not (allowed and parts.scheme == "http"):
        raise UnsafeWebhookUrl("webhook_url must use https.")
    if allowed:
        return
    literal = _literal_ipv4(host)
    try:
        addresses = [literal] if literal is not None else resolve(host, port or 443)
    except OSError as exc:
        raise UnsafeWebhookUrl(f"webhook_url's host '{host}' does not resolve.") from exc
    if not addresses:
        raise UnsafeWebhookUrl(f"webhook_url's host '{host}' does not resolve.")
    for address in addresses:
        if not _is_public(address):
            raise UnsafeWebhookUrl(
                f"webhook_url's host '{host}' resolves to a non-public address; it is refused."
            )


def endpoint_of(url: str) -> str:
    """The endpoint a webhook URL reaches (scheme, host, port; the default port spelled out):
    what one hanging receiver holds up, and what WebhookQueue's fair queue groups events by."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"
