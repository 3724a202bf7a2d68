"""A run of the code world: a player and a boss fighting, driven by 0.25 s action blocks.

``simulate(spec)`` yields one ``FrameState`` per frame and fills the run's action blocks
(uint8 [ceil(F/4), 5], text.py format: move, run, attack, dodge, stance). Block b drives frames
4b … 4b+3. The player moves relative to a lock-on camera that looks from behind the player at the
boss: forward walks toward the boss, left/right circle it. The third-person camera aims at the
player's actor position, so on centred runs the player sits at NDC (0, 0) — the destination centre
after crop + resize; "framed" runs (P9) aim at a lagging, drifting point instead
(``frame_offset_cm`` = aim − player actor_pos).

Episodes end with a scripted death (10 dead frames) and a respawn; camera variants switch (with a
cut) and looks change (set dressing re-scattered) at the frames the RunSpec lists.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from gc25d_core.codeworld.actors import (
    BOSS_SCALE,
    BOSS_SHAPE,
    PLAYER_SCALE,
    PLAYER_SHAPE,
    Pose,
    actor_pos,
    body_capsules,
)
from gc25d_core.codeworld.camera import CAMERA_VARIANTS, CameraPose, CameraVariant, aimed_pose
from gc25d_core.codeworld.scene import ARENA_RADIUS_CM, StaticScene

FPS = 16
DT = 1.0 / FPS
FRAMES_PER_BLOCK = 4
DEAD_FRAMES = 10
PLAYER_RADIUS_CM = 35.0
BOSS_RADIUS_CM = 55.0


@dataclass(frozen=True)
class LookSpan:
    """From ``start`` on, the set dressing is ``seed`` and the look is called ``name``."""

    start: int
    name: str
    seed: int


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines one generated run (deterministic given the fields)."""

    subset: str
    scene: str
    run: str
    num_frames: int
    seed: int
    scene_seed: int
    style: str
    framed: bool
    cameras: tuple[tuple[int, str], ...]  # (first frame, camera variant), first at frame 0
    looks: tuple[LookSpan, ...]  # first at frame 0
    respawns: tuple[int, ...] = ()  # frames where a new episode starts

    @property
    def num_blocks(self) -> int:
        return -(-self.num_frames // FRAMES_PER_BLOCK)

    def camera_at(self, frame: int) -> str:
        return [name for start, name in self.cameras if start <= frame][-1]

    def look_at(self, frame: int) -> LookSpan:
        return [lk for lk in self.looks if lk.start <= frame][-1]

    def episode_at(self, frame: int) -> int:
        return sum(1 for r in self.respawns if r <= frame)

    def dead_at(self, frame: int) -> bool:
        return any(r - DEAD_FRAMES <= frame < r for r in self.respawns)


@dataclass(frozen=True)
class FrameState:
    """One frame of a run: labels, camera, bodies (capsules f64 [2,12,7], extras per actor [E,4])."""

    frame: int
    episode: int
    camera_variant: str
    look: LookSpan
    dead: bool
    event: str | None
    camera: CameraPose
    capsules: np.ndarray
    extras: tuple[np.ndarray, np.ndarray]
    actor_pos: np.ndarray  # f64 [2,3]
    feet: np.ndarray  # f64 [2,3]
    frame_offset: np.ndarray  # f64 [3]
    player_state: str
    boss_state: str


# --- the player's action policy -----------------------------------------------------------------

_INTENTS = ("idle", "walk", "run", "light", "heavy", "dodge", "jump", "guard")
_WEIGHTS = {
    "far": (0.05, 0.25, 0.45, 0.05, 0.0, 0.05, 0.1, 0.05),
    "mid": (0.1, 0.25, 0.1, 0.2, 0.1, 0.1, 0.05, 0.1),
    "close": (0.05, 0.15, 0.0, 0.25, 0.15, 0.2, 0.05, 0.15),
}


def _intent_blocks(rng: np.random.Generator, intent: str, band: str) -> list[np.ndarray]:
    """The blocks of one intent (uint8 [5] each)."""

    def block(move: int = 0, run: int = 0, attack: int = 0, dodge: int = 0, stance: int = 0) -> np.ndarray:
        return np.array([move, run, attack, dodge, stance], np.uint8)

    if intent == "idle":
        return [block()] * int(rng.integers(1, 4))
    if intent == "walk":
        moves = {"far": (1, 1, 1, 5, 6, 3, 4), "mid": (1, 3, 4, 5, 6, 2, 7, 8), "close": (2, 3, 4, 7, 8)}[
            band
        ]
        return [block(int(rng.choice(moves)))] * int(rng.integers(2, 7))
    if intent == "run":
        return [block(int(rng.choice((1, 1, 3, 4, 5, 6))), 1)] * int(rng.integers(2, 6))
    if intent == "light":
        return [block(attack=1)] * 2
    if intent == "heavy":
        return [block(attack=2)] * 3
    if intent == "dodge":
        return [block(int(rng.choice((0, 2, 3, 4, 7, 8))), dodge=1)]
    if intent == "jump":
        return [block(int(rng.choice((0, 1, 1))), stance=1)] * 2
    return [block(int(rng.choice((0, 0, 2, 3, 4))), stance=2)] * int(rng.integers(2, 6))


class Policy:
    """Distance-aware random intents (idle, walk, run, attacks, dodge, jump, guard) → action blocks."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.queue: list[np.ndarray] = []

    def next_block(self, distance_cm: float, dead: bool) -> np.ndarray:
        if dead:
            self.queue.clear()
            return np.zeros(5, np.uint8)
        if not self.queue:
            band = "far" if distance_cm > 650 else "mid" if distance_cm > 250 else "close"
            w = np.array(_WEIGHTS[band])
            intent = _INTENTS[int(self.rng.choice(len(_INTENTS), p=w / w.sum()))]
            self.queue = _intent_blocks(self.rng, intent, band)
        return self.queue.pop(0)


# --- actors -------------------------------------------------------------------------------------


def _wrap(a: float) -> float:
    return (a + math.pi) % (2 * math.pi) - math.pi


def _move_dir(move: int, yaw: float) -> np.ndarray:
    fwd = np.array([math.cos(yaw), math.sin(yaw)])
    right = np.array([math.sin(yaw), -math.cos(yaw)])
    table = {
        0: 0 * fwd,
        1: fwd,
        2: -fwd,
        3: -right,
        4: right,
        5: fwd - right,
        6: fwd + right,
        7: -fwd - right,
        8: -fwd + right,
    }
    v = table[int(move)]
    n = float(np.linalg.norm(v))
    return v / n if n > 0 else v


@dataclass
class Actor:
    """Mutable simulation state of one actor (foot position on the ground, heading, timers)."""

    xy: np.ndarray
    heading: float
    radius: float
    phase: float = 0.0
    stride: float = 0.0
    attack: int = 0
    attack_timer: int = 0
    attack_len: int = 1
    dodge_timer: int = 0
    dodge_dir: np.ndarray = field(default_factory=lambda: np.zeros(2))
    jump_timer: int = 0
    guard: bool = False
    state: str = "idle"
    ai_timer: int = 0
    ai_dir: np.ndarray = field(default_factory=lambda: np.zeros(2))

    @property
    def attack_t(self) -> float:
        return 1.0 - self.attack_timer / self.attack_len if self.attack_timer else 0.0

    def advance_gait(self, speed: float, stride_len: float) -> None:
        self.stride += (min(1.0, speed / 450.0) - self.stride) * 0.35
        self.phase += 2 * math.pi * speed * DT / stride_len

    def pose(self, dead: bool = False) -> Pose:
        jump = 45.0 * math.sin(math.pi * (1.0 - self.jump_timer / 8.0)) if self.jump_timer else 0.0
        return Pose(
            walk_phase=self.phase,
            stride=self.stride,
            attack=self.attack if self.attack_timer else 0,
            attack_t=self.attack_t,
            guard=self.guard,
            dodge_t=1.0 - self.dodge_timer / 8.0 if self.dodge_timer else -1.0,
            jump_cm=jump,
            dead=dead,
        )


def _push_out(xy: np.ndarray, radius: float, scene: StaticScene) -> np.ndarray:
    """Move a footprint circle out of obstacles and back inside the arena."""
    p = xy.copy()
    for cx, cy, r in scene.obstacle_circles():
        d = p - (cx, cy)
        dist = float(np.hypot(*d))
        if dist < r + radius:
            p = np.array([cx, cy]) + (d / max(dist, 1e-6)) * (r + radius)
    for x0, y0, x1, y1 in scene.obstacle_rects():
        q = np.clip(p, (x0, y0), (x1, y1))
        d = p - q
        dist = float(np.hypot(*d))
        if dist < radius:
            p = q + d / dist * radius if dist > 1e-06 else _exit_rect(p, radius, x0, y0, x1, y1)
    r = float(np.hypot(*p))
    if r > ARENA_RADIUS_CM:
        p = p * (ARENA_RADIUS_CM / r)
    return p


def _exit_rect(p: np.ndarray, radius: float, x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    options = [
        (p[0] - x0 + radius, (x0 - radius, p[1])),
        (x1 - p[0] + radius, (x1 + radius, p[1])),
        (p[1] - y0 + radius, (p[0], y0 - radius)),
        (y1 - p[1] + radius, (p[0], y1 + radius)),
    ]
    return np.array(min(options)[1])


class Fight:
    """Player + boss dynamics for one run."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.player = Actor(np.zeros(2), 0.0, PLAYER_RADIUS_CM)
        self.boss = Actor(np.zeros(2), 0.0, BOSS_RADIUS_CM)
        self.spawn()

    def spawn(self) -> None:
        ang = float(self.rng.uniform(0, 2 * math.pi))
        self.player = Actor(np.array([math.cos(ang), math.sin(ang)]) * 500.0, ang + math.pi, PLAYER_RADIUS_CM)
        self.boss = Actor(np.array([math.cos(ang), math.sin(ang)]) * -250.0, ang, BOSS_RADIUS_CM)

    @property
    def distance(self) -> float:
        return float(np.hypot(*(self.boss.xy - self.player.xy)))

    @property
    def lock_yaw(self) -> float:
        d = self.boss.xy - self.player.xy
        return math.atan2(d[1], d[0])

    def step_player(self, block: np.ndarray, cam_yaw: float, scene: StaticScene) -> None:
        p = self.player
        move, run, attack, dodge, stance = (int(v) for v in block)
        busy = p.attack_timer or p.dodge_timer
        if attack and not busy:
            p.attack, p.attack_len = attack, (8 if attack == 1 else 12)
            p.attack_timer = p.attack_len
        elif dodge and not busy:
            d = _move_dir(move, cam_yaw)
            p.dodge_dir = d if move else _move_dir(2, cam_yaw)
            p.dodge_timer = 8
        if stance == 1 and not p.jump_timer and not p.dodge_timer:
            p.jump_timer = 8
        p.guard = stance == 2 and not p.attack_timer and not p.dodge_timer
        if p.dodge_timer:
            vel = p.dodge_dir * 480.0
        elif p.attack_timer:
            vel = _move_dir(move, cam_yaw) * 60.0
        else:
            vel = _move_dir(move, cam_yaw) * (520.0 if run else 230.0) * (0.45 if p.guard else 1.0)
        speed = float(np.hypot(*vel))
        p.xy = _push_out(p.xy + vel * DT, p.radius, scene)
        p.advance_gait(speed if not p.dodge_timer else 0.0, 140.0)
        p.heading += _wrap(self.lock_yaw - p.heading) * 0.3
        p.state = self._player_state(move, run)
        for name in ("attack_timer", "dodge_timer", "jump_timer"):
            setattr(p, name, max(0, getattr(p, name) - 1))

    def _player_state(self, move: int, run: int) -> str:
        p = self.player
        if p.dodge_timer:
            return "dodge"
        if p.attack_timer:
            return "attack_light" if p.attack == 1 else "attack_heavy"
        if p.jump_timer:
            return "jump"
        if p.guard:
            return "guard"
        if move:
            return "run" if run else "walk"
        return "idle"

    def step_boss(self, scene: StaticScene) -> None:
        b = self.boss
        to_player = self.player.xy - b.xy
        dist = float(np.hypot(*to_player)) + 1e-6
        if b.ai_timer <= 0:
            self._boss_decide(dist, to_player / dist)
        b.ai_timer -= 1
        vel = np.zeros(2)
        if b.state in ("walk", "strafe"):
            vel = b.ai_dir * 170.0
            if b.state == "walk":
                vel = to_player / dist * 170.0
        if b.attack_timer:
            b.attack_timer -= 1
        else:
            b.heading += max(-0.12, min(0.12, _wrap(math.atan2(to_player[1], to_player[0]) - b.heading)))
        b.xy = _push_out(b.xy + vel * DT, b.radius, scene)
        self._separate()
        b.advance_gait(float(np.hypot(*vel)), 200.0)
        if b.state.startswith("attack") and not b.attack_timer:
            b.state, b.ai_timer = "idle", 4

    def _boss_decide(self, dist: float, toward: np.ndarray) -> None:
        b = self.boss
        if dist > 380.0:
            b.state, b.ai_timer = "walk", int(self.rng.integers(8, 17))
            return
        r = float(self.rng.uniform())
        if r < 0.35:
            b.state, b.attack, b.attack_len = "attack_light", 1, 12
        elif r < 0.6:
            b.state, b.attack, b.attack_len = "attack_heavy", 2, 18
        elif r < 0.8:
            b.state, b.ai_timer = "idle", int(self.rng.integers(6, 13))
            return
        else:
            side = 1.0 if self.rng.uniform() < 0.5 else -1.0
            b.state, b.ai_timer = "strafe", int(self.rng.integers(8, 13))
            b.ai_dir = np.array([-toward[1], toward[0]]) * side
            return
        b.attack_timer = b.ai_timer = b.attack_len

    def _separate(self) -> None:
        d = self.boss.xy - self.player.xy
        dist = float(np.hypot(*d))
        need = self.player.radius + self.boss.radius
        if dist < need:
            n = d / dist if dist > 1e-6 else np.array([1.0, 0.0])
            self.boss.xy = self.player.xy + n * need

    def event(self) -> str | None:
        """A hit lands when an attack passes 55 % of its swing with the target in reach."""
        p, b = self.player, self.boss
        dist = self.distance
        if p.attack_timer and int(p.attack_len * 0.45) == p.attack_timer and dist < 220.0:
            return "boss_hit"
        if b.attack_timer and int(b.attack_len * 0.45) == b.attack_timer and dist < 320.0:
            if p.dodge_timer:
                return None
            return "player_block" if p.guard else "player_hit"
        return None


# --- camera -------------------------------------------------------------------------------------


class CameraRig:
    """Lock-on third-person camera; framed runs aim at a lagging, drifting point."""

    def __init__(self, rng: np.random.Generator, framed: bool):
        self.framed = framed
        self.yaw = 0.0
        self.aim: np.ndarray | None = None
        self.phases = rng.uniform(0, 2 * math.pi, 4)

    def drift(self, frame: int, yaw: float) -> np.ndarray:
        if not self.framed:
            return np.zeros(3)
        t = frame * DT
        ph = self.phases
        side = 150.0 * math.sin(0.45 * t + ph[0]) + 50.0 * math.sin(1.3 * t + ph[1])
        along = 90.0 * math.sin(0.3 * t + ph[2])
        up = 45.0 * math.sin(0.6 * t + ph[3])
        right = np.array([math.sin(yaw), -math.cos(yaw), 0.0])
        fwd = np.array([math.cos(yaw), math.sin(yaw), 0.0])
        return side * right + along * fwd + np.array([0.0, 0.0, up])

    def update(
        self,
        frame: int,
        target: np.ndarray,
        lock_yaw: float,
        variant: CameraVariant,
        snap: bool,
        scene: StaticScene,
    ) -> tuple[CameraPose, np.ndarray]:
        """Pose for this frame and the aim offset from ``target`` (f64 [3])."""
        if snap:
            self.yaw = lock_yaw
        else:
            self.yaw += _wrap(lock_yaw - self.yaw) * variant.yaw_follow
        goal = target + self.drift(frame, self.yaw)
        if self.framed and self.aim is not None and not snap:
            self.aim = self.aim + (goal - self.aim) * 0.25
        else:
            self.aim = goal
        return _unblocked_pose(self.aim, self.yaw, variant, scene), self.aim - target


def _inside_obstacle(eye: np.ndarray, scene: StaticScene, margin: float = 15.0) -> bool:
    c = scene.cylinders
    d = np.hypot(c.xy[:, 0] - eye[0], c.xy[:, 1] - eye[1])
    if ((d < c.r + margin) & (eye[2] < c.z1 + margin)).any():
        return True
    b = scene.boxes
    inside = (b.lo - margin <= eye).all(axis=1) & (eye <= b.hi + margin).all(axis=1)
    s = scene.spheres
    return bool(inside.any() or (np.linalg.norm(s.c - eye, axis=1) < s.r + margin).any())


def _unblocked_pose(aim: np.ndarray, yaw: float, variant: CameraVariant, scene: StaticScene) -> CameraPose:
    """Pull the camera in along its boom until the eye is outside every obstacle (aim unchanged)."""
    v = variant
    for _ in range(12):
        pose = aimed_pose(aim, yaw, v)
        if v.orthographic or not _inside_obstacle(np.array(pose.eye), scene):
            return pose
        v = CameraVariant(
            v.name,
            v.distance_cm * 0.82,
            v.pitch_deg,
            v.fov_x_deg,
            v.orthographic,
            v.ortho_width_cm,
            v.yaw_follow,
        )
    return pose


# --- the run loop -------------------------------------------------------------------------------


def simulate(
    spec: RunSpec, scene_of: Callable[[LookSpan], StaticScene]
) -> tuple[np.ndarray, Iterator[FrameState]]:
    """(actions uint8 [num_blocks, 5], lazy FrameState iterator). The actions array is complete once
    the iterator has been exhausted."""
    actions = np.zeros((spec.num_blocks, 5), np.uint8)
    return actions, _frames(spec, scene_of, actions)


def _frames(
    spec: RunSpec, scene_of: Callable[[LookSpan], StaticScene], actions: np.ndarray
) -> Iterator[FrameState]:
    policy = Policy(np.random.default_rng([spec.seed, 11]))
    stepper = RunStepper(spec, scene_of)

    def block_of(f: int, distance: float, dead: bool) -> np.ndarray:
        if f % FRAMES_PER_BLOCK == 0:  # the policy sees the distance after a respawn
            actions[f // FRAMES_PER_BLOCK] = policy.next_block(distance, dead)
        return actions[f // FRAMES_PER_BLOCK]

    for f in range(spec.num_frames):
        yield stepper.frame(partial(block_of, f))


class RunStepper:
    """The run loop one frame at a time, for any source of action blocks: ``simulate`` feeds it the
    policy's blocks, the live session (gc25d_core.deploy) a player's. ``frame(block)`` advances the
    next frame under ``block`` (uint8 [5], or ``block(distance, dead)`` called after a respawn) and
    returns its state; the same spec and blocks give the same states as ``simulate`` (one
    implementation of the dynamics)."""

    def __init__(self, spec: RunSpec, scene_of: Callable[[LookSpan], StaticScene]):
        self.spec, self.scene_of = spec, scene_of
        self.fight = Fight(np.random.default_rng([spec.seed, 13]))
        self.rig = CameraRig(np.random.default_rng([spec.seed, 17]), spec.framed)
        self.prev_variant: str | None = None
        self.next_frame = 0

    def frame(self, block: np.ndarray | Callable[[float, bool], np.ndarray]) -> FrameState:
        spec, fight, rig = self.spec, self.fight, self.rig
        f = self.next_frame
        look = spec.look_at(f)
        scene = self.scene_of(look)
        dead = spec.dead_at(f)
        respawn = f in spec.respawns
        if respawn:
            fight.spawn()
        if callable(block):
            block = block(fight.distance, dead)
        variant_name = spec.camera_at(f)
        variant = CAMERA_VARIANTS[variant_name]
        if not dead:
            fight.step_player(block, rig.yaw, scene)
        fight.step_boss(scene)
        event = _frame_event(spec, f, fight, dead, respawn)
        p_foot = np.array([*fight.player.xy, 0.0])
        b_foot = np.array([*fight.boss.xy, 0.0])
        p_caps, p_ex = body_capsules(
            p_foot, fight.player.heading, PLAYER_SCALE, fight.player.pose(dead), PLAYER_SHAPE
        )
        b_caps, b_ex = body_capsules(b_foot, fight.boss.heading, BOSS_SCALE, fight.boss.pose(), BOSS_SHAPE)
        # f32 is what frame.json round-trips; the renderer uses exactly these values
        caps = np.stack([p_caps, b_caps]).astype(np.float32).astype(np.float64)
        pos = np.stack([actor_pos(p_foot, PLAYER_SCALE), actor_pos(b_foot, BOSS_SCALE)])
        snap = f == 0 or respawn or variant_name != self.prev_variant
        pose, offset = rig.update(f, pos[0], fight.lock_yaw, variant, snap, scene)
        self.prev_variant = variant_name
        self.next_frame = f + 1
        return FrameState(
            frame=f,
            episode=spec.episode_at(f),
            camera_variant=variant_name,
            look=look,
            dead=dead,
            event=event,
            camera=pose,
            capsules=caps,
            extras=(p_ex, b_ex),
            actor_pos=pos,
            feet=np.stack([p_foot, b_foot]),
            frame_offset=offset,
            player_state="dead" if dead else fight.player.state,
            boss_state=fight.boss.state,
        )


def _frame_event(spec: RunSpec, f: int, fight: Fight, dead: bool, respawn: bool) -> str | None:
    if respawn:
        return "respawn"
    if dead:
        return "player_death" if not spec.dead_at(f - 1) else None
    return fight.event()
