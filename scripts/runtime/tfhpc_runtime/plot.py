"""A small plotter for the SGD lab (scripts/train/sgd_lab.py): (m, n) trajectories of the 1-D linear model drawn on
a numpy canvas over bands of its loss, written as a PNG with zlib and struct, so that the lab needs no matplotlib.
The lab is the CSCS Piz Daint course's; the picture is a plain line plot without text (the lab's JSON names each
colour)."""
import colorsys
import struct
import zlib

import numpy as np

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf"]


def color(index, count):
    """The colour of setting `index` of `count`: the palette, or evenly spaced hues when there are more settings."""
    if count <= len(PALETTE):
        return PALETTE[index]
    r, g, b = colorsys.hsv_to_rgb(index / count, 0.85, 0.85)
    return "#%02x%02x%02x" % (round(r * 255), round(g * 255), round(b * 255))


def rgb(hex_color):
    return tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))


def plot(settings, solution, x, y, width, height):
    """PNG bytes: each setting's (m, n) points as a line in its colour (a square at the start, a disc at the end)
    over log-spaced bands of the mean squared error of y = m*x + n, the least-squares `solution` as a black cross."""
    margin = 40
    points = np.concatenate([np.array(s["points"])[:, :2] for s in settings] + [solution[None]])
    low, high = points.min(0), points.max(0)
    pad = (high - low) * 0.06 + 1e-9
    low, high = low - pad, high + pad

    def to_pixel(m, n):
        px = margin + (m - low[0]) / (high[0] - low[0]) * (width - 2 * margin)
        py = height - margin - (n - low[1]) / (high[1] - low[1]) * (height - 2 * margin)
        return px, py

    canvas = np.full((height, width, 3), 255, np.uint8)
    # Loss levels as light grey bands (log-spaced), inside the frame.
    mm = np.linspace(low[0], high[0], width - 2 * margin)
    nn = np.linspace(high[1], low[1], height - 2 * margin)
    grid_m, grid_n = np.meshgrid(mm, nn)
    sx, sx2, sy, sxy, sy2 = x.mean(), (x * x).mean(), y.mean(), (x * y).mean(), (y * y).mean()
    loss = grid_m ** 2 * sx2 + grid_n ** 2 + sy2 + 2 * grid_m * grid_n * sx - 2 * grid_m * sxy - 2 * grid_n * sy
    band = np.floor(np.log(np.maximum(loss, 1e-12)) * 2.0).astype(int) % 2
    canvas[margin:height - margin, margin:width - margin] = np.where(band[..., None] == 1, 238, 250)
    # Frame and ticks.
    canvas[margin, margin:width - margin + 1] = 0
    canvas[height - margin, margin:width - margin + 1] = 0
    canvas[margin:height - margin + 1, margin] = 0
    canvas[margin:height - margin + 1, width - margin] = 0
    for i in range(11):
        tx = margin + i * (width - 2 * margin) // 10
        ty = margin + i * (height - 2 * margin) // 10
        canvas[height - margin:height - margin + 6, tx] = 0
        canvas[ty, margin - 6:margin] = 0
    # Trajectories, then their start (square) and end (disc) markers.
    for setting in settings:
        colour = rgb(setting["color"])
        pixels = [to_pixel(m, n) for m, n, _ in setting["points"]]
        for (x0, y0), (x1, y1) in zip(pixels, pixels[1:]):
            line(canvas, x0, y0, x1, y1, colour)
        (x0, y0), (x1, y1) = pixels[0], pixels[-1]
        canvas[clip_range(y0 - 4, y0 + 5, height), clip_range(x0 - 4, x0 + 5, width)] = colour
        disc(canvas, x1, y1, 5, colour)
    cx, cy = to_pixel(*solution)
    for d in range(-8, 9):  # the least-squares solution: a black cross
        for t in (-1, 0, 1):
            put(canvas, cx + d, cy + t, (0, 0, 0))
            put(canvas, cx + t, cy + d, (0, 0, 0))
    return png(canvas)


def clip_range(a, b, limit):
    return slice(int(max(0, min(limit, round(a)))), int(max(0, min(limit, round(b)))))


def put(canvas, px, py, colour):
    ix, iy = int(round(px)), int(round(py))
    if 0 <= iy < canvas.shape[0] and 0 <= ix < canvas.shape[1]:
        canvas[iy, ix] = colour


def line(canvas, x0, y0, x1, y1, colour):
    steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    for t in np.linspace(0.0, 1.0, steps + 1):
        px, py = x0 + (x1 - x0) * t, y0 + (y1 - y0) * t
        for dx, dy in ((0, 0), (1, 0), (0, 1), (1, 1)):  # 2-pixel brush
            put(canvas, px + dx, py + dy, colour)


def disc(canvas, cx, cy, radius, colour):
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            if dx * dx + dy * dy <= radius * radius:
                put(canvas, cx + dx, cy + dy, colour)


def png(canvas):
    """8-bit RGB PNG: signature, IHDR, one zlib-compressed IDAT (filter 0 on every row), IEND."""
    height, width, _ = canvas.shape
    raw = b"".join(b"\x00" + canvas[row].tobytes() for row in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
