"""The SGD lab's matplotlib figure on the host, from trajectories made with numpy (no TensorFlow); matplotlib from the
host venv (requirements.txt). The image test (tests/images/app/test_training.py) checks the lab's own figure."""
import os
import struct
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
import zlib

import numpy as np

from tfhpc import REPO_ROOT
from tfhpc_runtime.plot import colors, draw


def trajectories():
    """Settings as sgd_lab.py makes them, from a small numpy SGD on y = 1.5 x - 0.5 + noise."""
    rng = np.random.default_rng(7)
    x = rng.uniform(0.0, 2.0, 64)
    y = 1.5 * x - 0.5 + rng.normal(scale=0.3, size=64)
    solution = np.linalg.lstsq(np.stack([x, np.ones_like(x)], 1), y, rcond=None)[0]

    def run(start, batch, seed):
        m, n = start
        points, order = [], np.random.default_rng(seed)
        for _ in range(40):
            points.append((m, n, float(np.mean((m * x + n - y) ** 2))))
            i = order.choice(64, batch, replace=False)
            error = m * x[i] + n - y[i]
            m, n = m - 0.2 * np.mean(error * x[i]), n - 0.2 * np.mean(error)
        return points

    start = (-1.0, 2.0)
    settings = [{"label": f"1 worker, SGD batch {b}", "kind": "1-worker", "points": run(start, b, b)}
                for b in (64, 8)]
    settings += [{"label": "Horovod, 2 workers x batch 4", "kind": "horovod", "points": run(start, 8, 1)},
                 {"label": "before Horovod, rank 1 of 2", "kind": "before-horovod", "points": run((2.0, 0.0), 4, 2)},
                 {"label": "broadcast only, rank 1 of 2", "kind": "broadcast-only", "points": run(start, 4, 3)}]
    for setting, colour in zip(settings, colors(len(settings))):
        setting["color"] = colour
    return settings, solution, x, y, start


def test_figure_is_a_png_and_an_svg_naming_every_setting():
    settings, solution, x, y, start = trajectories()
    png, svg = draw(settings, solution, x, y, start, "SGD lab, unit test", 800, 500)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (800, 500)
    position, texts, data = 8, {}, b""
    while position < len(png):
        length, kind = struct.unpack(">I4s", png[position:position + 8])
        body = png[position + 8:position + 8 + length]
        if kind == b"tEXt":
            key, value = body.split(b"\0", 1)
            texts[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"IDAT":
            data += body
        position += 12 + length
    import matplotlib
    assert texts["Software"].startswith(f"Matplotlib version{matplotlib.__version__}")
    assert len(zlib.decompress(data)) == 500 * (1 + 800 * 4)  # RGBA rows, each with its filter byte
    root = ElementTree.fromstring(svg)
    labels = ["".join(e.itertext()) for e in root.iter("{http://www.w3.org/2000/svg}text")]
    for setting in settings:
        assert setting["label"] in labels
    assert any(label.startswith("least-squares minimum (m, n) = (") for label in labels)
    assert {"slope m (units of y per unit of x)", "intercept n (units of y)", "step (parameter updates)",
            "SGD lab, unit test"} <= set(labels)
    assert draw(settings, solution, x, y, start, "SGD lab, unit test", 800, 500)[1] == svg, "SVG is reproducible"


def test_colours_are_distinct_beyond_the_palette():
    for count in (1, 9, 10, 11, 25):
        assert len(set(colors(count))) == count


def test_sgd_lab_refuses_a_figure_too_small_to_read():
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "scripts" / "runtime")}
    result = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "train" / "sgd_lab.py"), "--width", "320"],
                            env=environment, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "--width must be 640 to 4000" in result.stderr
