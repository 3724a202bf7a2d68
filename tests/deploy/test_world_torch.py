"""The live world's torch renderer (codeworld.torch_render via deploy.world.LiveWorld) against the
numpy reference (the data generator's ray cast + SeenMemory): the ids a session feeds the model
agree on ≥ 99.9 % of pixels over a 240-cell session of varied actions; on CUDA at 832×480 too."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from gc25d_core.codeworld.presets import FULL_GEOMETRY, TINY_GEOMETRY
from gc25d_core.config import GeometryConfig
from gc25d_core.deploy.world import LiveWorld, WorldConfig, reference_ids, varied_blocks
from gc25d_core.vocab import CHARACTER_IDS, UNKNOWN, check_ids

# a reduced frame (64×32 destination) keeps a 240-cell reference run within a CI minute
REDUCED = GeometryConfig(src_width=100, src_height=48, crop_x0=3, crop_x1=97, dst_width=64, dst_height=32)


def as_np(x: np.ndarray | torch.Tensor) -> np.ndarray:
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else x


def play(world: LiveWorld, blocks: list[np.ndarray]) -> list[np.ndarray]:
    _, ids0, _ = world.reset(with_rgb=False)
    return [ids0] + [as_np(world.advance(b)[0]) for b in blocks]


def agreement(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    same = sum(int((x == y).sum()) for x, y in zip(a, b, strict=True))
    return same / sum(x.size for x in a)


@pytest.mark.slow
def test_torch_world_matches_the_reference_over_240_cells():
    torch.manual_seed(0)
    blocks = varied_blocks(240)
    ref = play(LiveWorld(WorldConfig(renderer="numpy"), REDUCED), blocks)
    got_world = LiveWorld(WorldConfig(renderer="torch"), REDUCED, device="cpu")
    got = play(got_world, blocks)
    frac = agreement(ref, got)
    print(f"\ntorch vs numpy world ids, 240 cells at 64x32: {frac:.6f} of pixels agree")
    assert frac >= 0.999
    ids = np.concatenate(got[1:])
    check_ids(ids, "parts", "torch world ids")
    # not a vacuous session: characters on screen, unseen ground masked, the seen set grows
    assert np.isin(ids, list(CHARACTER_IDS)).mean() > 0.01
    unknown = [(g == UNKNOWN).mean() for g in got[1:]]
    assert max(unknown) > 0.0 and min(unknown) < max(unknown)
    assert len({b.tobytes() for b in blocks}) > 20
    assert got_world.frames == 1 + 4 * 240


def test_torch_world_float32_and_unculled_match_on_the_tiny_frame():
    blocks = varied_blocks(12, seed=1)
    ref = play(LiveWorld(WorldConfig(renderer="numpy"), TINY_GEOMETRY), blocks)
    f32 = play(LiveWorld(WorldConfig(renderer="torch"), TINY_GEOMETRY, dtype=torch.float32), blocks)
    assert agreement(ref, f32) >= 0.999
    # culling (frame-level primitive boxes, the capsule window) is exact: no culling, same ids
    from gc25d_core.codeworld.camera import camera_matrices

    g = TINY_GEOMETRY
    world = LiveWorld(WorldConfig(seed=3, renderer="torch"), g)
    world.reset(with_rgb=False)
    assert world.stepper is not None and world.torch is not None
    for blk in blocks[:4]:
        states = [world.stepper.frame(blk) for _ in range(4)]
        cams = [camera_matrices(s.camera, g.src_width, g.src_height) for s in states]
        args = (
            world.scene_of(states[0].look),
            np.stack([c.world_to_clip for c in cams]),
            np.stack([c.world_to_view for c in cams]),
            np.stack([s.capsules for s in states]),
        )
        culled, uncut = world.torch.render(*args, cull=True), world.torch.render(*args, cull=False)
        assert torch.equal(culled[0], uncut[0]) and torch.equal(culled[1], uncut[1])


def test_device_ids_are_checked_like_host_ids(tiny_export):
    from gc25d_core.deploy.runtime import DeployRuntime, load_deploy_model

    _, meta = load_deploy_model(tiny_export)
    rt = DeployRuntime.__new__(DeployRuntime)  # only the id checks: no model, text or VAE needed
    rt.device, rt.meta, rt._valid_lut = torch.device("cpu"), meta, None
    good = torch.tensor([0, 10, 21, UNKNOWN], dtype=torch.uint8).repeat(4, 2, 1)
    assert DeployRuntime._device_ids(rt, good, 4).shape == (1, 4, 2, 4)
    bad = good.clone()
    bad[2, 1, 3] = 9  # 9 is no "parts" id
    with pytest.raises(ValueError, match=r"cell ids: values \[9\]"):
        DeployRuntime._device_ids(rt, bad, 4)
    with pytest.raises(ValueError, match=r"uint8 \[4, H, W\]"):
        DeployRuntime._device_ids(rt, good[:3], 4)


def test_parallel_reference_is_the_reference():
    blocks = varied_blocks(3, seed=2)
    want = play(LiveWorld(WorldConfig(renderer="numpy"), REDUCED), blocks)
    got = reference_ids(WorldConfig(), REDUCED, blocks, workers=2)
    assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))


@pytest.mark.gpu
def test_torch_world_on_cuda_at_full_size_matches_the_reference():
    """The compiled static pass on CUDA at 832×480 over a 240-cell session; its speed is printed
    (bench/speed/deploy.py records it: a benchmark, not a timed test)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import time

    cells = int(os.environ.get("GC25D_WORLD_CELLS", "240"))
    blocks = varied_blocks(cells, seed=5)
    ref = reference_ids(WorldConfig(), FULL_GEOMETRY, blocks, workers=max(1, (os.cpu_count() or 2) - 1))
    world = LiveWorld(WorldConfig(), FULL_GEOMETRY, device="cuda")
    assert world.torch is not None and world.torch.compiled
    world.warm_up()
    _, ids0, _ = world.reset(with_rgb=False)
    got, times, sims = [ids0], [], []
    for b in blocks:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ids, _ = world.advance(b)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        sims.append(world.times["sim"])
        got.append(as_np(ids))
    frac = agreement(ref, got)
    worst = min(float((a == b).mean()) for a, b in zip(ref, got, strict=True))
    s, q = np.asarray(times) * 1e3, np.asarray(sims) * 1e3
    print(
        f"\ncuda world at 832x480, {cells} cells: agreement {frac:.6f} (worst cell {worst:.6f}); per cell "
        f"p50 {np.percentile(s, 50):.2f} ms p99 {np.percentile(s, 99):.2f} max {s.max():.2f} "
        f"(host sim p50 {np.percentile(q, 50):.2f} ms)"
    )
    assert frac >= 0.999


@pytest.mark.parametrize("renderer", ["torch", "numpy"])
def test_a_reset_replays_the_session_from_the_kept_frame_0(renderer):
    world = LiveWorld(WorldConfig(renderer=renderer), REDUCED)
    blocks = varied_blocks(6, seed=4)
    first = play(world, blocks)
    again = play(world, blocks)  # frame 0 reused, the seen memory and the dynamics start over
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert (first[1] == UNKNOWN).any()  # the memory was reset: the first cell masks unseen ground


@pytest.mark.gpu
def test_cuda_world_renders_beside_a_busy_caller_stream():
    """The ids render on the world's own stream: with the caller's stream busy (as with a deferred
    commit), a cell's ids are ready and copied to the host before the caller's work ends, and the
    caller, reading them after its work, gets the same ids as an uncontended session."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from gc25d_core.deploy.session import host_copy

    blocks = varied_blocks(12, seed=9)
    calm = LiveWorld(WorldConfig(), TINY_GEOMETRY, device="cuda")
    calm.warm_up()
    want = play(calm, blocks)
    world = LiveWorld(WorldConfig(), TINY_GEOMETRY, device="cuda")
    assert world.stream is not None
    world.warm_up()
    _, ids0, _ = world.reset(with_rgb=False)
    got, overlapped = [ids0], 0
    a = torch.randn(4096, 4096, device="cuda")
    for b in blocks:
        busy = a
        for _ in range(60):  # tens of ms of the caller's stream
            busy = busy @ a
            busy = busy / busy.norm()
        done_busy = torch.cuda.Event()
        done_busy.record()
        ids, _ = world.advance(b)
        host, ready = host_copy(ids, world.stream)
        ready.synchronize()
        overlapped += int(not done_busy.query())  # the ids reached the host while the caller worked
        got.append(as_np(ids.clone()))  # read on the caller's stream, after its work
        assert np.array_equal(host.numpy(), got[-1])
    torch.cuda.synchronize()
    assert all(np.array_equal(x, y) for x, y in zip(want, got, strict=True))
    assert overlapped == len(blocks)


def test_the_default_renderer_is_torch_on_a_gpu_and_numpy_on_a_cpu():
    """``auto`` (the default): the ray cast on a CPU, where it is the faster of the two; a GPU
    session renders with torch on its device."""
    assert LiveWorld(WorldConfig(), TINY_GEOMETRY, device="cpu").renderer == "numpy"
    assert LiveWorld(WorldConfig(), TINY_GEOMETRY, device="cpu").torch is None
    assert LiveWorld(WorldConfig(renderer="torch"), TINY_GEOMETRY, device="cpu").renderer == "torch"
    if torch.cuda.is_available():
        assert LiveWorld(WorldConfig(), TINY_GEOMETRY, device="cuda").renderer == "torch"
