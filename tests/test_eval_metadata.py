"""The eval asset's metadata as the asset page lists it: the comparison table first (a table entry,
drawn inline), then the main plot, then what was measured (short enough to be shown inline), then the
whole report with every plot inline; no entry per plot."""

import base64

import dagster as dg

from gc25d_core.eval.evaluate import EvalConfig, EvalExport
from gc25d_core.eval.report import TABLE_COLUMNS, write_reports
from gc25d_pipeline.defs.eval.assets import measured_markdown
from gc25d_pipeline.lib.previews import eval_metadata


def _result(label: str, step: int, scale: float) -> dict:
    sweeps = {}
    for sweep, cells in (("clip28", 28), ("chain241", 61)):
        regions = {"1_20": {}, "22_27": {}, "all": {}, "21_24": {}, "21_60": {}}
        for sw, region, key, _ in TABLE_COLUMNS:
            if sw == sweep:
                regions[region][key] = scale * (1 + len(region) + len(key)) / 100
        curves = {
            "latent_mse": [scale * (1 + c / 10) for c in range(cells)],
            "psnr": [30 - scale * c / 10 for c in range(cells)],
            "delta_psnr": [None, *(0.5 for _ in range(cells - 1))],
        }
        sweeps[sweep] = {"regions": regions, "curves": curves}
    return {"export": {"label": label, "step": step}, "sampler": {"kind": "causal"}, "sweeps": sweeps}


def test_the_eval_metadata_starts_with_the_table_and_the_main_plot(tmp_path):
    results = [_result("stage1_tf", 40, 1.0), _result("deploy", 12, 0.5)]
    files = write_reports(tmp_path, results)
    ecfg = EvalConfig(clip28_clips=4, chain241_chains=2, teacher_steps=40, seed=0)
    exports = [EvalExport(r["export"]["label"], tmp_path, None, "x", r["export"]["step"]) for r in results]
    measured = measured_markdown(1, ecfg, {"clip28": 4, "chain241": 2}, exports)
    md = eval_metadata(files, results, measured, ["stage1_tf", "deploy"], ["sft: no teacher.json"])

    assert list(md)[:4] == ["table", "plot", "measured", "report"]
    table = md["table"]
    assert isinstance(table, dg.TableMetadataValue)
    assert [c.name for c in table.schema.columns][:3] == ["export", "step", "sampler"]
    first = table.records[0].data
    assert first["export"] == "stage1_tf" and first["step"] == 40
    header = TABLE_COLUMNS[0][3]
    value = results[0]["sweeps"]["clip28"]["regions"]["1_20"]["latent_mse"]
    assert first[header] == float(f"{value:.4g}")

    plot = md["plot"].value
    main = base64.b64encode(files.plots["chain241_latent_mse.png"]).decode()
    assert plot.startswith("**chain241 latent mse per cell**") and main in plot

    # the UI draws a markdown entry inline only under 1000 characters
    assert len(md["measured"].value) < 1000 and "snapshot v000001" in md["measured"].value
    assert "deploy (step 12)" in md["measured"].value

    report = md["report"].value
    assert "| stage1_tf |" in report and "](clip28_psnr.png)" not in report
    for png in files.plots.values():
        assert base64.b64encode(png).decode() in report
    # one entry per plot no more: table, plot, measured, report, exports, not_evaluated, files
    assert len(md) <= 8 and not any(k.startswith("plot ") for k in md)


def test_a_stage_with_an_ema_is_evaluated_by_its_ema_alone_unless_raw_beside_ema(tmp_path, monkeypatch):
    """The eval asset's exports: a hand-off with an EMA export gives that one (the weights deploy
    takes) and says so; ``raw_beside_ema`` adds the raw one before it; one without an EMA is kept."""
    from types import SimpleNamespace

    from gc25d_pipeline.defs.eval import assets

    runs = tmp_path / "runs"
    cfg = SimpleNamespace(paths=SimpleNamespace(runs_root=runs))
    project = SimpleNamespace(config=lambda: cfg, run_dir=lambda c, folder, ctx: runs / folder / "v000001")
    sources = [s for s in assets.EVAL_SOURCES if s.label in ("stage1_tf", "stage2_cd")]
    monkeypatch.setattr(assets, "EVAL_SOURCES", tuple(sources))
    for s in sources:
        (runs / assets.run_folder_of(s.asset) / "v000001").mkdir(parents=True)
        (runs / assets.run_folder_of(s.asset) / "v000001" / s.file).write_text("{}")

    def handoff(label, path, runs_root):
        raw = EvalExport(label, runs / label / "raw.safetensors", "a" * 64, label, 4)
        ema = EvalExport(f"{label}_ema", runs / label / "ema.safetensors", "b" * 64, label, 4)
        return [raw, ema] if label == "stage2_cd" else [raw]

    monkeypatch.setattr(assets, "exports_of_handoff", handoff)
    alone, skipped = assets.available_exports(project, None)
    assert [e.label for e in alone] == ["stage1_tf", "stage2_cd_ema"]
    assert skipped == ["stage2_cd: its EMA export instead (raw_beside_ema: false)"]
    both, skipped = assets.available_exports(project, None, raw_beside_ema=True)
    assert [e.label for e in both] == ["stage1_tf", "stage2_cd", "stage2_cd_ema"] and skipped == []
    assert str(both[2].path) == "stage2_cd/ema.safetensors"  # named relative to the runs root
