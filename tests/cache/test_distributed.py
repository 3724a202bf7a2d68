"""Two real ranks (gloo, forked processes): the snapshot is agreed by broadcast from rank 0, the
checkpoint state is all-gathered and merged, and a 2 -> 1 rank resume finishes the epoch exactly."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket

import pytest

from gc25d_core.cache import ConsumerConfig, StreamingCache


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, root: str, q) -> None:  # runs in a forked child
    import torch.distributed as dist

    from gc25d_core.cache import LocalStore

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        ds = StreamingCache(LocalStore(root), ConsumerConfig(seed=11, batch_size=2))  # rank/world from env
        ids = []
        for step, b in enumerate(ds.iter_batches()):
            ds.mark_consumed(b)
            ids += [k.sample_id for k in b.keys]
            if step == 1:
                break
        state = ds.gather_state_dict()
        q.put((rank, ids, state, ds.manifest_ref.model_dump()))
        dist.destroy_process_group()
    except BaseException as e:  # pragma: no cover - surfaced by the parent
        q.put((rank, repr(e), None, None))


@pytest.mark.slow
def test_two_gloo_ranks_gather_and_resume(small_store, kit):
    store, ref = small_store
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, str(store.root), q)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert all(isinstance(g[1], list) for g in got), got
    (_, ids0, st0, ref0), (_, ids1, st1, ref1) = got
    assert st0 == st1  # every rank holds the merged global state
    assert ref0 == ref1 == ref.model_dump()
    assert not set(ids0) & set(ids1)
    ds = StreamingCache(store, ConsumerConfig(seed=11, batch_size=2), manifest=ref, rank=0, world_size=1)
    ds.load_state_dict(st0)
    rest = kit.consume(ds)
    everything = ids0 + ids1 + rest
    assert len(everything) == len(set(everything)) == ds.num_eligible()
