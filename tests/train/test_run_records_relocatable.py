"""A run folder names no absolute path: its records stay true when the runs root moves (the data
safety rule: nothing in a run folder pins the machine or checkout that wrote it)."""

from __future__ import annotations

from pathlib import Path

from gc25d_core.report import StdoutReporter
from gc25d_core.train.loop import run_stage
from gc25d_core.train.sft import with_sft
from tests.train.world import sft_world


def _texts(folder: Path):
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.suffix in (".json", ".jsonl", ".yaml", ".yml", ".txt", ".toml"):
            yield p, p.read_text(errors="replace")


def test_an_sft_run_folder_names_no_absolute_path(tmp_path, one_thread):
    """A 2-step SFT with its export, state slot, done.json and hand-off: no record the run writes
    (logs, metrics, summaries, hand-offs) names the folder it ran in; its config.yaml is the config
    as given (a preset's relative roots stay relative; this test's world gives absolute ones)."""
    from gc25d_core.config import to_yaml

    cfg = with_sft(
        sft_world(tmp_path / "world"),
        "tiny",
        {"engine": "torch", "max_steps": 2, "state_every": 2, "export_every": 2},
    )
    run_dir = Path(cfg.paths.runs_root) / "sft" / "v000001"
    run_stage(cfg, "sft", run_dir, StdoutReporter(rank=0))
    assert (run_dir / "done.json").is_file() and list((run_dir / "exports").glob("step-*.safetensors"))
    assert (run_dir / "config.yaml").read_text() == to_yaml(cfg)
    roots = {str(tmp_path), str(tmp_path.resolve())}
    found = [
        f"{p.relative_to(run_dir)} names {r}"
        for p, text in _texts(run_dir)
        if p.name != "config.yaml"
        for r in roots
        if r in text
    ]
    assert not found, found
