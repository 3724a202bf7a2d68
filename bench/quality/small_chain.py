"""The `small` preset's whole chain on one GPU, without Dagster (issue 35): data → SFT → the §10
pick → stage 1 → stage 2 → stage 3 → deploy export → eval.

Each phase runs through the same core function or torchrun entry point its asset calls, into the run
folder its asset uses (``<runs_root>/<stage>/<snapshot>``), and resumes from it: a stage that ran
past a device call's limit goes on from its last state at the next call on the same warm machine
(``--through`` stops after a phase, so each call can hold one or two of them). The stage sections
come from ``configs/<stage>/small.yaml``; the hand-offs chain as the stage assets chain them
(``gc25d_core.stages``: ``init_from`` / ``real_from``).

Usage (GPU machine; one call per line, back to back on one warm machine):
    python -m bench.quality.small_chain --root /tmp/small --through sft --cpu-ranks 12
    python -m bench.quality.small_chain --root /tmp/small --through stage2_cd
    python -m bench.quality.small_chain --root /tmp/small --through stage3_dmd
    python -m bench.quality.small_chain --root /tmp/small --through fast_decoder   # deploy, fast decoder, levers' error
    python -m bench.quality.small_chain --root /tmp/small --through eval      # live2400 + the dataset sweeps
With ``--through eval`` the exports that exist before stage 3 are evaluated beside its training
(``EarlyEval``; ``--no-early-eval``: all after the deploy export).
Smoke (here, CPU): python -m bench.quality.small_chain --root /tmp/small_smoke --smoke
With a tiny VAE an earlier chain fitted (small_chain_gpu.sh brings it back): ``--vae FILE
--vae-sha256 HEX`` in place of the fit (≈ 200 s less on the GPU; the code world is seeded, so its
frames are the ones that VAE was fitted to).
Across device calls without a restart: bench/quality/small_chain_gpu.sh runs it in the background on
the warm machine and follows it (each call the same command, within the machine's idle window).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.quality import small_preset
from bench.quality.small_preset import launch, phase, start_launch

PHASES = ("sft", "stage1_tf", "stage2_cd", "stage3_dmd", "deploy", "fast_decoder", "eval")
TRAINED = PHASES[1 : PHASES.index("stage3_dmd") + 1]  # the stages trained after the SFT, in order
# issue 34: the fast decoder distilled from the preset's VAE on its latents (the fast_decoder asset's
# job), its record (held-out PSNR vs the VAE and vs the frames, ms a cell) printed; --smoke: a few steps
SMOKE_FAST_DECODER: dict[str, Any] = {"steps": 4, "batch": 2, "max_clips": 2}
# the deploy levers whose error on the trained student is measured (CPU smoke: no FP8 there)
LEVER_CHECKS = {"fast": "--decoder fast", "fp8": "--fp8"}
SMOKE_LEVER_CHECKS = ("fast",)
LEVER_CELLS = 240
# --smoke: a few steps of each stage on CPU (fp32, one rank), enough to pass every hand-off
SMOKE_STAGE: dict[str, Any] = {
    "precision": "fp32",
    "micro_batch": 1,
    "max_steps": 2,
    "export_every": 2,
    "state_every": 2,
    "val": {"every": 2, "num_clips": 1},
    "data": {"num_workers": 0},
}
SMOKE_STAGE3: dict[str, Any] = {"critic_steps": 1, "max_cells": 22}
# the eval: the dataset sweeps as the asset runs them and the ten-minute live session (issue 35)
EVAL: dict[str, Any] = {"live_sweeps": ["live2400"]}
# the picture's scripted walk (16 cells) played this many times in turn: 64 cells, 16 s
PICTURE_REPEAT = 4
SMOKE_EVAL: dict[str, Any] = {
    "live_sweeps": ["live240"],
    "live_cells": 8,
    "clip28_clips": 1,
    "chain241_chains": 0,
}


def lever_checks(chosen: str | None, smoke: bool, fitted: bool = True) -> list[str]:
    """The CLI flags of the lever checks ``chosen`` names (comma-separated keys of LEVER_CHECKS;
    "" none). Default: all of them (the smoke's on a CPU), the fast decoder's only where this run
    fitted it (``fitted``)."""
    if chosen is None:
        names = [n for n in (SMOKE_LEVER_CHECKS if smoke else LEVER_CHECKS) if fitted or n != "fast"]
    else:
        names = [n for n in chosen.split(",") if n]
    unknown = sorted(set(names) - set(LEVER_CHECKS))
    if unknown:
        raise SystemExit(f"--levers: {unknown} are not among {sorted(LEVER_CHECKS)}")
    return [LEVER_CHECKS[n] for n in names]


def stage_sets(items: list[str]) -> dict[str, dict[str, Any]]:
    """``--set STAGE.FIELD=VALUE`` items -> stage -> its section's fields, nested (the config's own
    override parsing: dotted keys, YAML values). Refused before any work, naming the item or the
    field: a stage not trained here, an item without a field or a value, a field its small preset's
    section does not take."""
    from pydantic import ValidationError

    from gc25d_core.config import deep_merge, parse_overrides
    from gc25d_core.schema import ConfigError, format_validation_error
    from gc25d_core.train.presets import STAGES, stage_section

    for item in items:
        stage, _, field = item.partition("=")[0].partition(".")
        if not field or stage not in TRAINED:
            raise SystemExit(f"--set {item!r}: expected STAGE.FIELD=VALUE with STAGE one of {list(TRAINED)}")
    try:
        out: dict[str, dict[str, Any]] = parse_overrides(items)
    except ConfigError as e:
        raise SystemExit(f"--set: {e}") from None
    for stage, fields in out.items():
        try:
            STAGES[stage].model_validate(deep_merge(stage_section(stage, "small"), fields))
        except ValidationError as e:
            raise SystemExit(format_validation_error(e, f"--set {stage}")) from None
    return out


def stage_variants(items: list[str], stage: str) -> dict[str, dict[str, dict[str, Any]]]:
    """``--variant NAME:FIELD=VALUE[,FIELD=VALUE]`` items -> name -> {stage: fields} (as
    ``stage_sets`` gives them), each checked as ``--set`` is; a name is a plain word."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for item in items:
        name, colon, body = item.partition(":")
        # ASCII only: the name becomes a folder (runs/<stage>-NAME) and a label in the eval's reports
        if not colon or not body or not re.fullmatch(r"[A-Za-z0-9_]+", name) or name in out:
            raise SystemExit(f"--variant {item!r}: expected NAME:FIELD=VALUE[,FIELD=VALUE], a new plain NAME")
        out[name] = stage_sets([f"{stage}.{field}" for field in body.split(",")])
    return out


def _stage_section(
    name: str, smoke: bool, steps: dict[str, int], sets: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    sec: dict[str, Any] = dict(SMOKE_STAGE) if smoke else {}
    if smoke and name == "stage3_dmd":
        sec |= SMOKE_STAGE3
    if name in steps:
        sec["max_steps"] = steps[name]
    from gc25d_core.config import deep_merge

    return deep_merge(sec, (sets or {}).get(name, {}))


def _handoff_model(path: Path, export: str) -> dict[str, Any]:
    return {"init": "handoff", "handoff": str(path), "handoff_export": export}


def pick_teacher(cfg: Any, sft_run: Path, smoke: bool) -> Path:
    """The §10 pick over the SFT run folder, written as its teacher.json (what the sft_teacher asset
    writes); the small preset's short run takes ``pick.min_step`` from its preset."""
    from gc25d_core.handoff import TEACHER, handoff_of, write_handoff_file
    from gc25d_core.train.pick import pick_sft_run

    min_step = 0 if smoke else cfg.sft.pick.min_step
    pick = pick_sft_run(sft_run, min_step=min_step, rel_tol=cfg.sft.pick.rel_tol)
    assert pick.path is not None
    write_handoff_file(
        sft_run / TEACHER, handoff_of("sft", pick.step, pick.path, runs_root=cfg.paths.runs_root)
    )
    return sft_run / TEACHER


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="data and runs go under it")
    ap.add_argument("--through", choices=PHASES, default="eval", help="stop after this phase")
    ap.add_argument("--cpu-ranks", type=int, default=8, help="ranks of the CPU data jobs")
    ap.add_argument("--sft-steps", type=int, default=None, help="default: configs/sft/small.yaml")
    ap.add_argument(
        "--steps", action="append", default=[], metavar="STAGE=N", help="a stage's max_steps (repeatable)"
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="STAGE.FIELD=VALUE",
        help="a field of a stage's section over its small preset (dotted, a YAML value; repeatable), "
        "e.g. stage3_dmd.real_guidance=2; the config check names a field that does not exist",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:FIELD=VALUE[,FIELD=VALUE]",
        help="train the last stage again from the same hand-offs with these fields of its section "
        "(over --set) into runs/<stage>-NAME/, and evaluate its exports beside the chain's "
        "(labels <stage>-NAME, <stage>-NAME_ema); repeatable, e.g. g2:real_guidance=2",
    )
    ap.add_argument(
        "--eval",
        default=None,
        help="JSON: fields of the eval's EvalConfig (default: live2400, or a short live240 with --smoke)",
    )
    ap.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=("fast_decoder", "pictures"),
        help="leave a phase out (fast_decoder: its fit, the lever checks then default to FP8's; "
        "pictures: the scripted walk's frames before the eval) and go on",
    )
    ap.add_argument(
        "--levers",
        default=None,
        help=f"the lever checks after the fast decoder, comma-separated of {sorted(LEVER_CHECKS)} "
        "(default all; '' none)",
    )
    ap.add_argument(
        "--eval-labels",
        default=None,
        help="comma-separated export labels to evaluate (e.g. sft,stage2_cd_ema,stage3_dmd_ema; default: all)",
    )
    ap.add_argument(
        "--no-early-eval",
        action="store_true",
        help="evaluate every export after the deploy export (default: the exports before the last "
        "stage are evaluated beside its training)",
    )
    small_preset.add_vae_options(ap)
    ap.add_argument("--smoke", action="store_true", help="CPU, a 2-layer model, a few steps: the plumbing")
    args = ap.parse_args(argv)
    steps = {k: int(v) for k, _, v in (s.partition("=") for s in args.steps)}
    sets = stage_sets(args.set)
    trained = [s for s in TRAINED if PHASES.index(s) <= PHASES.index(args.through)]
    if args.variant and not trained:
        raise SystemExit(f"--variant: --through {args.through} trains no stage after the SFT")
    variants = stage_variants(args.variant, trained[-1]) if args.variant else {}

    from gc25d_core.config import deep_merge
    from gc25d_core.eval.live import default_live_ceiling
    from gc25d_core.eval.spec import EvalConfig
    from gc25d_core.handoff import read_handoff
    from gc25d_core.stages import STAGES
    from gc25d_core.train.presets import with_stage
    from gc25d_core.train.previews import learning_signal_report

    data_argv = ["--root", str(args.root), "--cpu-ranks", str(args.cpu_ranks)]
    data_argv += ["--smoke"] if args.smoke else []
    data_argv += [] if args.sft_steps is None else ["--sft-steps", str(args.sft_steps)]
    data_argv += [] if args.vae is None else ["--vae", str(args.vae)]
    data_argv += [] if args.vae_sha256 is None else ["--vae-sha256", args.vae_sha256]
    data_argv += [] if args.vae_width is None else ["--vae-width", args.vae_width]
    cfg, sft_run, version = small_preset.main(data_argv)
    stop = PHASES.index(args.through)
    if stop == 0:
        return
    runs_root = Path(cfg.paths.runs_root)
    snapshot = sft_run.name
    handoffs: dict[str, Path] = {"sft": pick_teacher(cfg, sft_run, args.smoke)}
    print(json.dumps({"phase": "pick", "teacher": str(handoffs["sft"])}), flush=True)

    chosen = (SMOKE_EVAL if args.smoke else EVAL) if args.eval is None else json.loads(args.eval)
    ecfg = EvalConfig(
        **{"teacher_window": cfg.timeline.num_cells, "live_ceiling": default_live_ceiling(cfg), **chosen}
    )
    wanted = None if args.eval_labels is None else args.eval_labels.split(",")
    early: EarlyEval | None = None

    def train(stage: Any, run_dir: Path, stage_sets_: dict[str, dict[str, Any]]) -> Path:
        """One stage's run from the hand-offs so far; its hand-off file."""
        sec = _stage_section(stage.name, args.smoke, steps, stage_sets_)
        sec["data"] = {**sec.get("data", {}), "manifest_version": version}
        for field, up in (("model", stage.init_from), ("real", stage.real_from)):
            if up is not None:
                sec[field] = _handoff_model(handoffs[up.stage], up.export)
        scfg = with_stage(cfg, stage.name, "small", sec)
        t0 = time.perf_counter()
        launch(
            "gc25d_core.jobs.train", scfg, run_dir, cfg.distributed.nproc_per_node, ["--stage", stage.name]
        )
        phase(run_dir.parent.name, t0, run_dir=str(run_dir))
        print(learning_signal_report(run_dir) or f"{run_dir}: no validation records", flush=True)
        return run_dir / stage.handoff

    for stage in STAGES[1:]:
        if stage.name not in trained:
            break
        if stage is STAGES[-1] and stop >= PHASES.index("eval") and not args.no_early_eval:
            early = EarlyEval.start(
                cfg,
                runs_root / "eval" / f"{snapshot}-early",
                version,
                ecfg,
                evaluated_exports(handoffs, runs_root, wanted),
            )
        handoffs[stage.name] = train(stage, runs_root / stage.name / snapshot, sets)
    last_stage = next(s for s in STAGES if s.name == trained[-1])
    for name, fields in variants.items():
        merged = {**sets, last_stage.name: deep_merge(sets.get(last_stage.name, {}), fields[last_stage.name])}
        handoffs[f"{last_stage.name}-{name}"] = train(
            last_stage, runs_root / f"{last_stage.name}-{name}" / snapshot, merged
        )
    if stop < PHASES.index("deploy"):
        return

    # the deploy file of the last stage that feeds deploy, its EMA export where it has one
    last = next(s for s in reversed(STAGES) if s.feeds_deploy)
    h = read_handoff(handoffs[last.name], runs_root)
    source, sha = (h.ema_export, h.ema_sha256) if h.ema_export is not None else (h.export, h.sha256)
    deploy_run = runs_root / "deploy_export" / snapshot
    t0 = time.perf_counter()
    launch(
        "gc25d_core.jobs.deploy_export",
        cfg,
        deploy_run,
        1,
        ["--source", str(source), "--sha256", str(sha), "--out", str(deploy_run / "deploy.safetensors")]
        + ["--summary", str(deploy_run / "deploy.json"), "--label", f"{last.name} step {h.step}"],
    )
    phase("deploy", t0, run_dir=str(deploy_run))
    if stop < PHASES.index("fast_decoder"):
        return

    fitted = "fast_decoder" not in args.skip
    if fitted:
        from gc25d_core.models.fast_decoder import record_file

        fd = {"enabled": True, **(SMOKE_FAST_DECODER if args.smoke else {})}
        fcfg = cfg.model_copy(update={"fast_decoder": cfg.fast_decoder.model_copy(update=fd)})
        t0 = time.perf_counter()
        launch("gc25d_core.jobs.fast_decoder", fcfg, runs_root / "fast_decoder" / "default", 1)
        record = json.loads(record_file(fcfg).read_text())
        phase("fast_decoder", t0, record={k: v for k, v in record.items() if not isinstance(v, (dict, list))})
    # issue 34: FP8's and the fast decoder's error on this trained student, each beside the CLI's
    # default path through the session the CLI opens (bench.quality.lever_error prints its record)
    from bench.quality import lever_error

    preset = (runs_root / "fast_decoder" / "default" if fitted else deploy_run) / "config.yaml"
    for against in lever_checks(args.levers, args.smoke, fitted):
        t0 = time.perf_counter()
        # the reference decodes with the VAE in bf16 (the CLI's auto may pick the fast decoder or
        # FP8 on CUDA); the flags of the path against it come after and win
        argv = ["--preset", str(preset), "--export", str(deploy_run / "deploy.safetensors")]
        argv += ["--decoder", "vae", "--no-fp8", f"--against={against}"]
        lever_error.main([*argv, "--cells", str(8 if args.smoke else LEVER_CELLS)])
        phase("lever_error", t0, against=against)
    if stop < PHASES.index("eval"):
        return

    from gc25d_core.eval.spec import INPUT_FILE, EvalInput, exports_of_handoff, write_model

    exports = evaluated_exports(handoffs, runs_root, None)
    exports += exports_of_handoff("deploy", deploy_run / "final.json", runs_root)
    if wanted is not None:
        unknown = sorted(set(wanted) - {e.label for e in exports})
        if unknown:
            raise SystemExit(f"--eval-labels: {unknown} are not among {[e.label for e in exports]}")
        exports = [e for e in exports if e.label in wanted]
    # the pictures first: a minute on the GPU, and what a device call that ends in the eval keeps
    if "pictures" not in args.skip:
        keep_pictures(args.root, cfg, deploy_run / "config.yaml", [e for e in exports if e.stage != "sft"])
    if early is not None:
        early.wait()
    eval_run = runs_root / "eval" / snapshot
    eval_run.mkdir(parents=True, exist_ok=True)
    write_model(eval_run, INPUT_FILE, EvalInput(manifest_version=version, eval=ecfg, exports=exports))
    t0 = time.perf_counter()
    launch("gc25d_core.jobs.eval", cfg, eval_run, cfg.distributed.nproc_per_node)
    phase("eval", t0, run_dir=str(eval_run))
    for report in sorted(eval_run.glob("*.md")):
        print(report.read_text(), flush=True)


def evaluated_exports(handoffs: dict[str, Path], runs_root: Path, wanted: list[str] | None) -> list[Any]:
    """The eval's exports of the stages handed off so far (``wanted``: these labels only)."""
    from gc25d_core.eval.spec import exports_of_handoff
    from gc25d_core.stages import STAGES

    stages = [s.name for s in STAGES if s.evaluated]
    # a variant (<stage>-NAME) right after its stage
    order = [k for name in stages for k in handoffs if k == name or k.startswith(f"{name}-")]
    exports = [e for k in order for e in exports_of_handoff(k, handoffs[k], runs_root)]
    return [e for e in exports if wanted is None or e.label in wanted]


class EarlyEval:
    """The eval of the exports that exist before the last stage trains, beside that stage and the
    deploy export (the GPU has room for both; each is host-bound at this size): it stores its rows
    under their keys (export SHA256, sweep, eval code), so the final eval keeps them and computes
    the last stage's alone. Should it fail, the final eval computes its rows."""

    def __init__(self, proc: subprocess.Popen[bytes], run_dir: Path, t0: float):
        self.proc, self.run_dir, self.t0 = proc, run_dir, t0

    @classmethod
    def start(cls, cfg: Any, run_dir: Path, version: int, ecfg: Any, exports: list[Any]) -> EarlyEval | None:
        from gc25d_core.eval.spec import INPUT_FILE, EvalInput, write_model

        if not exports:
            return None
        run_dir.mkdir(parents=True, exist_ok=True)
        write_model(run_dir, INPUT_FILE, EvalInput(manifest_version=version, eval=ecfg, exports=exports))
        t0 = time.perf_counter()
        proc = start_launch("gc25d_core.jobs.eval", cfg, run_dir, cfg.distributed.nproc_per_node)
        print(
            json.dumps(
                {"phase": "early_eval", "started": [e.label for e in exports], "run_dir": str(run_dir)}
            ),
            flush=True,
        )
        return cls(proc, run_dir, t0)

    def wait(self) -> None:
        rc = self.proc.wait()
        phase("early_eval", self.t0, rc=rc, run_dir=str(self.run_dir))
        if rc != 0:
            log = self.run_dir / "torchrun.log"
            print(log.read_text()[-4000:], file=sys.stderr)
            print(
                f"the early eval failed (rc {rc}, log {log}): the final eval computes its rows",
                file=sys.stderr,
            )


def keep_pictures(root: Path, cfg: Any, preset: Path, exports: list[Any]) -> None:
    """What a player of each causal export sees (issue 35's picture): the scripted walk of
    bench.quality.picture_sheet played through the deploy session, its frames kept beside the truth
    and the ids in ``<root>/pictures/<label>.npz`` for the ids probe to read on any machine
    (picture_sheet ``--frames-in``; the probe's fit on this code world is CPU minutes)."""
    import torch

    from bench.quality import picture_sheet

    for e in exports:
        t0 = time.perf_counter()
        picture_sheet.main(
            ["--raw", str(cfg.raw.root), "--work", str(cfg.paths.data_root), "--preset", str(preset)]
            + [
                "--export",
                str(e.path),
                "--data-root",
                str(cfg.paths.data_root),
                "--repeat",
                str(PICTURE_REPEAT),
            ]
            + ["--device", "cuda" if torch.cuda.is_available() else "cpu"]
            + ["--frames-out", str(root / "pictures" / f"{e.label}.npz")]
        )
        phase("picture", t0, label=e.label)


if __name__ == "__main__":
    main()
