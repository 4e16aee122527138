"""The SGD lab's figure (scripts/train/sgd_lab.py), drawn with matplotlib: on the left the (m, n) trajectories of the
1-D linear model y = m*x + n over contour lines of its loss, on the right each trajectory's loss per step; one
colour per setting, named in a legend shared by both panels, and the least-squares minimum marked in both. Written as
PNG (Agg) and SVG (text kept as text, so that the labels can be searched and edited).

matplotlib is imported when a figure is drawn, not with this module: the lab checks its arguments first.
"""
import io

import numpy as np

LAYOUT_INCHES = (12, 7)  # the figure is laid out at least this large, then rendered at width x height pixels
# Line style per kind of setting (sgd_lab.py's "kind"): the 1-worker runs and Horovod solid, Horovod thicker; the
# runs without averaged gradients dotted (own start) or dashed (broadcast start).
STYLES = {"1-worker": ("-", 1.4), "horovod": ("-", 3.0), "before-horovod": (":", 1.6), "broadcast-only": ("--", 1.4)}


def colors(count):
    """One distinct colour per setting, as "#rrggbb": matplotlib's "tab10" cycle, or evenly spaced hues of its "hsv"
    map when there are more than 10 settings."""
    from matplotlib import colormaps  # here: the lab checks its arguments before matplotlib loads
    from matplotlib.colors import to_hex  # here: the lab checks its arguments before matplotlib loads
    if count <= 10:
        return [to_hex(colormaps["tab10"](index)) for index in range(count)]
    return [to_hex(colormaps["hsv"](index / count)) for index in range(count)]


def loss_grid(x, y, m, n):
    """Mean squared error of y = m*x + n over the data (x, y), for arrays m and n of the same shape."""
    sx, sx2, sy, sxy, sy2 = x.mean(), (x * x).mean(), y.mean(), (x * y).mean(), (y * y).mean()
    return m ** 2 * sx2 + n ** 2 + sy2 + 2 * m * n * sx - 2 * m * sxy - 2 * n * sy


def draw(settings, solution, x, y, start, title, width, height):
    """(PNG bytes, SVG bytes) of the lab's figure, width x height pixels. settings: dicts with "label", "kind",
    "color" and "points" [(m, n, loss), ...]; solution: the least-squares (m, n); start: the common initial (m, n)."""
    import matplotlib  # here: the lab checks its arguments before matplotlib loads
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # here: the lab checks its arguments before matplotlib loads
    from matplotlib.figure import Figure  # here: the lab checks its arguments before matplotlib loads

    # A Figure without pyplot: no GUI backend and no global state; its canvas is Agg (PNG), and savefig switches to
    # the SVG backend for the SVG (matplotlib's "Embedding in a web application server" pattern). The resolution
    # follows the size asked for, so that a smaller figure is the same figure scaled down, not a cramped one.
    dpi = max(1, round(min(width / LAYOUT_INCHES[0], height / LAYOUT_INCHES[1])))
    figure = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    paths, losses = figure.subplots(1, 2)
    minimum = float(loss_grid(x, y, *solution))

    points = np.concatenate([np.array(s["points"])[:, :2] for s in settings] + [np.array([solution])])
    low, high = points.min(0), points.max(0)
    pad = (high - low) * 0.06 + 1e-9
    low, high = low - pad, high + pad
    grid_m, grid_n = np.meshgrid(np.linspace(low[0], high[0], 300), np.linspace(low[1], high[1], 300))
    grid = loss_grid(x, y, grid_m, grid_n)
    levels = np.geomspace(minimum * 1.05, grid.max(), 9)  # log-spaced: the valley's floor and its walls alike
    contours = paths.contour(grid_m, grid_n, grid, levels=levels, colors="0.7", linewidths=0.8)
    paths.clabel(contours, fmt="%.2g", fontsize=7)

    for setting in settings:
        style, width_ = STYLES.get(setting.get("kind"), ("-", 1.4))
        track = np.array(setting["points"])
        paths.plot(track[:, 0], track[:, 1], linestyle=style, linewidth=width_, color=setting["color"],
                   label=setting["label"])
        paths.plot(track[-1, 0], track[-1, 1], "o", markersize=4, color=setting["color"])
        losses.plot(np.arange(len(track)), track[:, 2], linestyle=style, linewidth=width_, color=setting["color"])
    paths.plot(*start, "s", color="black", markersize=7, label=f"common start (m, n) = ({start[0]:g}, {start[1]:g})")
    paths.plot(*solution, "*", color="black", markersize=15, markerfacecolor="gold",
               label=f"least-squares minimum (m, n) = ({solution[0]:.3f}, {solution[1]:.3f})")
    losses.axhline(minimum, color="black", linestyle="--", linewidth=1,
                   label=f"minimum loss {minimum:.4f} (least squares)")

    paths.set(xlabel="slope m (units of y per unit of x)", ylabel="intercept n (units of y)",
              title="trajectories of (m, n) over loss contours", xlim=(low[0], high[0]), ylim=(low[1], high[1]))
    losses.set(xlabel="step (parameter updates)", ylabel="loss: mean squared error (units of y squared)",
               title="loss on all samples after each step", yscale="log")
    losses.grid(True, which="both", linewidth=0.3, alpha=0.5)
    figure.suptitle(title)
    handles, labels = paths.get_legend_handles_labels()
    more_handles, more_labels = losses.get_legend_handles_labels()
    figure.legend(handles + more_handles, labels + more_labels, loc="outside lower center", ncols=3,
                  fontsize="small")

    png, svg = io.BytesIO(), io.BytesIO()
    figure.savefig(png, format="png", dpi=dpi)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "tfhpc"}):  # text as <text>; stable ids
        figure.savefig(svg, format="svg", metadata={"Date": None})
    return png.getvalue(), svg.getvalue()
