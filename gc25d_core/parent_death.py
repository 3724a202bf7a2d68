"""Die with the launching parent: the kernel's parent-death signal, armed as early as Python can.

Imported first by every job entry point (``gc25d_core/jobs/__init__.py`` runs ``die_with_parent``
before ``python -m gc25d_core.jobs.<name>`` imports torch), so it needs nothing but the standard
library's smallest modules: each import before the ``prctl`` is time in which a killed torchrun
leaves this rank running unarmed. Why a parent-death signal at all, and why SIGKILL:
``gc25d_core.lifeline``.

Whom to die with:

- ``GC25D_LIFELINE_PARENT`` (set by ``python -m gc25d_core.lifeline`` and by TorchrunLauncher for
  the process it starts): that pid. A parent that died before the ``prctl`` is detected exactly
  (this process was re-parented, ``getppid()`` differs) and this process kills itself.
- Under a plain ``torchrun`` (``TORCHELASTIC_RUN_ID`` set, no pid handed down): the parent seen at
  the first line of this function, i.e. at the first import of ``gc25d_core.jobs``. An agent killed
  between fork and that line (interpreter start-up, ~0.1 s) cannot be told from a live one, because
  nothing in the rank's environment names the agent's pid; killed at any later point (torch's and
  the job's imports take seconds), the rank dies with it.

The signal follows the parent *thread* that forked: torchrun's elastic agent starts its ranks from
its main thread (``LocalElasticAgent.run`` -> ``_start_workers`` -> ``subprocess.Popen``, no worker
thread in between), and so does the wrapper. Linux only: elsewhere this is a no-op.
"""

from __future__ import annotations

import os
import signal
import sys

PARENT_ENV = "GC25D_LIFELINE_PARENT"  # pid of the process whose death must kill this one
TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"  # set by torch's elastic agent in every rank's environment
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_armed_for: int | None = None  # the parent this process is bound to, once armed


def expected_parent(ppid_now: int) -> int | None:
    """The parent this process must die with; None when nobody asked for it (run by hand)."""
    raw = os.environ.pop(PARENT_ENV, None)  # popped: our own children have another parent
    if raw is not None:
        if not raw.isdigit() or int(raw) <= 1:
            raise ValueError(f"environment {PARENT_ENV}={raw!r}: expected the pid of the launching process")
        return int(raw)
    if TORCHRUN_ENV in os.environ:
        return ppid_now
    return None


def _set_parent_death_signal(sig: signal.Signals) -> None:
    import ctypes  # here: imported only on Linux, where prctl exists

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")


def die_with_parent() -> int | None:
    """Be SIGKILLed by the kernel when the launching parent dies; die now if it already has.

    Idempotent: the entry package arms it on import and ``jobs.common.run_job`` calls it again.
    Returns the pid this process is bound to (None: not bound, or not Linux)."""
    global _armed_for
    if _armed_for is not None or not sys.platform.startswith("linux"):
        return _armed_for
    ppid = os.getppid()  # before anything else: the parent as close to the fork as we can see it
    expected = expected_parent(ppid)
    if expected is None:
        return None
    _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != expected:
        # The parent died before prctl armed the signal: we were re-parented and would never get it.
        os.kill(os.getpid(), signal.SIGKILL)
    _armed_for = expected
    return expected
