import json

from gc25d_core import report
from gc25d_core.report import StdoutReporter, open_reporter


def test_rank0_prints_json_lines_and_other_ranks_stay_silent(capsys):
    r0, r1 = StdoutReporter(rank=0), StdoutReporter(rank=1)
    r0.log("hello")
    r0.metrics(step=3, loss=0.5)
    r0.materialize({"n": 2}, data_version="v1")
    r1.log("from rank 1")
    r1.materialize({"n": 99})
    out, err = capsys.readouterr()
    records = [json.loads(line) for line in out.splitlines()]
    assert records == [
        {"event": "log", "level": "info", "message": "hello"},
        {"event": "metrics", "step": 3, "loss": 0.5},
        {"event": "materialize", "metadata": {"n": 2}, "data_version": "v1"},
    ]
    assert "[rank 1] info: from rank 1" in err
    assert r1.materializations == [] and len(r0.materializations) == 1


def test_progress_reports_rate_and_eta(capsys):
    rep = StdoutReporter(rank=0)
    bar = rep.progress(total=4, unit="clips", every_s=0.0)
    for _ in range(4):
        bar.update()
    lines = [json.loads(x)["message"] for x in capsys.readouterr().out.splitlines()]
    assert lines[0].startswith("clips 1/4 (") and "ETA" in lines[0]
    assert lines[-1].startswith("clips 4/4 (") and "ETA 0s" in lines[-1]
    assert bar.summary()["done"] == 4


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_resumed_progress_counts_only_this_sessions_steps_in_rate_and_eta(capsys):
    """A run resumed at 400 of 404 that takes 1 s per step: 0.9-ish steps/s and 3 s left after its
    first step, not 401 steps over 1 s with no time left."""
    from gc25d_core.report import Progress

    clock = FakeClock()
    bar = Progress(StdoutReporter(rank=0), total=404, unit="steps", every_s=0.0, start=400, clock=clock)
    clock.now += 1.0
    bar.update()
    s = bar.summary()
    assert (s["done"], s["start"], s["per_s"], s["eta_s"]) == (401, 400, 1.0, 3.0)
    clock.now += 3.0
    for _ in range(3):
        bar.update()
    lines = [json.loads(x)["message"] for x in capsys.readouterr().out.splitlines()]
    assert lines[0] == "steps 401/404 (resumed at 400, 1.00 steps/s, ETA 3s)"
    assert lines[-1] == "steps 404/404 (resumed at 400, 1.00 steps/s, ETA 0s)"


def test_fresh_progress_line_does_not_mention_a_resume(capsys):
    from gc25d_core.report import Progress

    clock = FakeClock()
    bar = Progress(StdoutReporter(rank=0), total=4, unit="clips", every_s=0.0, clock=clock)
    clock.now += 2.0
    bar.update()
    assert json.loads(capsys.readouterr().out)["message"] == "clips 1/4 (0.50 clips/s, ETA 6s)"


def test_reporters_pass_the_resumed_count_on():
    rep = StdoutReporter(rank=0)
    assert rep.progress(total=10, unit="steps", start=7).start == 7
    assert rep.progress(total=10, unit="steps", start=7).done == 7


def test_open_reporter_uses_stdout_without_dagster(monkeypatch):
    monkeypatch.delenv("DAGSTER_PIPES_CONTEXT", raising=False)
    with open_reporter() as rep:
        assert isinstance(rep, StdoutReporter)


def test_pipes_only_on_global_rank_0(monkeypatch):
    monkeypatch.setattr(report, "launched_by_dagster", lambda: True)
    monkeypatch.setenv("RANK", "1")
    with open_reporter() as rep:  # rank 1 must never open Pipes even when launched by Dagster
        assert isinstance(rep, StdoutReporter) and rep.rank == 1


def test_pipes_metadata_wraps_nested_dicts_for_dagster_pipes():
    import numpy as np
    from dagster_pipes import _normalize_param_metadata

    from gc25d_core.report import pipes_metadata

    md = pipes_metadata(
        {"n": np.int64(3), "curve": {"6": 1.5}, "hosts": ["a"], "none": None, "x": np.float32(2)}
    )
    assert md == {
        "n": 3,
        "curve": {"raw_value": {"6": 1.5}, "type": "json"},
        "hosts": ["a"],
        "none": None,
        "x": 2.0,
    }
    _normalize_param_metadata(md, "report_asset_materialization", "metadata")  # what Pipes itself checks


class _Tty:
    """A stderr that says it is a terminal of 100 columns (tqdm draws only on one)."""

    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass

    def isatty(self):
        return True

    def fileno(self):
        raise OSError("no fd")  # tqdm then falls back to a fixed width


def test_command_lines_draw_a_bar_on_a_terminal_and_log_rates_elsewhere(monkeypatch, capsys):
    import sys

    from gc25d_core.report import BarProgress, StdoutReporter

    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    bar = StdoutReporter(rank=0, bars=True).progress(total=4, unit="shards")
    assert isinstance(bar, BarProgress)
    for _ in range(4):
        bar.update(1)
    assert "4/4" in tty.text and "shards" in tty.text
    monkeypatch.undo()
    capsys.readouterr()
    lines = StdoutReporter(rank=0, bars=True).progress(total=2, unit="shards")  # stderr is no terminal
    lines.update(2)
    assert "shards 2/2" in capsys.readouterr().out
