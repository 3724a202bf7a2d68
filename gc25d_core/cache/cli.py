"""Command line for the training cache. Progress and logs are JSON lines on stdout (rank-0
reporter, with tqdm bars on stderr when it is a terminal; Dagster Pipes when launched by Dagster);
the last line is ``{"event": "result", ...}``.

    python -m gc25d_core.cache inspect STORE [--version N] [--versions] [--shard PATH]
    python -m gc25d_core.cache verify  STORE [--version N] [--deep] [--shard PATH ...]
    python -m gc25d_core.cache publish STORE [--receipt PATH ...] [--exclude ID ...] [--split-method ...]
    python -m gc25d_core.cache import  SRC DST --worker W --schema S --source-repo NAME
                                       [--version N | --listing FILE] [--deep]
    python -m gc25d_core.cache serve   STORE [--port P]      (loopback range server, read-only)

STORE: a directory (local store), ``hf://datasets/<owner>/<name>``, or an http(s) URL (with
``{revision}``/``{path}`` placeholders, or a loopback-server base URL).
Exit status: 0 ok, 1 verification failure or rejected receipts, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from gc25d_core.cache.errors import CacheError
from gc25d_core.cache.manifest import SCHEMAS, SplitRule, snapshot_id
from gc25d_core.cache.publish import (
    entries_from_listing,
    entries_from_manifest,
    import_shards,
    publish_snapshot,
    verify_snapshot,
)
from gc25d_core.cache.snapshots import list_versions, read_snapshot
from gc25d_core.cache.stores import Store, open_store
from gc25d_core.report import open_reporter


def _store(spec: str, args: argparse.Namespace) -> Store:
    token = os.environ.get(args.token_env) if getattr(args, "token_env", None) else None
    return open_store(spec, head_url=getattr(args, "head_url", None), token=token)


def _result(payload: dict[str, Any]) -> None:
    print(json.dumps({"event": "result", **payload}, default=str), flush=True)


def cmd_inspect(args: argparse.Namespace) -> int:
    store = _store(args.store, args)
    if args.versions:
        _result({"versions": list_versions(store, args.revision)})
        return 0
    snap = read_snapshot(store, args.version, revision=args.revision)
    m = snap.manifest
    if args.shard:
        sh = next((s for s in m.shards if s.path == args.shard), None)
        if sh is None:
            print(f"{args.shard} is not listed in {snap.snapshot_id}", file=sys.stderr)
            return 1
        _result({"snapshot": snap.snapshot_id, "shard": sh.model_dump(mode="json")})
        return 0
    workers: dict[str, int] = {}
    for sh in m.shards:
        workers[sh.worker] = workers.get(sh.worker, 0) + 1
    _result(
        {
            "snapshot": snap.snapshot_id,
            "ref": snap.ref.model_dump(),
            "schema": m.schema_name,
            "dims": m.dims,
            "created_at": m.created_at,
            "parent_version": m.parent_version,
            "totals": m.totals.model_dump(),
            "split_rule": m.split_rule.model_dump(),
            "num_excluded_ids": len(m.exclude_sample_ids),
            "shards_per_worker": workers,
            "sources": [s.model_dump() for s in m.sources],
            "provenance": m.provenance.model_dump(),
        }
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    store = _store(args.store, args)
    with open_reporter(bars=True) as rep:
        t0 = time.monotonic()
        r = verify_snapshot(
            store,
            args.version,
            revision=args.revision,
            deep=args.deep,
            shards=args.shard or None,
            reporter=rep,
        )
        dt = time.monotonic() - t0
    _result(
        {
            "snapshot": snapshot_id(r.version),
            "commit": r.commit,
            "ok": r.ok,
            "shards_ok": r.shards,
            "samples_ok": r.samples,
            "bytes_ok": r.bytes,
            "mb_per_s": r.bytes / dt / 1e6 if dt > 0 else None,
            "failures": r.failures,
        }
    )
    return 0 if r.ok else 1


def cmd_publish(args: argparse.Namespace) -> int:
    store = _store(args.store, args)
    rule = None
    if args.split_method:
        rule = SplitRule(
            method=args.split_method,
            val_fraction=args.val_fraction,
            salt=args.salt,
            val_groups=tuple(args.val_group),
        )
    with open_reporter(bars=True) as rep:
        res = publish_snapshot(
            store,
            receipts=args.receipt or None,
            schema_name=args.schema,
            split_rule=rule,
            exclude_add=args.exclude,
            exclude_remove=args.unexclude,
            deep_verify=not args.no_deep,
            reporter=rep,
        )
    _result(
        {
            "snapshot": res.snapshot_id,
            "ref": res.ref.model_dump() if res.ref else None,
            "noop": res.noop,
            "added_shards": res.added_shards,
            "added_samples": res.added_samples,
            "rejected": res.rejected,
            "attempts": res.attempts,
            "landed_after_error": res.landed_after_error,
        }
    )
    return 1 if res.rejected else 0


def cmd_import(args: argparse.Namespace) -> int:
    src, dst = _store(args.src, args), _store(args.dst, args)
    if args.listing:
        with open(args.listing, "rb") as f:
            entries = entries_from_listing(f.read())
    else:
        entries = entries_from_manifest(read_snapshot(src, args.version, revision=args.revision).manifest)
    if args.shard:
        entries = [e for e in entries if e.path in set(args.shard)]
    with open_reporter(bars=True) as rep:
        done = import_shards(
            src,
            entries,
            dst,
            worker=args.worker,
            schema_name=args.schema,
            source_repo=args.source_repo,
            deep=args.deep,
            reporter=rep,
        )
    _result(
        {
            "imported": [d.shard_path for d in done if d.created],
            "already_present": [d.shard_path for d in done if not d.created],
            "bytes": sum(d.receipt.size for d in done),
        }
    )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from gc25d_core.cache.httpserve import RangeServer
    from gc25d_core.cache.stores import LocalStore

    store = open_store(args.store)
    if not isinstance(store, LocalStore):
        print("serve needs a local store directory", file=sys.stderr)
        return 2
    srv = RangeServer.for_local_store(store, host=args.host, port=args.port).start()
    print(json.dumps({"event": "serving", "url": srv.url}), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gc25d_core.cache", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--head-url", default=None, help="HTTP stores: URL answering the head commit")
        sp.add_argument(
            "--token-env", default=None, help="name of an environment variable holding a Hub token"
        )

    sp = sub.add_parser("inspect", help="summarise a snapshot, a shard, or list versions")
    sp.add_argument("store")
    sp.add_argument("--version", type=int, default=None)
    sp.add_argument("--revision", default=None)
    sp.add_argument("--versions", action="store_true")
    sp.add_argument("--shard", default=None)
    common(sp)
    sp.set_defaults(fn=cmd_inspect)

    sp = sub.add_parser("verify", help="stream and verify every shard of a snapshot")
    sp.add_argument("store")
    sp.add_argument("--version", type=int, default=None)
    sp.add_argument("--revision", default=None)
    sp.add_argument(
        "--deep", action="store_true", help="also deserialise each verified PT and check the schema"
    )
    sp.add_argument("--shard", action="append", default=[])
    common(sp)
    sp.set_defaults(fn=cmd_verify)

    sp = sub.add_parser("publish", help="verify unlisted receipts and publish the next snapshot")
    sp.add_argument("store")
    sp.add_argument("--receipt", action="append", default=[])
    sp.add_argument("--schema", default=None, choices=sorted(SCHEMAS))
    sp.add_argument("--exclude", action="append", default=[])
    sp.add_argument("--unexclude", action="append", default=[])
    sp.add_argument("--split-method", choices=["hash", "explicit"], default=None)
    sp.add_argument("--val-fraction", type=float, default=0.02)
    sp.add_argument("--salt", default="gc25d-split-v1")
    sp.add_argument("--val-group", action="append", default=[])
    sp.add_argument("--no-deep", action="store_true", help="skip deserialising PTs during verification")
    common(sp)
    sp.set_defaults(fn=cmd_publish)

    sp = sub.add_parser("import", help="copy shards of an older cache byte for byte (verified)")
    sp.add_argument("src")
    sp.add_argument("dst")
    sp.add_argument("--worker", required=True)
    sp.add_argument("--schema", required=True, choices=sorted(SCHEMAS))
    sp.add_argument(
        "--source-repo", required=True, help="label recorded in receipts, e.g. peih/csgo-4090-v4-20260921"
    )
    sp.add_argument("--version", type=int, default=None)
    sp.add_argument("--revision", default=None)
    sp.add_argument("--listing", default=None, help="JSON list of {path, revision, size, sha256}")
    sp.add_argument("--shard", action="append", default=[])
    sp.add_argument("--deep", action="store_true")
    common(sp)
    sp.set_defaults(fn=cmd_import)

    sp = sub.add_parser("serve", help="serve a local store over HTTP with Range support (read-only)")
    sp.add_argument("store")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=0)
    sp.set_defaults(fn=cmd_serve)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except CacheError as e:
        print(f"error: {e}", file=sys.stderr)
        _result({"ok": False, "error": str(e), "type": type(e).__name__})
        return 1
