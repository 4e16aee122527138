#!/usr/bin/env python3
"""The SGD lab of the CSCS Piz Daint course: a 1-D linear model y = m*x + n fitted by minimising the mean squared
error, and the trajectories of (m, n) that gradient descent takes for several batch sizes and with 1 or N Horovod
workers.

Settings, one trajectory each (same start, same learning rate unless stated):
  * 1 worker, one per --batch-sizes entry: full-batch gradient descent down to batch 1 (noisier, more steps);
  * Horovod, N workers x --hvd-batch: initial state broadcast, gradients averaged (DistributedGradientTape); one
    trajectory shared by all ranks, equal to 1 worker with batch N x --hvd-batch on the same samples (checked);
  * before Horovod, per rank: every rank starts from its own random point and descends on its own samples alone;
  * broadcast only, per rank: the same start for all, but without averaged gradients the ranks drift apart.

    horovodrun -np 2 python sgd_lab.py --out-dir sgd-lab
    python sgd_lab.py                 # 1 worker: the batch-size settings only

Rank 0 writes <out-dir>/sgd_trajectories.{json,csv,png,svg}: the figure (matplotlib) shows the trajectories over
contour lines of the loss and the loss per step, one colour per setting named in its legend, the least-squares
minimum marked. Every rank prints one "RESULT {json}" line.
"""
import csv
import io
import json
import sys

import numpy as np

from tfhpc_runtime.cli import Parser, report
from tfhpc_runtime.errors import fail
from tfhpc_runtime.files import atomic_write_bytes
from tfhpc_runtime.metrics import configure_threads
from tfhpc_runtime.model import LR_SCALING, scaled_lr
from tfhpc_runtime.plot import colors, draw

MIN_WIDTH, MIN_HEIGHT = 640, 400  # PNG size in pixels below which the figure's text is too small to read


def main():
    parser = Parser(__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=256, help="points in the data set")
    parser.add_argument("--true-m", type=float, default=1.5, help="slope of the line the data come from")
    parser.add_argument("--true-n", type=float, default=-0.5, help="intercept of the line the data come from")
    parser.add_argument("--noise", type=float, default=0.3, help="standard deviation of the noise on y")
    parser.add_argument("--start", default="-1.0,2.0", help="initial (m, n)")
    parser.add_argument("--batch-sizes", default="256,32,8,1", help="batch sizes of the 1-worker settings")
    parser.add_argument("--hvd-batch", type=int, default=8, help="per-worker batch of the Horovod settings")
    parser.add_argument("--steps", type=int, default=150,
                        help="updates per setting (the same for all: small batches make noisier, not more, steps)")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate of one worker")
    parser.add_argument("--lr-scaling", default="none", choices=LR_SCALING,
                        help="learning rate of the Horovod setting (global batch N x --hvd-batch)")
    parser.add_argument("--seed", type=int, default=1234, help="data, shuffling and the per-rank random starts")
    parser.add_argument("--out-dir", default="sgd-lab", help="where rank 0 writes the JSON, CSV, PNG and SVG")
    parser.add_argument("--width", type=int, default=1200, help="PNG width in pixels")
    parser.add_argument("--height", type=int, default=700, help="PNG height in pixels")
    args = parser.parse_args()
    batch_sizes = parse_sizes(args.batch_sizes)
    start = parse_start(args.start)
    if args.samples < 2 or args.steps < 1 or args.lr <= 0:
        fail("--samples must be at least 2, --steps at least 1 and --lr positive")
    if max(batch_sizes) > args.samples:
        fail(f"--batch-sizes {max(batch_sizes)} exceeds --samples {args.samples}: use batches up to the "
             f"number of samples")
    if not (MIN_WIDTH <= args.width <= 4000 and MIN_HEIGHT <= args.height <= 4000):
        fail(f"--width must be {MIN_WIDTH} to 4000 and --height {MIN_HEIGHT} to 4000 pixels (smaller, the figure's "
             f"text cannot be read)")
    if args.hvd_batch < 1:
        fail(f"--hvd-batch must be at least 1, got {args.hvd_batch}")

    import tensorflow as tf
    import horovod.tensorflow as hvd

    hvd.init()  # Horovod: join the job.
    rank, size = hvd.rank(), hvd.size()
    configure_threads(tf, 0, hvd.local_size())
    if size * args.hvd_batch > args.samples:
        fail(f"{size} workers x --hvd-batch {args.hvd_batch} exceed --samples {args.samples}: lower "
             f"--hvd-batch")
    rng = np.random.default_rng(args.seed)
    x = rng.uniform(0.0, 2.0, args.samples)  # x > 0 correlates m and n: a long, narrow valley
    y = args.true_m * x + args.true_n + rng.normal(scale=args.noise, size=args.samples)
    solution = np.linalg.lstsq(np.stack([x, np.ones_like(x)], 1), y, rcond=None)[0]

    def loss_of(m, n):
        return float(np.mean((m * x + n - y) ** 2))

    def run(initial, batch, lr, streams=None, average=False):
        """SGD from `initial`; each step uses the batch given by `streams` (this rank's index batches) or a
        global shuffle. average=True allreduces the gradients (Horovod)."""
        m = tf.Variable(initial[0], dtype=tf.float64)
        n = tf.Variable(initial[1], dtype=tf.float64)
        points = [(float(m.numpy()), float(n.numpy()), loss_of(*initial))]
        for indices in streams if streams is not None else batches(args.samples, batch, args.steps, args.seed):
            bx, by = tf.constant(x[indices]), tf.constant(y[indices])
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(m * bx + n - by))
            if average:
                tape = hvd.DistributedGradientTape(tape)  # Horovod: gradients averaged over the workers.
            dm, dn = tape.gradient(loss, [m, n])
            m.assign_sub(lr * dm)
            n.assign_sub(lr * dn)
            points.append((float(m.numpy()), float(n.numpy()), loss_of(float(m.numpy()), float(n.numpy()))))
        return points

    settings = []
    if rank == 0:
        for batch in batch_sizes:
            name = "gradient descent" if batch == args.samples else f"SGD batch {batch}"
            settings.append({"label": f"1 worker, {name}", "kind": "1-worker", "workers": 1, "batch": batch,
                             "rank": None, "points": run(start, batch, args.lr)})

    hvd_lr = scaled_lr(args.lr, size, args.lr_scaling)
    global_batch = size * args.hvd_batch
    mine = [b[rank * args.hvd_batch:(rank + 1) * args.hvd_batch]  # rank r's slice of every global batch
            for b in batches(args.samples, global_batch, args.steps, args.seed)]
    own_start = np.random.default_rng(args.seed + 1000 + rank).uniform([-2.0, -1.0], [3.0, 3.0])
    horovod = run(start, args.hvd_batch, hvd_lr, streams=mine, average=True)  # Horovod: broadcast + allreduce
    alone = run(tuple(own_start), args.hvd_batch, args.lr, streams=mine)  # neither broadcast nor allreduce
    # Horovod: rank 0's start everywhere (here it is `start` on every rank already; the broadcast makes it so
    # whatever each rank drew).
    bcast_start = hvd.broadcast(tf.constant(own_start if rank else np.array(start)), root_rank=0).numpy()
    bcast_only = run(tuple(bcast_start), args.hvd_batch, args.lr, streams=mine)
    everyone = hvd.allgather_object({"rank": rank, "horovod": horovod, "alone": alone, "bcast": bcast_only})
    reference = run(start, global_batch, hvd_lr) if rank == 0 else None  # 1 worker, the same global batches

    result = {"rank": rank, "size": size, "script": "sgd_lab", "final_horovod": horovod[-1], "files": [],
              "failures": []}
    if rank == 0:
        identical = max(np.abs(np.array(p["horovod"]) - np.array(horovod)).max() for p in everyone)
        equivalence = float(np.abs(np.array(reference) - np.array(horovod)).max())
        if size > 1:
            settings.append({"label": f"Horovod, {size} workers x batch {args.hvd_batch}", "kind": "horovod",
                             "workers": size, "batch": args.hvd_batch, "rank": None, "points": horovod})
            for key, what, kind in (("alone", "before Horovod", "before-horovod"),
                                    ("bcast", "broadcast only", "broadcast-only")):
                for peer in everyone:
                    settings.append({"label": f"{what}, rank {peer['rank']} of {size}", "kind": kind,
                                     "workers": size, "batch": args.hvd_batch, "rank": peer["rank"],
                                     "points": peer[key]})
        for setting, colour in zip(settings, colors(len(settings))):
            setting["color"] = colour
        workers = f" vs Horovod, {size} workers x batch {args.hvd_batch}" if size > 1 else ""
        title = (f"SGD on y = m*x + n ({args.samples} samples, {args.steps} steps, learning rate {args.lr:g}): "
                 f"batch sizes on 1 worker{workers}")
        png, svg = draw(settings, solution, x, y, start, title, args.width, args.height)
        document = {"model": "y = m*x + n", "loss": "mean squared error", "samples": args.samples,
                    "true": [args.true_m, args.true_n], "least_squares": solution.tolist(), "lr": args.lr,
                    "hvd_lr": hvd_lr, "steps": args.steps, "start": list(start), "png": [args.width, args.height],
                    "title": title,
                    "settings": [{k: v for k, v in s.items()} for s in settings],
                    "checks": {"horovod_identical_on_all_ranks": float(identical),
                               "horovod_vs_1_worker_global_batch": equivalence}}
        rows = io.StringIO()
        writer = csv.writer(rows, lineterminator="\n")
        writer.writerow(["setting", "color", "step", "m", "n", "loss"])
        for setting in settings:
            for step, (m, n, loss) in enumerate(setting["points"]):
                writer.writerow([setting["label"], setting["color"], step, f"{m:.10g}", f"{n:.10g}", f"{loss:.10g}"])
        for name, data in (("sgd_trajectories.json", json.dumps(document, indent=1).encode()),
                           ("sgd_trajectories.csv", rows.getvalue().encode()), ("sgd_trajectories.png", png),
                           ("sgd_trajectories.svg", svg)):
            atomic_write_bytes(f"{args.out_dir}/{name}", data)  # rank 0 only, atomically
            result["files"].append(f"{args.out_dir}/{name}")
        for setting in settings:
            print(f"{setting['color']}  {setting['label']:<40} final m={setting['points'][-1][0]:+.4f} "
                  f"n={setting['points'][-1][1]:+.4f} loss={setting['points'][-1][2]:.4f} "
                  f"({len(setting['points']) - 1} steps)", flush=True)
        print(f"least squares: m={solution[0]:+.4f} n={solution[1]:+.4f}; Horovod = 1 worker with batch "
              f"{global_batch} to {equivalence:.1e}", flush=True)
        result.update({"settings": [s["label"] for s in settings], "colors": [s["color"] for s in settings],
                       "final": {s["label"]: s["points"][-1] for s in settings},
                       "steps": {s["label"]: len(s["points"]) - 1 for s in settings},
                       "least_squares": solution.tolist(), "horovod_identical_on_all_ranks": float(identical),
                       "horovod_vs_1_worker_global_batch": equivalence})
        if identical != 0.0:
            result["failures"].append(f"Horovod trajectories differ across ranks by {identical}")
    report(result)
    return 1 if result["failures"] else 0


def batches(samples, batch, steps, seed):
    """`steps` index batches: every epoch a permutation fixed by (seed, epoch), cut into full batches."""
    epoch = 0
    while True:
        order = np.random.default_rng(seed * 1000 + epoch).permutation(samples)
        for start in range(0, samples - batch + 1, batch):
            if steps == 0:
                return
            steps -= 1
            yield order[start:start + batch]
        epoch += 1


def parse_sizes(text):
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        fail(f"--batch-sizes {text!r} must be positive integers separated by commas, e.g. 256,32,8,1")
    return sizes


def parse_start(text):
    try:
        m, n = (float(v) for v in text.split(","))
        return m, n
    except ValueError:
        fail(f"--start {text!r} must be two numbers m,n, e.g. -1,2")


if __name__ == "__main__":
    sys.exit(main())
