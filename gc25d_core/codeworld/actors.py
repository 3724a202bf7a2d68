"""Actor bodies: a pose → 12 capsules in the order of capsules.CAPSULE_NAMES, plus mesh extras.

A body is built in a local frame (cm; x forward, y left, z up, feet at the origin) for a 180 cm
figure, then scaled, turned by the heading and moved to the foot position. The "extras" are small
spheres of mesh detail (a plume, horns) that are no capsule: the renderer labels them core, so
``label_parts`` sees rays that miss every capsule and keeps the core id there, as with UE meshes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gc25d_core.capsules import CAPSULE_FLOATS, NUM_CAPSULES

ACTOR_PIVOT_CM = 92.0  # actor_pos = foot + pivot·scale (UE's capsule-component centre)
PLAYER_SCALE = 1.0
BOSS_SCALE = 1.55


@dataclass(frozen=True)
class Pose:
    """Animation inputs of one frame.

    walk_phase: gait phase (rad); stride: 0 idle … 1 run; attack: 0 none / 1 light / 2 heavy with
    attack_t ∈ [0,1] its progress; guard; dodge_t ∈ [0,1] roll progress (< 0 = none); jump_cm: height
    of the feet; dead: lying on the back.
    """

    walk_phase: float = 0.0
    stride: float = 0.0
    attack: int = 0
    attack_t: float = 0.0
    guard: bool = False
    dodge_t: float = -1.0
    jump_cm: float = 0.0
    dead: bool = False


@dataclass(frozen=True)
class BodyShape:
    weapon_len: float
    weapon_r: float
    extras: tuple[tuple[float, float, float, float], ...]  # local (x, y, z, r) spheres


PLAYER_SHAPE = BodyShape(
    weapon_len=95.0, weapon_r=3.5, extras=((0.0, 0.0, 184.0, 5.0), (-6.0, 0.0, 180.0, 4.0))
)
BOSS_SHAPE = BodyShape(
    weapon_len=120.0, weapon_r=5.5, extras=((2.0, 11.0, 177.0, 4.5), (2.0, -11.0, 177.0, 4.5))
)


def _dir_xz(angle: float, y: float = 0.0) -> np.ndarray:
    """Unit vector in the sagittal plane: angle 0 = straight down, positive = forward."""
    v = np.array([math.sin(angle), y, -math.cos(angle)])
    return v / np.linalg.norm(v)


def _legs(pose: Pose) -> list[tuple[np.ndarray, np.ndarray, float]]:
    swing = 0.55 * pose.stride
    out = []
    for side, sign in ((1.0, 1.0), (-1.0, -1.0)):
        theta = sign * swing * math.sin(pose.walk_phase)
        bend = 0.7 * pose.stride * max(0.0, math.sin(pose.walk_phase + (0.0 if sign > 0 else math.pi) + 1.2))
        hip = np.array([0.0, 9.0 * side, 94.5])
        knee = hip + 44.0 * _dir_xz(theta)
        ankle = knee + 44.0 * _dir_xz(theta - bend)
        out += [(hip, knee, 8.5), (knee, ankle, 6.5)]
    return out


def _arm_angles(pose: Pose, side: float) -> tuple[float, float]:
    """(upper-arm angle, elbow bend) for one side; 0 = hanging, positive = forward."""
    swing = -0.45 * pose.stride * math.sin(pose.walk_phase) * side
    upper, bend = swing, 0.35 + 0.3 * pose.stride
    if pose.guard:
        upper, bend = 0.7, 1.9
    if side < 0 and pose.attack:
        p = pose.attack_t
        if pose.attack == 1:
            upper = -0.6 + 2.4 * math.sin(0.5 * math.pi * p)
            bend = 1.2 * (1.0 - p) + 0.2
        else:
            upper = math.pi - 0.2 - (math.pi + 0.4) * p * p
            bend = 0.25
    return upper, bend


def _arms(pose: Pose) -> tuple[list[tuple[np.ndarray, np.ndarray, float]], np.ndarray, np.ndarray]:
    out = []
    hand = forearm_dir = np.zeros(3)
    for side in (1.0, -1.0):
        upper, bend = _arm_angles(pose, side)
        shoulder = np.array([0.0, 21.0 * side, 143.0])
        elbow = shoulder + 29.0 * _dir_xz(upper, 0.12 * side)
        fdir = _dir_xz(upper + bend, 0.05 * side)
        wrist = elbow + 27.0 * fdir
        out += [(shoulder, elbow, 6.0), (elbow, wrist, 5.0)]
        if side < 0:
            hand, forearm_dir = wrist, fdir
    return out, hand, forearm_dir


def _weapon(hand: np.ndarray, forearm_dir: np.ndarray, pose: Pose, shape: BodyShape):
    tip_dir = forearm_dir + np.array([0.9, 0.0, 0.55])
    if pose.guard:
        tip_dir = np.array([0.2, 0.9, 0.35])
    tip_dir = tip_dir / np.linalg.norm(tip_dir)
    return hand, hand + shape.weapon_len * tip_dir, shape.weapon_r


def local_body(pose: Pose, shape: BodyShape) -> tuple[np.ndarray, np.ndarray]:
    """(capsules f64 [12,7], extras f64 [E,4]) of a 180 cm figure in the local frame."""
    lean = 0.25 if pose.attack == 2 else 0.08 * pose.stride
    torso_top = np.array([14.0 * math.sin(lean), 0.0, 100.0 + 45.0 * math.cos(lean)])
    core = [
        (np.array([0.0, 10.0, 97.0]), np.array([0.0, -10.0, 97.0]), 13.0),
        (np.array([0.0, 0.0, 108.0]), torso_top, 16.0),
        (torso_top + np.array([0.0, 0.0, 14.0]), torso_top + np.array([1.0, 0.0, 25.0]), 11.0),
    ]
    arms, hand, fdir = _arms(pose)
    caps = core + arms + _legs(pose) + [_weapon(hand, fdir, pose, shape)]
    out = np.array([[*a, *b, r] for a, b, r in caps], dtype=np.float64)
    extras = np.array(shape.extras, dtype=np.float64)
    extras[:, :3] += torso_top - np.array([0.0, 0.0, 145.0])
    # plant the lower foot: the body bobs so the lowest leg capsule touches z = 0
    legs = out[7:11]
    low = float((legs[:, [2, 5]] - legs[:, 6:7]).min())
    out[:, 2] -= low
    out[:, 5] -= low
    extras[:, 2] -= low
    return out, extras


def _rot_y(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def _rot_z(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _whole_body(points: np.ndarray, pose: Pose) -> np.ndarray:
    """Roll, fall and jump applied to local points [N,3]."""
    if pose.dead:
        pivot = np.array([0.0, 0.0, 14.0])
        return (points - pivot) @ _rot_y(-math.pi / 2).T + pivot
    if pose.dodge_t >= 0.0:
        pivot = np.array([0.0, 0.0, 52.0])
        squash = np.array([1.0, 1.0, 0.55])
        return ((points * squash) - pivot) @ _rot_y(2 * math.pi * pose.dodge_t).T + pivot
    return points + np.array([0.0, 0.0, pose.jump_cm])


def body_capsules(
    foot: np.ndarray, heading: float, scale: float, pose: Pose, shape: BodyShape
) -> tuple[np.ndarray, np.ndarray]:
    """World capsules f64 [12,7] and extras f64 [E,4] of an actor at ``foot`` (f64 [3]) facing ``heading``."""
    caps, extras = local_body(pose, shape)
    pts = np.concatenate([caps[:, 0:3], caps[:, 3:6], extras[:, :3]])
    pts = _whole_body(pts, pose)
    pts = (pts * scale) @ _rot_z(heading).T + np.asarray(foot, dtype=np.float64)
    n = NUM_CAPSULES
    out = np.empty((n, CAPSULE_FLOATS))
    out[:, 0:3], out[:, 3:6] = pts[:n], pts[n : 2 * n]
    out[:, 6] = caps[:, 6] * scale
    ex = np.concatenate([pts[2 * n :], extras[:, 3:] * scale], axis=1)
    return out, ex


def actor_pos(foot: np.ndarray, scale: float) -> np.ndarray:
    """UE-style actor location f64 [3]: the body's pivot above the feet."""
    return np.asarray(foot, dtype=np.float64) + np.array([0.0, 0.0, ACTOR_PIVOT_CM * scale])
