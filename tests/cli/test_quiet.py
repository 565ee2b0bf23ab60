"""Third-party warnings held back and counted; mrtpo's own and errors shown."""

from __future__ import annotations

import logging
import warnings

from mrtpo.cli.quiet import MRTPO_DIR, WarningTally


def test_tally_holds_back_third_party_warnings_and_counts_kinds(capsys):
    shown = []
    before = warnings.showwarning
    warnings.showwarning = lambda *a, **k: shown.append(str(a[0]))
    tally = WarningTally().install()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            for _ in range(3):  # one kind, three times
                warnings.warn_explicit("`x` is deprecated", FutureWarning, "/lib/site-packages/tr/a.py", 7)
            warnings.warn_explicit("unused parameters", UserWarning, "/lib/site-packages/torch/b.py", 9)
            warnings.warn_explicit("ours", UserWarning, f"{MRTPO_DIR}/cli/train.py", 1)  # mrtpo's: shown
        logging.getLogger("DeepSpeed").warning("Setting accelerator to CPU.")  # filtered at the logger
        child = logging.getLogger("transformers.trainer_demo")
        handler = logging.StreamHandler()
        logging.getLogger("transformers").addHandler(handler)
        tally.cover_handlers()
        child.warning("a hub warning")  # reaches the library's handler: held back
        child.error("an error")  # errors are printed
    finally:
        tally.uninstall()
        logging.getLogger("transformers").removeHandler(handler)
        warnings.showwarning = before
    assert shown == ["ours"]
    assert tally.count == 6 and len(tally.kinds) == 4
    assert tally.kinds["FutureWarning: `x` is deprecated"] == 3
    assert tally.kinds["DeepSpeed: Setting accelerator to CPU."] == 1
    assert tally.kinds["transformers.trainer_demo: a hub warning"] == 1
    assert tally.summary() == "6 third-party warnings of 4 kinds hidden (this process); --verbose shows them"
    err = capsys.readouterr().err
    assert "an error" in err and "a hub warning" not in err
    # uninstalled: nothing is held back any more
    assert tally not in logging.getLogger("DeepSpeed").filters and warnings.showwarning is before
    assert WarningTally().summary() is None
