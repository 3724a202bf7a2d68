"""What a per-clip job reports (gc25d_core.preprocess.runner): the job's progress across ranks, and a
rerun that skips every clip reported as a skip that keeps what the data is."""

from __future__ import annotations

from pathlib import Path

from gc25d_core.preprocess.runner import ClipTask, RankCounts, run_task
from gc25d_core.report import StdoutReporter, human_bytes

from .train.world import synthetic_row


class _Rows:
    def __init__(self, out: Path, num: int):
        self.out = out
        self.rows = [synthetic_row("R10_s1512", 96 * i, "train") for i in range(num)]

    def task(self) -> ClipTask:
        def path(row) -> Path:
            return self.out / f"{row.clip_id}.bin"

        def build(row) -> int:
            path(row).parent.mkdir(parents=True, exist_ok=True)
            path(row).write_bytes(b"x" * 1536)
            return 1536

        return ClipTask("toy", lambda r: [path(r)], lambda r: path(r).is_file(), build=build)


def test_a_rerun_that_skips_every_clip_says_so_and_keeps_the_data_size(tmp_path):
    rows = _Rows(tmp_path / "out", 3)
    rep = StdoutReporter(rank=0)
    first = run_task(rows.task(), rows.rows, rep, tmp_path / "run")
    assert (first["status"], first["num_built"], first["size"], first["written"]) == (
        "built",
        3,
        "4.5 KiB",
        "4.5 KiB",
    )
    assert first["clips_per_s"] > 0
    again = run_task(rows.task(), rows.rows, rep, tmp_path / "run")
    assert again["status"] == "skipped: every clip was built before"
    assert (again["num_built"], again["num_skipped"], again["size"]) == (0, 3, "4.5 KiB")
    assert not {"clips_per_s", "seconds", "written"} & set(again)  # no rate of a check
    assert rep.materializations[-1]["metadata"] == again


def test_progress_of_rank_0_counts_every_rank(tmp_path):
    folder = tmp_path / "progress"
    zero, one = RankCounts(folder, 0, 2, every_s=0), RankCounts(folder, 1, 2, every_s=0)
    one(4)
    assert zero(3) == 7 and one(5) == 5  # rank 0: the job's count; rank 1: its own
    assert zero(3) == 8


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1536, 5 * 2**20, 3 * 2**40)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "5 MiB",
        "3 TiB",
    ]
