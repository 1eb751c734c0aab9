"""Extended resource names as the kubelet validates them, and the socket file named after each.

The kubelet refuses a Register whose resource name fails ``IsExtendedResourceName``
(k8s.io/kubernetes pkg/apis/core/v1/helper). We run the same check before registering so a bad
name fails loudly at configuration time, naming the rule it breaks, instead of as a terse
``the ResourceName "..." is invalid`` in a retry loop. The kubelet stand-in uses the same
function, so both sides agree by construction.
"""

from __future__ import annotations

import re

from tessera.kubelet.errors import InvalidResourceNameError

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_DNS1123_SUBDOMAIN_MAX = 253
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_QUALIFIED_NAME_MAX = 63
_REQUESTS_PREFIX = "requests."
_NATIVE_NAMESPACE = "kubernetes.io/"

SOCKET_PREFIX = "tessera-"
SOCKET_SUFFIX = ".sock"


def resource_name_problem(name: str) -> str | None:
    """Why the kubelet would refuse ``name`` as an extended resource, or None if it would not.

    The rules, in the kubelet's order: the name must contain ``/`` and must not contain
    ``kubernetes.io/`` (else it is a native resource); it must not start with ``requests.``;
    and ``requests.<name>`` must be a qualified name: a DNS-1123 subdomain prefix of at most 253
    characters, ``/``, and a name part of at most 63 characters of ``[-A-Za-z0-9_.]`` that
    starts and ends alphanumeric.
    """
    if "/" not in name:
        return "has no domain prefix (e.g. 'nvidia.com/'), so Kubernetes treats it as native"
    if _NATIVE_NAMESPACE in name:
        return f"is in the reserved native namespace '{_NATIVE_NAMESPACE}'"
    if name.startswith(_REQUESTS_PREFIX):
        return f"starts with '{_REQUESTS_PREFIX}', which is reserved for quota"
    parts = (_REQUESTS_PREFIX + name).split("/")
    if len(parts) != 2:
        return "has more than one '/'"
    prefix, local = parts
    if len(prefix) > _DNS1123_SUBDOMAIN_MAX:
        return f"has a domain prefix longer than {_DNS1123_SUBDOMAIN_MAX - len(_REQUESTS_PREFIX)}"
    if _DNS1123_SUBDOMAIN.fullmatch(prefix) is None:
        return "has a domain prefix that is not a lowercase DNS subdomain"
    if not local:
        return "has an empty name after '/'"
    if len(local) > _QUALIFIED_NAME_MAX:
        return f"has a name part longer than {_QUALIFIED_NAME_MAX} characters"
    if _QUALIFIED_NAME.fullmatch(local) is None:
        return ("has a name part that is not alphanumeric, '-', '_' or '.', "
                "starting and ending alphanumeric")
    return None


def is_extended_resource_name(name: str) -> bool:
    """The kubelet's ``IsExtendedResourceName``."""
    return resource_name_problem(name) is None


def validate_resource_name(name: str) -> str:
    """Return ``name`` unchanged, or raise :class:`InvalidResourceNameError` saying why not."""
    problem = resource_name_problem(name)
    if problem is not None:
        raise InvalidResourceNameError("resource_name", f"{name!r} {problem}")
    return name


def socket_name(resource_name: str) -> str:
    """The plugin socket file name for a resource: ``tessera-<domain>_<name>.sock``.

    Like NVIDIA's ``nvidia-<name>.sock`` it is readable in ``ls``, but it keeps the domain so
    ``example.com/gpu`` and ``nvidia.com/gpu`` cannot collide, and it never clashes with
    NVIDIA's own plugin's sockets. The mapping is injective: ``_`` cannot occur in the domain, so
    the first ``_`` is where ``/`` was. ``nvidia.com/mig-1g.10gb`` gives
    ``tessera-nvidia.com_mig-1g.10gb.sock``.
    """
    validate_resource_name(resource_name)
    return SOCKET_PREFIX + resource_name.replace("/", "_", 1) + SOCKET_SUFFIX
