"""Process helpers for launcher tests: the peer agents a multi-node test starts, and process lookups."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import psutil


def processes_with(marker: str) -> list[psutil.Process]:
    """Every process (but this one) whose command line mentions ``marker`` (a tmp run folder)."""
    procs = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid != os.getpid() and any(marker in part for part in (p.info["cmdline"] or [])):
                procs.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return procs


class PeerNodes(threading.Thread):
    """Plays the other machines: starts ``bash peer_node.sh <node>`` for every peer script that a
    TorchrunLauncher writes under ``root`` (one per attempt), with ``env`` added."""

    def __init__(self, root: Path, nodes: list[int], env: dict[str, str] | None = None):
        super().__init__(daemon=True)
        self.root, self.nodes, self.env = root, nodes, env or {}
        self.procs: list[subprocess.Popen] = []
        self.started_scripts: list[Path] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.2):
            for script in sorted(self.root.rglob("peer_node.sh")):
                if script in self.started_scripts:
                    continue
                self.started_scripts.append(script)
                for node in self.nodes:
                    log = open(script.parent / f"peer-{node}.log", "wb")  # noqa: SIM115 (lives with the process)
                    self.procs.append(
                        subprocess.Popen(
                            ["bash", str(script), str(node)],
                            env={**os.environ, **self.env},
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
