"""Kubernetes' rules for names and small values (apimachinery's validation): DNS labels and subdomains,
qualified names and label values, driver and attribute names, quantities and RFC 3339 times. Each check
returns the rule a value breaks, as a phrase a problem line ends with, or None."""

from __future__ import annotations

import datetime
import re

MAX_DRIVER_NAME = 63
MAX_ATTRIBUTE_ID = 32  # DeviceMaxIDLength
DNS_LABEL_RULE = "must be a DNS label (lowercase letters, digits and '-', at most 63 characters)"
DNS_SUBDOMAIN_RULE = ("must be a DNS subdomain (lowercase letters, digits, '-' and '.', starting and ending with a "
                      "letter or digit, at most 253 characters)")

# fullmatch only: `$` would also accept a trailing newline.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
# A C identifier, plus '-': the contract allows the lab's gpu.nvidia.com/numa-node, which Kubernetes refuses.
_ATTRIBUTE_ID = re.compile(r"[A-Za-z_][-A-Za-z0-9_]*")
_QUANTITY = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?")
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-](\d{2}):(\d{2}))")
RFC3339_RULE = "must be an RFC 3339 time such as 2026-01-02T15:04:05Z"


def is_quantity(text: str) -> bool:
    """What resource.ParseQuantity takes (a capacity request decodes through it): a number, then a suffix,
    where a decimal exponent (1e3) must fit an int64."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        return False
    suffix = match[3] or ""
    if len(suffix) < 2 or suffix[0] not in "eE":
        return True  # no exponent: 1E is one exa
    sign, digits = ("-" if suffix[1] == "-" else ""), suffix[1:].lstrip("+-").lstrip("0")
    return len(digits) <= 19 and -(2**63) <= int(sign + (digits or "0")) < 2**63


def is_dns_label(value: object) -> bool:
    """RFC 1123 label, as Kubernetes checks namespaces, request names and (here) tenants and cohorts."""
    return isinstance(value, str) and _DNS_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: object) -> bool:
    """RFC 1123 subdomain of at most 253 characters, as Kubernetes checks object names."""
    return isinstance(value, str) and len(value) <= 253 and _DNS_SUBDOMAIN.fullmatch(value) is not None


def qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a label or annotation key (`[prefix/]name`, apimachinery IsQualifiedName)."""
    prefix, slash, name = key.rpartition("/")
    if key.count("/") > 1:
        return "must be a name with an optional DNS subdomain prefix and '/'"
    if slash and not prefix:
        return "prefix part must not be empty"
    if slash and not is_dns_subdomain(prefix):
        return f"prefix part {DNS_SUBDOMAIN_RULE}"
    if not name:
        return "name part must not be empty"
    if len(name) > 63:
        return "name part must be at most 63 characters"
    if not _QUALIFIED_PART.fullmatch(name):
        return "name part must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    return None


def label_value_problem(value: str) -> str | None:
    if len(value) > 63:
        return "must be at most 63 characters"
    if not _LABEL_VALUE.fullmatch(value):
        return "must be empty or letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    return None


def driver_name_problem(driver: str) -> str | None:
    """A driver name as Kubernetes checks it (ValidateCSIDriverName: a DNS subdomain, case-insensitive)."""
    if not driver:
        return "is required"
    if len(driver) > MAX_DRIVER_NAME:
        return f"must be at most {MAX_DRIVER_NAME} characters"
    if not is_dns_subdomain(driver.lower()):
        return DNS_SUBDOMAIN_RULE
    return None


def attribute_name_problem(name: str, *, domain_required: bool = True) -> str | None:
    """`<domain>/<identifier>` (a FullyQualifiedName), or a bare identifier where the domain may be left out
    (a QualifiedName); the identifier may hold '-' (the contract's one departure from Kubernetes)."""
    domain, slash, identifier = name.rpartition("/")
    if (domain_required and not slash) or "/" in domain:
        return "must be a domain and a name separated by one '/', e.g. gpu.nvidia.com/numa-node"
    if slash and (problem := driver_name_problem(domain)) is not None:
        return f"domain {problem}"
    if len(identifier) > MAX_ATTRIBUTE_ID or not _ATTRIBUTE_ID.fullmatch(identifier):
        return (f"name must be at most {MAX_ATTRIBUTE_ID} letters, digits, '_' or '-', starting with a letter "
                "or '_'")
    return None


def is_rfc3339(text: str) -> bool:
    """What Go's time.Parse(time.RFC3339, ...) takes (metav1.Time's JSON form): anything else fails to decode."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return False
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    try:
        datetime.date(year, month, day)
    except ValueError:
        return False
    zone_ok = match[8] == "Z" or (int(match[9]) < 24 and int(match[10]) < 60)
    return hour < 24 and minute < 60 and second < 60 and zone_ok


def generate_name_problem(prefix: str) -> str | None:
    """NameIsDNSSubdomain(prefix, true): a trailing '-' is masked (apimachinery's maskTrailingDash, which
    drops the last two characters and appends 'a'), the rest must make a DNS subdomain."""
    masked = prefix[:-2] + "a" if len(prefix) > 1 and prefix.endswith("-") else prefix
    return None if is_dns_subdomain(masked) else f"{DNS_SUBDOMAIN_RULE}; a trailing '-' is allowed"
