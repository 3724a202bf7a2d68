"""Code-world cameras: pose → world_to_view / projection / world_to_clip (raw_layout conventions).

World: cm, z up, right-handed. View space: x right, y up, z = depth forward (UE's view space).
Projections are reverse-Z like UE's: perspective with an infinite far plane (ndc_z = near / depth)
and orthographic with ndc_z = (far − depth) / (far − near). ``fov_x_deg`` / ``ortho_width_cm`` are
horizontal over the full source frame. A camera aimed at a point puts it at NDC (0, 0) — the source
centre ((W−1)/2, (H−1)/2), which the symmetric crop + resize maps to the destination centre.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NEAR_CM = 10.0
ORTHO_FAR_CM = 200_000.0
UE_DEFAULT_FOV_DEG = 90.0
UE_DEFAULT_ORTHO_WIDTH_CM = 512.0


@dataclass(frozen=True)
class CameraVariant:
    """A third-person rig: distance behind the aim point, pitch (negative looks down), lens."""

    name: str
    distance_cm: float
    pitch_deg: float
    fov_x_deg: float = UE_DEFAULT_FOV_DEG
    orthographic: bool = False
    ortho_width_cm: float = UE_DEFAULT_ORTHO_WIDTH_CM
    yaw_follow: float = 0.18  # fraction of the yaw error corrected per frame


CAMERA_VARIANTS: dict[str, CameraVariant] = {
    v.name: v
    for v in (
        CameraVariant("tp_default", 430.0, -14.0, fov_x_deg=90.0),
        CameraVariant("tp_high", 640.0, -30.0, fov_x_deg=75.0),
        CameraVariant("tp_wide", 360.0, -9.0, fov_x_deg=100.0),
        CameraVariant("ortho_iso", 4000.0, -55.0, orthographic=True, ortho_width_cm=1600.0, yaw_follow=0.08),
    )
}


@dataclass(frozen=True)
class CameraPose:
    """Eye position (cm), yaw (rad, 0 = +x, counter-clockwise) and pitch (rad, negative = down)."""

    eye: tuple[float, float, float]
    yaw: float
    pitch: float
    variant: CameraVariant

    @property
    def forward(self) -> np.ndarray:
        cp = math.cos(self.pitch)
        return np.array([cp * math.cos(self.yaw), cp * math.sin(self.yaw), math.sin(self.pitch)])

    @property
    def right(self) -> np.ndarray:
        return np.array([math.sin(self.yaw), -math.cos(self.yaw), 0.0])

    @property
    def up(self) -> np.ndarray:
        return np.cross(self.right, self.forward)


def aimed_pose(aim: np.ndarray, yaw: float, variant: CameraVariant) -> CameraPose:
    """The pose ``variant.distance_cm`` behind ``aim`` (f64 [3]) looking at it."""
    pitch = math.radians(variant.pitch_deg)
    cp = math.cos(pitch)
    fwd = np.array([cp * math.cos(yaw), cp * math.sin(yaw), math.sin(pitch)])
    eye = np.asarray(aim, dtype=np.float64) - variant.distance_cm * fwd
    return CameraPose((float(eye[0]), float(eye[1]), float(eye[2])), yaw, pitch, variant)


def world_to_view(pose: CameraPose) -> np.ndarray:
    """f64 [4,4]: rows right, up, forward (each · (p − eye))."""
    eye = np.asarray(pose.eye, dtype=np.float64)
    m = np.eye(4)
    for row, axis in enumerate((pose.right, pose.up, pose.forward)):
        m[row, :3] = axis
        m[row, 3] = -axis @ eye
    return m


def projection(pose: CameraPose, width: int, height: int) -> np.ndarray:
    """f64 [4,4] view → clip for a source frame of width × height."""
    v = pose.variant
    p = np.zeros((4, 4))
    if v.orthographic:
        ow = v.ortho_width_cm
        oh = ow * height / width
        p[0, 0], p[1, 1] = 2.0 / ow, 2.0 / oh
        p[2, 2] = -1.0 / (ORTHO_FAR_CM - NEAR_CM)
        p[2, 3] = ORTHO_FAR_CM / (ORTHO_FAR_CM - NEAR_CM)
        p[3, 3] = 1.0
    else:
        sx = 1.0 / math.tan(math.radians(v.fov_x_deg) / 2.0)
        p[0, 0], p[1, 1] = sx, sx * width / height
        p[2, 3] = NEAR_CM
        p[3, 2] = 1.0
    return p


@dataclass(frozen=True)
class CameraMatrices:
    """Everything frame.json stores about a camera; matrices f64 [4,4]."""

    world_to_view: np.ndarray
    projection: np.ndarray
    world_to_clip: np.ndarray
    orthographic: bool
    fov_x_deg: float
    ortho_width_cm: float


def camera_matrices(pose: CameraPose, width: int, height: int) -> CameraMatrices:
    """Matrices of a pose. The unused lens field holds UE's default (90° or 512 cm)."""
    w2v = world_to_view(pose)
    proj = projection(pose, width, height)
    v = pose.variant
    return CameraMatrices(
        world_to_view=w2v,
        projection=proj,
        world_to_clip=proj @ w2v,
        orthographic=v.orthographic,
        fov_x_deg=UE_DEFAULT_FOV_DEG if v.orthographic else v.fov_x_deg,
        ortho_width_cm=v.ortho_width_cm if v.orthographic else UE_DEFAULT_ORTHO_WIDTH_CM,
    )
