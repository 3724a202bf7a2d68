"""``python -m gc25d_core.deploy``: play a scripted action sequence to an MP4, or serve the web page.

    python -m gc25d_core.deploy play --actions 'fwd*8,run_right*4,light*2' --out outputs/play.mp4
    python -m gc25d_core.deploy play --clip-actions RUN/actions_block_0.25s.npy --start 96 --cells 20
    python -m gc25d_core.deploy serve --port 8765          # http://127.0.0.1:8765 (make play)

``--export`` defaults to the newest causal export under the preset's runs root (``locate``). The
MP4 shows RGB | colour-coded ids side by side; ``<out>.json`` holds the per-cell timings.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Literal

import numpy as np

from gc25d_core.deploy.runtime import RuntimeOptions
from gc25d_core.deploy.world import WorldConfig


def add_session_options(p: argparse.ArgumentParser) -> None:
    """The options that open a live session (play, serve, and the benches that open one the same way)."""
    p.add_argument("--preset", default="tiny", help="configs/<preset>.yaml (default: the embedded tiny one)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    p.add_argument("--export", type=Path, default=None, help="a causal export (default: the newest)")
    p.add_argument("--sha256", default=None, help="the export's expected SHA256")
    p.add_argument("--anchor", type=Path, default=None, help="anchor image (default: the world's frame 0)")
    p.add_argument("--device", default=None, help="cpu | cuda (default: the preset's, if available)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scene", default=WorldConfig().scene)
    p.add_argument("--world-seed", type=int, default=0)
    p.add_argument("--fold-commit", action="store_true", help="fold each commit into the next forward")
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile the block bodies (their KV attention eager) and the key rotation (GPU; "
        "latents within bf16 rounding of the exact path, not bit-identical; default on CUDA)",
    )
    p.add_argument(
        "--exact",
        action="store_true",
        help="the exact eager path (the oracle) instead of the fast path that is the default on CUDA",
    )
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="static KV buffers + CUDA graphs of every cell's forwards (GPU; same latents; default on CUDA)",
    )
    p.add_argument(
        "--fast-decode",
        action="store_true",
        help="bf16 lean channels-last VAE decode (GPU; frames within a few uint8 steps of fp32; default on CUDA)",
    )
    p.add_argument(
        "--decode-graph",
        action="store_true",
        help="replay a CUDA graph of each cell's decode from cell 3 (GPU; the eager decode's frames; "
        "default on CUDA without --decode-stream)",
    )
    p.add_argument(
        "--decoder",
        choices=("auto", "vae", "fast"),
        default="auto",
        help="auto (default): fast on CUDA where the fast_decoder asset's fit is within 1.5 dB of the "
        "VAE decoder's PSNR vs the frames on held-out clips, else vae; fast: the fast_decoder "
        "asset's small decoder (models.fast_decoder). Where its file is there, serve's page "
        "switches between the two",
    )
    p.add_argument(
        "--fp8",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="FP8 GEMMs for the DiT blocks' linear layers (torchao, sm89+ GPU; models.fp8). Default on "
        "CUDA: on where the GPU and torchao allow it and the DiT is 5B-wide (dim >= 3072), where it "
        "measured faster than bf16 within its error bound; --no-fp8 keeps bf16",
    )
    p.add_argument(
        "--fp8-skip",
        action="append",
        default=[],
        metavar="PATTERN",
        help="with --fp8: keep the linear layers matching this fnmatch pattern in bf16 (e.g. 'blocks.0.*')",
    )
    p.add_argument(
        "--kv-attention",
        choices=("auto", "sdpa", "fa4"),
        default=None,
        help="the attention of each cell over the KV cache: PyTorch SDPA, or fa4: FlashAttention-4 "
        "(the optional flash-attn-4 package, sm90+ GPU; models.fa4; needs the static cache: CUDA's "
        "default path or --cuda-graphs, not --exact). Default on CUDA: auto, fa4 where it is "
        "installed and the DiT is 5B-wide (dim >= 3072), where it measured faster; else sdpa",
    )
    p.add_argument(
        "--decode-stream",
        action="store_true",
        help="decode on a second CUDA stream while the next cell denoises (frames one cell later; "
        "serve: the page's switch starts in this state)",
    )
    p.add_argument(
        "--defer-commit",
        action="store_true",
        help="run each cell's commit after its decode, not waited for (the same latents, the frames "
        "one commit sooner; default on CUDA)",
    )
    p.add_argument(
        "--commit-stream",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with the deferred commit on CUDA: run the commit on a second CUDA stream beside the "
        "decode (the same latents; default on CUDA without --decode-stream)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gc25d_core.deploy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    play = sub.add_parser("play", help="scripted actions -> MP4 of RGB | ids")
    add_session_options(play)
    src = play.add_mutually_exclusive_group()
    src.add_argument("--actions", default="fwd*6,run_right*4,light*2,left*4,idle*4", help="action script")
    src.add_argument("--clip-actions", type=Path, default=None, help="actions_block_0.25s.npy of a run")
    play.add_argument("--start", type=int, default=0, help="clip start frame (with --clip-actions)")
    play.add_argument("--cells", type=int, default=None, help="at most this many cells")
    play.add_argument("--out", type=Path, default=Path("outputs/play.mp4"))
    serve = sub.add_parser("serve", help="the local web page")
    add_session_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests addressed to NAME (a host name, an IP, *.domain or *); by default "
        "only the served address (and localhost's names on a loopback bind)",
    )
    serve.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="URL",
        help="also accept the WebSocket from pages of URL (scheme://host[:port], or *); by default "
        "only pages served here",
    )
    return p


def _config(args: argparse.Namespace):
    from gc25d_core.config import load_config

    return load_config(args.preset, args.set)


def session_device(device: str | None, preset_device: str) -> str:
    """``--device``, else the preset's where it is available (what open_session would pick)."""
    if device:
        return device
    import torch

    return "cuda" if preset_device == "cuda" and torch.cuda.is_available() else "cpu"


def runtime_options(args: argparse.Namespace, cuda: bool) -> RuntimeOptions:
    """The session's options: on CUDA the fast path (CUDA graphs of every cell over compiled block
    bodies + the lean bf16 decode + its CUDA graph + the commit deferred past the decode and run on a
    second stream beside it, bench/speed/deploy.py's lever graphs_all_cstream_compile: the whole-loop
    figures; latents within bf16 rounding of the exact path, ``--no-compile`` gives them bit for bit)
    unless ``--exact``; on a CPU the exact path (the levers are GPU ones).
    The side-stream decode runs without the decode graph unless ``--decode-graph`` asks for it
    (the pair is not measured)."""
    if args.fp8_skip and (args.fp8 is False or (args.fp8 is None and not cuda)):
        raise ValueError("--fp8-skip needs FP8 (--fp8, or the default on CUDA)")
    if args.exact and args.fp8:
        raise ValueError("--exact contradicts --fp8 (the exact path is bf16)")
    if args.exact and (
        args.cuda_graphs or args.fast_decode or args.decode_stream or args.decode_graph or args.defer_commit
    ):
        raise ValueError(
            "--exact contradicts --cuda-graphs / --fast-decode / --decode-graph / --decode-stream / "
            "--defer-commit"
        )
    if args.kv_attention == "fa4" and args.exact:
        raise ValueError("--kv-attention fa4 contradicts --exact (the exact path keeps SDPA)")
    if args.fold_commit and args.defer_commit:
        raise ValueError("--fold-commit contradicts --defer-commit (the commit goes one way)")
    if args.exact and args.compile:
        raise ValueError("--exact contradicts --compile (the compiled blocks round differently)")
    if args.commit_stream and (args.exact or args.fold_commit):
        raise ValueError("--commit-stream needs the deferred commit (not --exact or --fold-commit)")
    fast = cuda and not args.exact
    decode_fast = args.fast_decode or fast
    defer = args.defer_commit or (fast and not args.fold_commit)
    # beside the side-stream decode the commit's stream is not measured: off there unless asked for
    beside = (
        args.commit_stream if args.commit_stream is not None else fast and defer and not args.decode_stream
    )
    compiled = args.compile if args.compile is not None else fast
    fp8: bool | Literal["auto"] = args.fp8 if args.fp8 is not None else ("auto" if fast else False)
    kv: Literal["sdpa", "fa4", "auto"] = args.kv_attention or ("auto" if fast else "sdpa")
    return RuntimeOptions(
        seed=args.seed,
        fold_commit=args.fold_commit,
        defer_commit=defer or bool(args.commit_stream),
        commit_stream=beside,
        compile=compiled,
        rotate_compile=compiled and cuda,
        rope_compile=compiled and cuda,
        cuda_graphs=args.cuda_graphs or fast,
        decode_dtype="bf16" if decode_fast else "fp32",
        decode_fast=decode_fast,
        decode_stream=args.decode_stream,
        decode_graph=args.decode_graph or (fast and not args.decode_stream),
        decoder=args.decoder,
        fp8=fp8,
        fp8_skip=tuple(args.fp8_skip),
        kv_attention=kv,
    )


def open_from_args(args: argparse.Namespace):
    from gc25d_core.deploy.locate import newest_causal_export
    from gc25d_core.deploy.session import open_session

    cfg = _config(args)
    export, sha, source = args.export, args.sha256, "--export"
    if export is None:
        found = newest_causal_export(cfg.paths.runs_root)
        export, sha, source = found.path, found.sha256, found.source
    device = session_device(args.device, cfg.device)
    opts = runtime_options(args, cuda=device == "cuda")
    world = WorldConfig(scene=args.scene, seed=args.world_seed)
    session = open_session(
        export,
        cfg,
        world=world,
        options=opts,
        anchor_image=args.anchor,
        device=device,
        expected_sha256=sha,
    )
    return session, cfg, f"{export} [{source}], {session.runtime.fp8_choice}, {session.runtime.kv_choice}"


def script_blocks(args: argparse.Namespace) -> list[np.ndarray]:
    from gc25d_core.deploy.actions import parse_script

    if args.clip_actions is not None:
        from gc25d_core.timeline import block_offset

        actions = np.load(args.clip_actions, allow_pickle=False)
        if actions.ndim != 2 or actions.shape[1] != 5:
            raise ValueError(f"{args.clip_actions}: actions must be [N, 5], got {list(actions.shape)}")
        blocks = list(actions[block_offset(args.start) :].astype(np.uint8))
    else:
        blocks = parse_script(args.actions)
    return blocks[: args.cells] if args.cells else blocks


def play(args: argparse.Namespace) -> dict[str, Any]:
    from tqdm import tqdm

    from gc25d_core.atomic import atomic_write_text
    from gc25d_core.preview import colorize_ids, side_by_side, write_video

    blocks = script_blocks(args)  # a bad script fails before anything loads
    session, cfg, what = open_from_args(args)
    print(f"deploy play: {what}, {len(blocks)} cells", file=sys.stderr)
    # A rendered video can afford a device sync per forward, so its forwards are timed one by one
    # and the commit (the t = 0 forward that writes the cell into the cache) is measured apart from
    # the denoise steps; the live page (serve) syncs once per cell and shows them as one figure.
    # A folded commit (--fold-commit) runs inside the next cell's first forward: it has no time of
    # its own, and is written as null, its time counted in the next cell's denoise.
    session.runtime.timing = True
    rgb = list(session.start())
    ids = [session.ids0]
    cells = []
    bar = tqdm(blocks, desc="cells", unit="cell", file=sys.stderr)
    for block in bar:
        s = session.step(block)
        rgb += s.out.frames
        ids.append(s.ids)
        t = s.out.times
        timed: dict[str, float | None] = {**t.as_dict()}
        if args.fold_commit:
            timed["commit"] = None
        cells.append({"cell": s.cell, "key": s.key, "block": s.block.tolist(), **timed})
        bar.set_postfix(
            denoise=f"{t.denoise + t.commit:.3f}s", decode=f"{t.decode:.3f}s", total=f"{t.total:.3f}s"
        )
    rgb += session.runtime.flush()
    frames, id_frames = np.concatenate(rgb), np.concatenate(ids)
    scale = 2 if frames.shape[2] < 400 else 1
    video = side_by_side([frames, colorize_ids(id_frames)], ["rgb", "ids"], scale=scale)
    path = write_video(args.out, video, fps=16.0)
    commit = (
        "folded into the next cell's first forward (in its denoise)" if args.fold_commit else "timed apart"
    )
    summary = {
        "video": str(path),
        "export": what,
        "frames": int(len(frames)),
        "timing": f"per forward, device-synchronised; commit {commit}",
        "cells": cells,
    }
    atomic_write_text(Path(str(path) + ".json"), json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "cells"}))
    return summary


def serve_app(args: argparse.Namespace, session: Any):
    """The web app of ``serve``'s arguments around ``session``."""
    from gc25d_core.deploy.web import create_app

    return create_app(
        session,
        host=args.host,
        port=args.port,
        allow_hosts=args.allow_host,
        allow_origins=args.allow_origin,
    )


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from gc25d_core.deploy.web import allowed_hosts, allowed_origins, server_config

    # a bad --allow-* fails before the model loads
    allowed_origins(allowed_hosts(args.host, args.allow_host), args.port, args.allow_origin)
    session, _, what = open_from_args(args)
    app = serve_app(args, session)
    print(f"deploy serve: {what} on http://{args.host}:{args.port}", file=sys.stderr)
    uvicorn.Server(server_config(app, args.host, args.port)).run()


def main(argv: list[str] | None = None) -> int:
    from gc25d_core.deploy.locate import NoExportError
    from gc25d_core.models.export import ExportError
    from gc25d_core.models.loading import WeightsError
    from gc25d_core.numerics import resolve_vml_dispatch
    from gc25d_core.schema import ConfigError

    args = build_parser().parse_args(argv)
    resolve_vml_dispatch()  # before the session runs MKL's vector maths on several threads
    try:
        if args.cmd == "play":
            play(args)
        else:
            serve(args)
    except (NoExportError, ExportError, WeightsError, ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
