"""The built-in ``demo`` data set: 10 classes of procedurally drawn 32x32 RGB images, offline and
deterministic, so that the daemon, the simulation and the tests can train without any download.

Each class is a shape or texture (disk, square, ring, plus, horizontal / vertical / diagonal stripes,
checkerboard, triangle, X) drawn at a random position, size and phase, in random foreground and
a random background colour, plus Gaussian pixel noise. The foreground colour is a per-class palette
colour under strong jitter: a weak cue a model picks up within an epoch, while high accuracy needs the
shapes; small, low-contrast or noisy samples keep the set from being trivially solved.
"""

from __future__ import annotations

import numpy as np

DEMO_SEED = 20220717
DEMO_TRAIN_PER_CLASS = 600
DEMO_TEST_PER_CLASS = 100
DEMO_SIZE = 32
DEMO_CLASSES = (
    "disk", "square", "ring", "plus", "h-stripes", "v-stripes", "diagonal-stripes", "checkerboard",
    "triangle", "x-cross",
)  # fmt: skip
_NOISE_STD = 20.0  # in 0..255 units
_COLOUR_JITTER = 55.0  # std of the foreground colour around its class's palette colour
_MIN_CONTRAST = 60.0  # smallest foreground-background distance in RGB units
_PALETTE = np.array(
    [[230, 60, 60], [60, 200, 60], [60, 90, 230], [230, 210, 50], [200, 60, 210],
     [50, 210, 210], [240, 140, 40], [140, 140, 140], [250, 250, 250], [20, 20, 20]],
    dtype=np.float32,
)  # fmt: skip


def _shape_masks(cls: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Foreground coverage in [0, 1], float32 [n, 32, 32], of ``n`` random instances of class ``cls``."""
    coords = np.arange(DEMO_SIZE, dtype=np.float32) + 0.5
    yy, xx = coords[None, :, None], coords[None, None, :]
    cx = rng.uniform(9.0, 23.0, size=(n, 1, 1)).astype(np.float32)
    cy = rng.uniform(9.0, 23.0, size=(n, 1, 1)).astype(np.float32)
    s = rng.uniform(4.5, 9.5, size=(n, 1, 1)).astype(np.float32)  # half-size of the shape
    period = rng.uniform(4.0, 8.0, size=(n, 1, 1)).astype(np.float32)
    phase = rng.uniform(0.0, 2 * np.pi, size=(n, 1, 1)).astype(np.float32)
    tilt = np.deg2rad(rng.uniform(-12.0, 12.0, size=(n, 1, 1))).astype(np.float32)
    dx, dy = xx - cx, yy - cy
    # Rotate the local frame a little so stripes and crosses are not pixel-aligned templates.
    rx = dx * np.cos(tilt) + dy * np.sin(tilt)
    ry = -dx * np.sin(tilt) + dy * np.cos(tilt)
    dist = np.sqrt(dx**2 + dy**2)
    w = 1.6  # stroke half-width
    sd: np.ndarray  # signed distance to the shape's edge, negative inside, [n, 32, 32]
    if cls == 0:  # disk
        sd = dist - s
    elif cls == 1:  # square
        sd = np.maximum(np.abs(rx), np.abs(ry)) - 0.85 * s
    elif cls == 2:  # ring
        sd = np.abs(dist - s) - w
    elif cls == 3:  # plus
        sd = np.minimum(np.maximum(np.abs(rx) - w, np.abs(ry) - s), np.maximum(np.abs(ry) - w, np.abs(rx) - s))
    elif cls in (4, 5, 6, 7):  # textures over a window around the centre
        k = 2 * np.pi / period
        if cls == 4:
            wave = np.sin(k * ry + phase)
        elif cls == 5:
            wave = np.sin(k * rx + phase)
        elif cls == 6:
            wave = np.sin(k * (rx + ry) / np.sqrt(2) + phase)
        else:
            wave = np.sin(k * rx + phase) * np.sin(k * ry + phase)
        window = np.maximum(np.abs(dx), np.abs(dy)) - 1.6 * s
        sd = np.maximum(-wave * period / 4, window)
    elif cls == 8:  # triangle pointing up: inside when below the two slanted edges and above the base
        sd = np.maximum(ry - 0.8 * s, np.abs(rx) * 1.8 - (ry + s) * 0.9)
    else:  # X
        d1 = np.abs(rx - ry) / np.sqrt(2)
        d2 = np.abs(rx + ry) / np.sqrt(2)
        sd = np.maximum(np.minimum(d1, d2) - w, np.maximum(np.abs(rx), np.abs(ry)) - s)
    return np.clip(0.5 - sd, 0.0, 1.0)  # anti-aliased edge one pixel wide


def _draw(n_per_class: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for cls in range(len(DEMO_CLASSES)):
        mask = _shape_masks(cls, n_per_class, rng)[:, None]  # [n, 1, H, W]
        bg = rng.uniform(0, 255, size=(n_per_class, 3, 1, 1)).astype(np.float32)
        # Foreground: the class's palette colour, blurred by strong jitter, pushed away from the background
        # when they come out too close (a weak colour cue; the shape is the strong one).
        fg = _PALETTE[cls].reshape(1, 3, 1, 1) + rng.normal(0.0, _COLOUR_JITTER, size=(n_per_class, 3, 1, 1))
        fg = np.clip(fg, 0, 255).astype(np.float32)
        gap = fg - bg
        dist = np.linalg.norm(gap, axis=1, keepdims=True)
        too_close = dist < _MIN_CONTRAST
        fg = np.where(too_close, np.clip(bg + gap / (dist + 1e-3) * _MIN_CONTRAST, 0, 255), fg)
        img = bg + (fg - bg) * mask
        img += rng.normal(0.0, _NOISE_STD, size=img.shape).astype(np.float32)
        xs.append(np.clip(np.rint(img), 0, 255).astype(np.uint8))
        ys.append(np.full(n_per_class, cls, dtype=np.int64))
    x, y = np.concatenate(xs), np.concatenate(ys)
    order = rng.permutation(len(y))
    return x[order], y[order]


def make_demo(seed: int = DEMO_SEED) -> dict[str, object]:
    """Arrays of the demo set (6,000 train / 1,000 test, uint8 NCHW), the same for the same ``seed``."""
    rng = np.random.default_rng(seed)
    train_x, train_y = _draw(DEMO_TRAIN_PER_CLASS, rng)
    test_x, test_y = _draw(DEMO_TEST_PER_CLASS, rng)
    return {
        "train_x": train_x,
        "train_y": train_y,
        "test_x": test_x,
        "test_y": test_y,
        "class_names": DEMO_CLASSES,
    }
