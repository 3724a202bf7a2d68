"""``python -m gc25d_core.cache verify|inspect|publish|import``."""

from __future__ import annotations

import json
import subprocess
import sys

from gc25d_core.cache import LocalStore, read_snapshot
from gc25d_core.cache.cli import main


def _result(capsys) -> dict:
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    return next(x for x in reversed(lines) if x.get("event") == "result")


def test_publish_inspect_verify_import(tmp_path, kit, capsys):
    store = LocalStore(tmp_path / "s")
    kit.pack_many(store, n_shards=2, per_shard=3)
    assert (
        main(
            [
                "publish",
                str(store.root),
                "--split-method",
                "explicit",
                "--val-group",
                "r3",
                "--exclude",
                "scene__r0__000000",
            ]
        )
        == 0
    )
    r = _result(capsys)
    assert r["snapshot"] == "v000001" and r["added_samples"] == 6 and not r["rejected"]

    assert main(["inspect", str(store.root), "--versions"]) == 0
    assert _result(capsys)["versions"] == [1]
    assert main(["inspect", str(store.root)]) == 0
    r = _result(capsys)
    assert (
        r["totals"]["num_samples"] == 6
        and r["totals"]["num_excluded"] == 1
        and r["shards_per_worker"] == {"w0": 2}
    )

    assert main(["verify", str(store.root), "--deep"]) == 0
    out = capsys.readouterr().out
    assert '"shards 2/2' in out or "shards 2/2" in out  # progress line
    r = json.loads(out.strip().splitlines()[-1])
    assert r["ok"] and r["samples_ok"] == 6

    assert (
        main(
            [
                "import",
                str(store.root),
                str(tmp_path / "new"),
                "--worker",
                "imp",
                "--schema",
                "gc25d_training_cache_v1",
                "--source-repo",
                "old/cache",
            ]
        )
        == 0
    )
    r = _result(capsys)
    assert len(r["imported"]) == 2
    sh = read_snapshot(store).manifest.shards[1]
    assert (tmp_path / "new" / r["imported"][1]).read_bytes() == (store.root / sh.path).read_bytes()


def test_verify_reports_corruption(tmp_path, kit, capsys):
    store, ref = kit.build_store(tmp_path / "s", n_shards=2, per_shard=3)
    sh = read_snapshot(store).manifest.shards[0]
    p = store.root / sh.path
    data = bytearray(p.read_bytes())
    data[600] ^= 4
    p.write_bytes(bytes(data))
    assert main(["verify", str(store.root)]) == 1
    r = _result(capsys)
    assert not r["ok"] and r["shards_ok"] == 1
    (f,) = r["failures"]
    assert f["shard"] == sh.path and f["sample"] == sh.samples[0].id and f["offset"] == 512


def test_module_entry_point(tmp_path, kit):
    store, ref = kit.build_store(tmp_path / "s", n_shards=1, per_shard=2)
    out = subprocess.run(
        [sys.executable, "-m", "gc25d_core.cache", "inspect", str(store.root), "--versions"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1])["versions"] == [1]
    bad = subprocess.run(
        [sys.executable, "-m", "gc25d_core.cache", "inspect", str(tmp_path / "empty")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "empty" in bad.stderr
