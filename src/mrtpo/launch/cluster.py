"""The cluster facts of ``mrtpo launch`` (and ``mrtpo plan``'s bounds), without reading a recipe (the vLLM
server split of a recipe's batch is :func:`mrtpo.recipes.server_split`, which ``mrtpo plan`` counts too):

- :func:`check_bounds`: ``--gpus``, ``--nodes``, ``--processes`` within sane bounds, checked before anything
  is read, so that nothing is sized by an unchecked number;
- :func:`visible_devices`: what GPU positions stand for inside a set ``CUDA_VISIBLE_DEVICES`` (a job's mask
  is narrowed, never replaced by absolute indices);
- :func:`shared_folder_note`: whether several nodes would write sharded checkpoints into a folder that
  does not look shared (:func:`file_system` reads ``/proc/mounts``).

Standard library and PyYAML only.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

MAX_GPUS = 64  # GPUs per node: the largest machines hold 8 to 16; more is a typo
MAX_NODES = 1024
MAX_PROCESSES = 256  # CPU processes per node
MAX_TOKENS = 2**20  # a prompt or response length of mrtpo plan's assumptions


def check_bounds(gpus: int | None = None, nodes: int | None = None, processes: int | None = None) -> None:
    """``--gpus``, ``--nodes`` and ``--processes`` within sane bounds (one line each), checked before anything
    is read or built: nothing is ever sized by an unchecked number. ``mrtpo plan`` checks the same."""
    for flag, value, low, high, what in (("--gpus", gpus, 0, MAX_GPUS, "GPUs per node"),
                                         ("--nodes", nodes, 1, MAX_NODES, "machines"),
                                         ("--processes", processes, 1, MAX_PROCESSES, "CPU processes per node")):  # fmt: skip
        if value is not None and not low <= value <= high:
            raise ValueError(f"{flag} {value} must be in [{low}, {high}] ({what})")


def check_lengths(**lengths: int | None) -> None:
    """Token lengths given on the command line (``--response-tokens`` as ``response_tokens``) in
    ``[1, MAX_TOKENS]``, one line naming the flag."""
    for name, value in lengths.items():
        if value is not None and not 1 <= value <= MAX_TOKENS:
            raise ValueError(f"--{name.replace('_', '-')} {value} must be in [1, {MAX_TOKENS}] tokens")


def visible_mask(environ: dict[str, str] | None = None) -> list[str]:
    """The entries of a set ``CUDA_VISIBLE_DEVICES`` (SLURM's, a restricted mask), in order; [] when unset."""
    mask = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES", "")
    return [x.strip() for x in mask.split(",") if x.strip()]


def visible_devices(gpus: int, environ: dict[str, str] | None = None) -> list[str]:
    """What GPU positions ``0 .. gpus-1`` (``--vllm-gpus``'s numbers) stand for: the entries of a set
    ``CUDA_VISIBLE_DEVICES`` taken in order (indices or UUIDs: a job's mask is narrowed, never replaced by
    absolute indices), else the indices themselves."""
    mask = visible_mask(environ)
    if not mask:
        return [str(i) for i in range(gpus)]
    if len(mask) < gpus:
        raise ValueError(
            f"CUDA_VISIBLE_DEVICES={','.join(mask)} names {len(mask)} GPU{'s' if len(mask) > 1 else ''}, fewer than "
            f"--gpus {gpus}: use --gpus {len(mask)}, or widen the mask"
        )
    return mask[:gpus]


SHARED_FILE_SYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "ceph", "glusterfs",
                       "wekafs", "panfs", "afs", "9p", "virtiofs", "fuse.")  # fmt: skip
"""File system types (prefixes) of ``/proc/mounts`` that several machines mount as one (``fuse.``: FUSE
clients such as JuiceFS, s3fs, gcsfuse)."""
LOOPBACK = ("127.", "localhost", "::1")


def file_system(path: str | Path, mounts: str = "/proc/mounts") -> str | None:
    """The type of the file system holding ``path`` (its nearest existing folder), from ``mounts``; None
    when it cannot be read (not Linux)."""
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    where = Path(path).expanduser().absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    where = where.resolve()
    best, kind = -1, None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        if (where == Path(point) or Path(point) in where.parents) and len(point) > best:
            best, kind = len(point), parts[2]
    return kind


def shared_folder_note(
    config: Path, output_dir: str, main_ip: str, mounts: str = "/proc/mounts"
) -> str | None:
    """A note when several nodes would save sharded checkpoints (DeepSpeed: every rank writes its optimizer
    shard; FSDP with ``SHARDED_STATE_DICT``) into ``output_dir`` and that folder does not look shared: on a
    local file system of this node each node keeps its own shards and ``--resume`` finds some missing. None
    when the checkpoints are not sharded, the nodes are on this host (``main_ip`` a loopback address) or
    the folder is on a network file system."""
    try:
        cfg = yaml.safe_load(Path(config).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    fsdp = cfg.get("fsdp_config") or {}
    sharded = cfg.get("distributed_type") == "DEEPSPEED" or (
        cfg.get("distributed_type") == "FSDP" and fsdp.get("fsdp_state_dict_type") == "SHARDED_STATE_DICT"
    )
    if not sharded or main_ip.startswith(LOOPBACK):
        return None
    kind = file_system(output_dir, mounts)
    if kind is not None and kind.startswith(SHARED_FILE_SYSTEMS):
        return None
    on = (
        f"on a local {kind} file system of this node"
        if kind
        else "on a file system whose type is not known here"
    )
    return (
        f"checkpoints: every rank writes its shard of each checkpoint into trl.output_dir ({output_dir}), {on}; "
        "unless every node sees this folder as one shared folder (NFS, Lustre, ...), each node keeps only its own "
        "shards and --resume refuses the checkpoints: point -- --trl.output_dir at a shared folder"
    )
