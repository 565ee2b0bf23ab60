"""Ports of the distributed launches on one machine: a free one unless the user names one.

Every launch of this project that starts processes which rendezvous over TCP takes its port from here
(``mrtpo launch``, ``mrtpo matrix``, the tests that start distributed jobs), so two jobs on one machine
do not both ask for torch's default 29500:

- :func:`torchrun_rendezvous` gives torchrun's arguments: ``--standalone`` when no port is named
  (torchrun's own rendezvous store then binds port 0 and keeps it: the operating system picks a free
  port and nothing can take it in between), or the named port after :func:`check_port`;
- :func:`free_port` picks a port for launchers that need a number up front (``accelerate launch
  --main_process_port``, ``trl vllm-serve --port``): the operating system's choice for a socket bound
  to port 0, released just before the launcher binds it again (a window of a few seconds in which
  another process would have to be handed the same port);
- :func:`check_port` turns a named port that is taken into one line naming it and the flag that sets
  another (a :class:`PortInUse`, a ``ValueError``), instead of the launcher's traceback
  (``DistNetworkError ... EADDRINUSE``).

Standard library only.
"""

from __future__ import annotations

import socket


class PortInUse(ValueError):
    """A port the user named is taken on this machine (the message names it and the flag to change)."""


def free_port(host: str = "") -> int:
    """A TCP port no socket of this machine is bound to now (the operating system's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "") -> bool:
    """Whether a socket of this machine listens on (or is bound to) ``port``: a bind with
    ``SO_REUSEADDR`` fails then (it succeeds over connections that are only closing, TIME_WAIT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError:
            return True
    return False


def check_port(port: int, flag: str) -> int:
    """``port`` if it is a valid port number and free here; else a one-line ``ValueError`` (a
    :class:`PortInUse` when it is taken) naming the port and ``flag``, the option that sets another."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{flag} {port!r} is not a port number (1 to 65535)")
    if port_in_use(port):
        raise PortInUse(
            f"port {port} is in use on this machine (another job?); pick another with {flag} PORT, "
            f"or leave {flag} out to use a free one"
        )
    return port


def torchrun_rendezvous(port: int | None = None, flag: str = "--port") -> list[str]:
    """torchrun's rendezvous arguments for a launch on this machine: ``--standalone`` (a free port that
    torchrun binds itself) when ``port`` is None, else the checked ``port`` on 127.0.0.1."""
    if port is None:
        return ["--standalone"]
    check_port(port, flag)
    return ["--master_addr=127.0.0.1", f"--master_port={port}"]
