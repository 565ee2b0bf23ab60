"""Third-party warnings held back during ``mrtpo train`` and summarized once at the end.

Python warnings raised outside mrtpo's own modules (transformers, TRL, DeepSpeed, torch, ...) and
WARNING records of third-party loggers are counted instead of printed; :meth:`WarningTally.summary`
gives the one line printed at the end (``--verbose`` prints them all as they come). mrtpo's own
warnings and every ERROR are printed as usual. Standard library only (used before torch is imported).
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from pathlib import Path

MRTPO_DIR = str(Path(__file__).resolve().parents[1])

# loggers whose WARNING records are held back: those named before their library is imported (DeepSpeed
# logs "Setting accelerator to CPU" while being imported), and the handlers found after the imports
LIBRARY_LOGGERS = ("DeepSpeed", "transformers", "accelerate", "trl", "peft", "torch", "datasets")


def _kind(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:120]


class WarningTally(logging.Filter):
    """Counts (and holds back) third-party warnings; install with :meth:`install`, undo with
    :meth:`uninstall`."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: Counter[str] = Counter()
        self._show = None
        self.done = False  # summarized (mrtpo.cli.train)
        self._last: logging.LogRecord | None = None
        self._filtered: list[logging.Filterer] = []

    # logging.Filter: False drops the record
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or record.name.split(".")[0] == "mrtpo":
            return True
        if record is self._last:  # the same record at a second handler: counted once
            return False
        self._last = record
        try:
            text = record.getMessage()
        except Exception:  # a malformed record: let logging report it
            return True
        self.kinds[f"{record.name}: {_kind(text)}"] += 1
        return False

    def _showwarning(self, message, category, filename, lineno, file=None, line=None):
        if str(filename).startswith(MRTPO_DIR):
            return self._show(message, category, filename, lineno, file, line)
        self.kinds[f"{category.__name__}: {_kind(str(message))}"] += 1
        return None

    def install(self) -> WarningTally:
        self._show = warnings.showwarning
        warnings.showwarning = self._showwarning
        for name in LIBRARY_LOGGERS:
            self._add(logging.getLogger(name))
        self._add(logging.lastResort) if logging.lastResort is not None else None
        return self

    def _add(self, filterer: logging.Filterer) -> None:
        if self not in filterer.filters:
            filterer.addFilter(self)
            self._filtered.append(filterer)

    def cover_handlers(self) -> None:
        """Hold back the WARNING records that reach any third-party logger's handlers (called after the
        heavy imports, once the libraries have set their handlers up)."""
        for name, logger in list(logging.root.manager.loggerDict.items()):
            if isinstance(logger, logging.Logger) and name.split(".")[0] != "mrtpo":
                for handler in logger.handlers:
                    self._add(handler)

    def uninstall(self) -> None:
        if self._show is not None and warnings.showwarning == self._showwarning:
            warnings.showwarning = self._show
        for f in self._filtered:
            f.removeFilter(self)
        self._filtered.clear()

    @property
    def count(self) -> int:
        return sum(self.kinds.values())

    def summary(self) -> str | None:
        """``"N third-party warnings of K kinds hidden; --verbose shows them"``, or None when none came."""
        n, k = self.count, len(self.kinds)
        if not n:
            return None
        return (
            f"{n} third-party warning{'s' if n != 1 else ''} of {k} kind{'s' if k != 1 else ''} hidden "
            "(this process); --verbose shows them"
        )
