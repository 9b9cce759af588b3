"""Where a callback may go: the URL form, the host allowlist, and the address rules (SSRF).

Pure Python (no Django), so that every rule is tested on its own. A refusal is a
``Refused`` naming its rule; ``schedule_http`` raises it at the door and the delivery
action turns it into a dead job with that reason, having sent nothing.

The host name is resolved once per delivery through ``resolve()`` (the resolver is a
seam tests replace with ``use_resolver``), within a time limit; every address is checked
and the connection goes to a checked address, never to a name resolved a second time
(DNS rebinding).
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from ..exceptions import InvalidSchedule
from ..redact import url_problem, without_userinfo

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Sequence[IPAddress]]

SCHEMES = {"http": 80, "https": 443}
MAX_URL_LENGTH = 2048

_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
# WHATWG URL: a host whose last label is a number is parsed as an IPv4 address.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
# Anything but visible ASCII, and the backslash: http.client sends the request target as
# ASCII, and a URL is stored and shown as the text it will be sent as.
_BAD_URL_CHARS = re.compile(r"[^\x21-\x7e]|\\")


class Refused(InvalidSchedule):
    """A callback URL or address that the policy does not allow; ``rule`` names why."""

    def __init__(self, message: str, rule: str) -> None:
        super().__init__(message)
        self.rule = rule


# -- the URL ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where one request goes: scheme, normalised host (a name or an address), port and the
    request target (path and query)."""

    scheme: str
    host: str
    port: int
    target: str = "/"

    @property
    def address(self) -> IPAddress | None:
        """The host as an address, if the URL named one."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None

    @property
    def netloc(self) -> str:
        """Host (and port, unless the scheme's default): the ``Host`` header."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if SCHEMES[self.scheme] == self.port else f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.netloc}{self.target}"


def parse_url(url: object) -> Target:
    """Return the ``Target`` of an absolute http(s) URL, or raise ``Refused``."""
    if not isinstance(url, str):
        raise TypeError(f"the URL must be a str, not {type(url).__name__}")
    if not 0 < len(url) <= MAX_URL_LENGTH:
        raise Refused(f"the URL must have 1 to {MAX_URL_LENGTH} characters", "url")
    shown = without_userinfo(url)  # no password in a message, a log line or a 400
    if _BAD_URL_CHARS.search(url):
        raise Refused(
            f"the URL {shown!r} holds a space, a control character, a backslash or a "
            "non-ASCII character: percent-encode them (a host name in its xn-- form)",
            "url",
        )
    problem = url_problem(url)
    if problem:
        raise Refused(f"the URL {shown!r} cannot be parsed: {problem}", "url")
    parts = urlsplit(url)
    port = parts.port
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise Refused(f"the URL {shown!r} is not http or https", "scheme")
    if "@" in parts.netloc:
        raise Refused(
            f"the URL {shown!r} holds user information (user@host): not allowed, since it "
            "hides the real host; put credentials in HTTP_DESTINATIONS headers",
            "userinfo",
        )
    if parts.fragment or url.endswith("#"):
        raise Refused(f"the URL {shown!r} has a fragment (#...), which is never sent", "url")
    if port == 0:
        raise Refused(f"the URL {shown!r} has port 0", "url")
    host = host_of(parts, shown)
    target = parts.path or "/"
    if parts.query or url.endswith("?"):
        target += "?" + parts.query
    return Target(scheme, host, port or SCHEMES[scheme], target)


def host_of(parts: SplitResult, context: str) -> str:
    """The normalised host of a split URL. Brackets hold an IPv6 address only: ``urlsplit``
    also takes RFC 3986's IPvFuture (``[v1.name]``) and strips the brackets, which would
    leave a host name that no other URL parser reads there."""
    host = parts.hostname or ""
    if parts.netloc.rpartition("@")[2].startswith("[") and ":" not in host:
        raise Refused(f"{context!r}: [{host}] is not an IPv6 address", "url")
    return normalise_host(host, context)


def normalise_host(host: str, context: str) -> str:
    """Return a host as compared and connected to: a lower-case ASCII name without a
    trailing dot, or the canonical text of an address. Refuse everything else."""
    if not host:
        raise Refused(f"{context!r} has no host", "url")
    if ":" in host:  # only an IPv6 literal holds a colon (urlsplit removed the brackets)
        if "%" in host:
            raise Refused(f"{context!r}: an IPv6 zone id (%...) is not allowed", "url")
        try:
            return str(ipaddress.IPv6Address(host))
        except ValueError:
            raise Refused(f"{context!r}: {host!r} is not an IPv6 address", "url") from None
    name = host.lower()
    if name.endswith("."):
        name = name[:-1]
    labels = name.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        try:
            address = ipaddress.IPv4Address(name)
        except ValueError:
            address = None
        if address is None or str(address) != name:
            raise Refused(
                f"{context!r}: {host!r} is an IPv4 address in a numeric trick form "
                "(decimal, octal, hex or short): write it as four decimal parts",
                "numeric",
            )
        return name
    if not name.isascii() or len(name) > 253 or not all(_LABEL.fullmatch(x) for x in labels):
        raise Refused(
            f"{context!r}: {host!r} is not a valid host name (letters, digits and '-' in "
            "dot-separated labels; write international names in their xn-- form)",
            "url",
        )
    return name


# -- the allowlist ------------------------------------------------------------------------


@dataclass(frozen=True)
class AllowedHost:
    """One ``HTTP_ALLOWED_HOSTS`` entry: a name, ``*.suffix`` or an address, with a port
    (None: the scheme's default port only)."""

    host: str
    port: int | None
    wildcard: bool

    def allows(self, target: Target) -> bool:
        port_ok = target.port == (SCHEMES[target.scheme] if self.port is None else self.port)
        if not port_ok:
            return False
        if self.wildcard:
            return target.address is None and target.host.endswith("." + self.host)
        return target.host == self.host


def parse_allowed_host(entry: object) -> AllowedHost:
    """Return the ``AllowedHost`` of one entry, or raise ``ValueError``/``TypeError``."""
    if not isinstance(entry, str):
        raise TypeError(f"an allowed host must be a str, not {entry!r}")
    wildcard = entry.startswith("*.")
    try:
        parts = urlsplit("//" + (entry[2:] if wildcard else entry))
        port = parts.port
        if parts.path or parts.query or parts.fragment or "@" in parts.netloc or port == 0:
            raise ValueError("not a host")
        host = host_of(parts, entry)
    except ValueError:
        raise ValueError(
            f"{entry!r} is not a host name, *.wildcard or address with an optional :port"
        ) from None
    if wildcard and "." not in host:
        raise ValueError(f"{entry!r}: a wildcard needs a domain of two labels or more")
    if wildcard and _is_address(host):
        raise ValueError(f"{entry!r}: wildcards take names, not addresses")
    return AllowedHost(host, port, wildcard)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def check_host(target: Target, allowed: Sequence[AllowedHost]) -> None:
    """Raise ``Refused`` unless an allowlist entry allows the target's host and port."""
    if not any(entry.allows(target) for entry in allowed):
        where = target.netloc if target.port != SCHEMES[target.scheme] else target.host
        raise Refused(
            f"{where} (port {target.port}) is not in HTTP_ALLOWED_HOSTS"
            + ("" if allowed else ", which is empty: no callbacks are allowed"),
            "allowlist",
        )


# -- addresses ----------------------------------------------------------------------------

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

#: (network, rule name, allowed by HTTP_ALLOW_PRIVATE_NETWORKS). The first match decides;
#: an address in none of them must still be globally routable (``is_global``, which older
#: Pythons do not know for every range: those that matter are listed here).
RULES: tuple[tuple[_V4 | _V6, str, bool], ...] = (
    (_V4("0.0.0.0/8"), "this network (0.0.0.0/8)", False),
    (_V4("10.0.0.0/8"), "private network (RFC 1918)", True),
    (_V4("100.100.100.200/32"), "cloud metadata address", False),
    (_V4("100.64.0.0/10"), "carrier-grade NAT (100.64.0.0/10)", True),
    (_V4("127.0.0.0/8"), "loopback", True),
    # Azure's WireServer (the VM agent's endpoint): a global address, so is_global passes it.
    (_V4("168.63.129.16/32"), "cloud metadata address", False),
    (_V4("169.254.0.0/16"), "link-local (169.254.0.0/16, cloud metadata)", False),
    (_V4("172.16.0.0/12"), "private network (RFC 1918)", True),
    (_V4("192.0.0.0/24"), "IETF protocol assignments (192.0.0.0/24)", False),
    (_V4("192.168.0.0/16"), "private network (RFC 1918)", True),
    (_V4("224.0.0.0/4"), "multicast", False),
    (_V4("255.255.255.255/32"), "broadcast", False),
    (_V4("240.0.0.0/4"), "reserved (240.0.0.0/4)", False),
    (_V6("::/128"), "unspecified address", False),
    (_V6("::1/128"), "IPv6 loopback", True),
    (_V6("fd00:ec2::254/128"), "cloud metadata address", False),
    # A site's own NAT64 (RFC 8215): it may carry any IPv4 address, the metadata one too.
    (_V6("64:ff9b:1::/48"), "local-use NAT64 (64:ff9b:1::/48)", False),
    # Reserved, never routable; SIIT's IPv4-translated ::ffff:0:a.b.c.d (RFC 2765) is here,
    # which a translator maps to a.b.c.d. (Mapped, compatible and NAT64 are checked first.)
    (_V6("::/8"), "IPv6 reserved (::/8)", False),
    (_V6("3fff::/20"), "IPv6 documentation (3fff::/20)", False),
    (_V6("5f00::/16"), "IPv6 segment routing (5f00::/16)", False),
    (_V6("fc00::/7"), "IPv6 unique local (fc00::/7)", True),
    (_V6("fe80::/10"), "IPv6 link-local (fe80::/10)", False),
    (_V6("fec0::/10"), "IPv6 site-local (fec0::/10)", False),
    (_V6("ff00::/8"), "IPv6 multicast", False),
)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 one carries (mapped, NAT64, 6to4, compatible), if any."""
    if address.ipv4_mapped is not None:
        return "IPv4-mapped IPv6", address.ipv4_mapped
    if address in _V6("64:ff9b::/96"):
        return "NAT64 IPv6", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return "6to4 IPv6", address.sixtofour
    if address in _V6("::/96") and int(address) > 1:
        return "IPv4-compatible IPv6", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def check_address(address: IPAddress, allow_private: bool) -> None:
    """Raise ``Refused`` naming the rule that forbids connecting to ``address``."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id:
            raise Refused(f"{address} has a zone id", "IPv6 link-local (fe80::/10)")
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            form, inner = embedded
            try:
                check_address(inner, allow_private)
            except Refused as exc:
                raise Refused(f"{address} is {form} of {exc}", f"{form}: {exc.rule}") from None
            return
    for network, rule, private in RULES:
        if address in network:
            if private and allow_private:
                return
            hint = " (HTTP_ALLOW_PRIVATE_NETWORKS is off)" if private else ""
            raise Refused(f"{address} is {rule}{hint}", rule)
    if not address.is_global:
        raise Refused(f"{address} is not globally routable", "not globally routable")


def system_resolver(host: str, port: int) -> list[IPAddress]:
    """Every address the system resolver gives for ``host``, in its order."""
    found: list[IPAddress] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = ipaddress.ip_address(sockaddr[0])
        if address not in found:
            found.append(address)
    return found


_resolver: Resolver = system_resolver

#: Lookup threads alive at once in a process, at most: while the resolver hangs, each
#: delivery leaves one behind until resolv.conf's limits end it, and a busy worker would
#: otherwise pile up thousands.
MAX_LOOKUPS = 64
_lookups = threading.BoundedSemaphore(MAX_LOOKUPS)


@contextlib.contextmanager
def use_resolver(resolver: Resolver) -> Iterator[None]:
    """Resolve host names with ``resolver`` inside the block (tests, custom DNS)."""
    global _resolver
    previous, _resolver = _resolver, resolver
    try:
        yield
    finally:
        _resolver = previous


def resolve(host: str, port: int, timeout: float | None = None) -> list[IPAddress]:
    """``host``'s addresses from the resolver in use; ``OSError`` if it has not answered
    within ``timeout`` seconds.

    ``getaddrinfo`` has no time limit but the system's (``resolv.conf``: 10 s per name
    server by default, and NSS modules of their own), so the lookup runs in a daemon
    thread that the caller stops waiting for; a lookup left behind ends on its own. With
    ``MAX_LOOKUPS`` of them still alive, ``OSError`` at once (a delivery is retried).
    """
    resolver = _resolver  # the one in use in the caller's thread
    if timeout is None:
        return list(resolver(host, port))
    if not _lookups.acquire(blocking=False):
        raise OSError(f"{MAX_LOOKUPS} host name lookups are still waiting for the resolver")
    answer: list[list[IPAddress] | BaseException] = []

    def lookup() -> None:
        try:
            answer.append(list(resolver(host, port)))
        except BaseException as exc:  # handed to the caller, raised there
            answer.append(exc)
        finally:
            _lookups.release()

    thread = threading.Thread(target=lookup, name=f"resolve {host}", daemon=True)
    try:
        thread.start()
    except BaseException:  # no thread (RuntimeError: can't start new thread)
        _lookups.release()
        raise
    thread.join(timeout)
    if not answer:
        raise OSError(f"the resolver did not answer within {timeout:g} s")
    if isinstance(answer[0], BaseException):
        raise answer[0]
    return answer[0]


def addresses(target: Target, allow_private: bool,
              timeout: float | None = None) -> list[IPAddress]:  # fmt: skip
    """Resolve the target's host once (within ``timeout`` seconds) and return its
    addresses, every one of them allowed.

    Raise ``Refused`` if any address is forbidden (a name that resolves to one public and
    one private address is refused whole), ``OSError`` if the name does not resolve.
    """
    literal = target.address
    found = [literal] if literal is not None else resolve(target.host, target.port, timeout)
    if not found:
        raise OSError(f"{target.host} resolved to no address")
    for address in found:
        try:
            check_address(address, allow_private)
        except Refused as exc:
            via = "" if literal is not None else f"{target.host} resolves to "
            raise Refused(f"refused: {via}{exc}", exc.rule) from None
    return found
