"""The verl rules of ``mrtpo launch`` (:mod:`mrtpo.launch`): mrtpo's entry point for token credit, else verl's
own, with ``trainer.n_gpus_per_node`` and ``trainer.nnodes``; several nodes start a Ray cluster first and
node 0 waits for every node (:mod:`mrtpo.launch.ray_wait`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mrtpo.launch.steps import Launch, Request, Step
from mrtpo.recipes import get, hydra_pairs

RAY_PORT = 6379  # Ray's default GCS port for `ray start --head`


def _response_level(credit: str) -> bool:
    """``credit`` names the response-level method (the registry's answer: imports torch, verl recipes only)."""
    from mrtpo.credit import RESPONSE_LEVEL

    return credit == RESPONSE_LEVEL


def build_verl(req: Request, raw: dict[str, Any]) -> Launch:
    values = {k: v for k, v in hydra_pairs(req.overrides)}
    # algorithm.mrtpo is the method block: its credit defaults to reward (MethodConfig's); without the block
    # the recipe is verl's own
    block = get(raw, "algorithm.mrtpo") is not None or any(k.startswith("algorithm.mrtpo.") for k in values)
    from mrtpo.method import MethodConfig

    credit = values.get(
        "algorithm.mrtpo.credit", get(raw, "algorithm.mrtpo.credit", MethodConfig.credit if block else None)
    )
    # the response-level method alone is verl's own; every credit scheme (its ablations included) is mrtpo's
    entry = (
        "verl.trainer.main_ppo"
        if credit is None or _response_level(credit)
        else "mrtpo.integrations.verl.main"
    )
    gpus, nodes = int(req.gpus), req.nodes
    total = gpus * nodes
    batch = values.get("data.train_batch_size", get(raw, "data.train_batch_size"))
    n = values.get("actor_rollout_ref.rollout.n", get(raw, "actor_rollout_ref.rollout.n", 1))
    if batch is not None and (int(batch) * int(n)) % total:
        raise ValueError(
            f"verl needs data.train_batch_size x rollout.n = {batch} x {n} = {int(batch) * int(n)} divisible by the "
            f"{total} GPUs; use a GPU count that divides it or set -- data.train_batch_size=..."
        )
    path = Path(req.recipe).resolve()
    argv = ["python", "-m", entry, f"--config-path={path.parent}", f"--config-name={path.stem}",
            f"trainer.n_gpus_per_node={gpus}", f"trainer.nnodes={nodes}", *req.overrides]  # fmt: skip
    why = (
        "response-level credit"
        if entry == "verl.trainer.main_ppo"
        else "token credit: replay on the actor workers"
    )
    notes = [
        f"verl: {total} GPUs ({nodes} node{'s' if nodes > 1 else ''} x {gpus}), entry point {entry} ({why})"
    ]
    steps: list[Step] = []
    port = None
    if nodes > 1:
        port = req.main_port or RAY_PORT
        address = f"{req.main_ip}:{port}"
        if req.node_rank == 0:
            steps.append(Step("Ray head", ["ray", "start", "--head", f"--port={port}", f"--num-gpus={gpus}"]))
            steps.append(Step("wait for every node", ["python", "-m", "mrtpo.launch.ray_wait",
                                                      "--nodes", str(nodes), "--address", address]))  # fmt: skip
            steps.append(Step("verl", argv, {"RAY_ADDRESS": address}))
            notes.append(
                f"Ray: node 0 is the head ({address}); start the other nodes with --node-rank 1..{nodes - 1}"
            )
        else:
            steps.append(Step(f"Ray worker, node {req.node_rank} of {nodes}",
                              ["ray", "start", f"--address={address}", f"--num-gpus={gpus}", "--block"]))  # fmt: skip
    else:
        steps.append(Step("verl", argv))
        notes.append("Ray: verl starts a local Ray instance (its ports are chosen free by Ray)")
    return Launch("verl", steps, notes, total, port)
