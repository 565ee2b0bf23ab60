"""What ``mrtpo launch`` was asked (:class:`Request`) and what it starts (:class:`Launch`, its :class:`Step` s),
shared by :mod:`mrtpo.launch` and the engines' rules in :mod:`mrtpo.launch.trl` and :mod:`mrtpo.launch.verl`."""

from __future__ import annotations

import dataclasses
import shlex

from mrtpo.integrations.trl.serve import DEFAULT_TIMEOUT


@dataclasses.dataclass
class Request:
    """What ``mrtpo launch`` was asked (its command-line options)."""

    recipe: str
    gpus: int | None = None
    nodes: int = 1
    node_rank: int = 0
    main_ip: str | None = None
    main_port: int | None = None
    engine: str | None = None
    vllm: str | None = None
    vllm_gpus: list[int] | None = None
    accelerate_config: str | None = None
    processes: int | None = None
    cpu: bool = False
    overrides: list[str] = dataclasses.field(default_factory=list)
    server_timeout: float = DEFAULT_TIMEOUT


@dataclasses.dataclass
class Step:
    """One command of a launch: ``env`` set before ``argv``; ``background``: started and left running
    while the next steps run (a vLLM server), stopped when the last step ends; ``health``: a URL that
    must answer 200 before the next step starts; ``log``: the file its output goes to."""

    role: str
    argv: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    background: bool = False
    health: str | None = None
    log: str | None = None

    def line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        cmd = shlex.join(self.argv)
        if self.log:
            cmd += f" > {shlex.quote(self.log)} 2>&1"
        return f"{env} {cmd}".strip() + (" &" if self.background else "")


@dataclasses.dataclass
class Launch:
    """The commands of one launch (for this node), what was changed and why, and the figures."""

    engine: str
    steps: list[Step]
    notes: list[str]
    processes: int
    port: int | None

    def text(self) -> str:
        lines = [f"# {n}" for n in self.notes]
        for s in self.steps:
            lines.append(f"# {s.role}:")
            lines.append(s.line())
            if s.health:  # by hand, as mrtpo launch does (up to --server-timeout)
                lines.append(
                    f"# then wait until it answers: until curl -sf {s.health} >/dev/null; do sleep 5; done"
                )
        return "\n".join(lines)
