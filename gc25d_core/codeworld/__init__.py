"""The code world: a deterministic procedural GameCrafter-format world (DESIGN.md §2, issue 3).

It is both the embedded default dataset (``generate`` writes the raw layout of raw_layout.py) and
the inference-time world that draws the condition (``render.render_semantic_dst``).

    camera.py   third-person / orthographic rigs → world_to_view, projection, world_to_clip
    scene.py    ground-plane semantic layout + architecture / set dressing primitives; static render
    actors.py   poses → 12 capsules per actor (capsules.CAPSULE_NAMES order) + mesh extras
    sim.py      a run: action blocks (text.py format) drive player, boss, camera, episodes, looks
    shade.py    RGB from ids: per-class world-space textures, lighting, shadows, fog
    render.py   frame composition (ids with occlusion, ground-truth parts, RGB)
    presets.py  "tiny" (CI) and "full" (1280×704) run lists
    writer.py   generate(): the raw layout on disk, atomic and idempotent
"""

from gc25d_core.codeworld.presets import PRESETS, TINY_GEOMETRY, get_preset
from gc25d_core.codeworld.writer import generate

__all__ = ["PRESETS", "TINY_GEOMETRY", "generate", "get_preset"]
