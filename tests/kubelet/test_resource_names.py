"""Resource names are checked with the kubelet's own rule before we ever register."""

from __future__ import annotations

import pytest

from tessera.kubelet.errors import InvalidResourceNameError
from tessera.kubelet.resourcenames import (
    is_extended_resource_name,
    socket_name,
    validate_resource_name,
)


@pytest.mark.parametrize("name", [
    "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb.me",
    "example.com/mps-gpu.shared", "tessera.dev/Gpu_Share", "a/b", "x.y/" + "n" * 63,
])
def test_accepts_extended_resource_names(name: str) -> None:
    assert is_extended_resource_name(name)
    assert validate_resource_name(name) == name


@pytest.mark.parametrize(("name", "why"), [
    ("gpu", "no domain prefix"),
    ("kubernetes.io/gpu", "native namespace"),
    ("foo.kubernetes.io/gpu", "native namespace"),
    ("requests.example.com/x", "quota"),
    ("Example.COM/gpu", "lowercase DNS subdomain"),
    ("example.com/-bad", "starting and ending alphanumeric"),
    ("example.com/bad-", "starting and ending alphanumeric"),
    ("example.com/", "empty name"),
    ("/gpu", "lowercase DNS subdomain"),
    ("a/b/c", "more than one '/'"),
    ("example.com/" + "n" * 64, "longer than 63"),
    ("example.com/has space", "not alphanumeric"),
    ("x" * 250 + ".com/gpu", "longer than 244"),
])
def test_refuses_names_the_kubelet_refuses_and_says_why(name: str, why: str) -> None:
    assert not is_extended_resource_name(name)
    with pytest.raises(InvalidResourceNameError, match="resource_name") as info:
        validate_resource_name(name)
    assert why in str(info.value)


def test_socket_names_are_readable_and_keep_the_domain() -> None:
    assert socket_name("nvidia.com/mig-1g.10gb") == "tessera-nvidia.com_mig-1g.10gb.sock"
    assert socket_name("nvidia.com/gpu") != socket_name("example.com/gpu")


def test_socket_name_refuses_invalid_resource_names() -> None:
    with pytest.raises(InvalidResourceNameError):
        socket_name("kubernetes.io/gpu")
