"""Free ports for the launches on one machine, and one line for a port that is taken."""

from __future__ import annotations

import socket

import pytest

from mrtpo.integrations.ports import PortInUse, check_port, free_port, port_in_use, torchrun_rendezvous


def _listen() -> tuple[socket.socket, int]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, s.getsockname()[1]


def test_free_port_can_be_bound_and_a_listening_port_is_in_use():
    port = free_port()
    assert 1 <= port <= 65535 and not port_in_use(port)
    with socket.socket() as s:  # the operating system lets us bind it: it was free
        s.bind(("", port))
    held, taken = _listen()
    try:
        assert port_in_use(taken)
        with pytest.raises(PortInUse) as e:
            check_port(taken, "--main-port")
        msg = str(e.value)
        assert f"port {taken} is in use" in msg and "--main-port PORT" in msg and "\n" not in msg
        with pytest.raises(PortInUse, match=f"port {taken} is in use.*--port PORT"):
            torchrun_rendezvous(taken, "--port")
    finally:
        held.close()
    assert not port_in_use(taken)  # released: usable again
    assert check_port(taken, "--main-port") == taken


def test_torchrun_arguments_and_bad_numbers():
    assert torchrun_rendezvous() == ["--standalone"]  # torchrun binds a free port itself
    port = free_port()
    assert torchrun_rendezvous(port) == ["--master_addr=127.0.0.1", f"--master_port={port}"]
    for bad in (0, 70000, -1, True, "29500"):
        with pytest.raises(ValueError, match="is not a port number"):
            check_port(bad, "--main-port")
