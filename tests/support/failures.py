"""What a failed multi-rank command's assertion shows: the end of its output, and where the MWMS launcher
(scripts/train/launch_local_mwms.py) named the worker that failed first, that worker's own lines before it. The
others' errors follow from the first failure and come last in the output (they wait for the dead worker until
TensorFlow's coordination service gives up): a tail alone shows them and loses the cause."""
import re

LIMIT = 3000  # characters of each excerpt
LAUNCHER_FAILURE = re.compile(r"^tfhpc: error: worker (\d+) .*$", re.MULTILINE)


def excerpt(stdout, stderr):
    """The failed worker's lines (when the launcher named it), then the end of stdout and of stderr."""
    parts = []
    named = LAUNCHER_FAILURE.search(stderr)
    if named:
        prefix = f"[worker {named.group(1)}] "
        own = "\n".join(line for line in (stdout + "\n" + stderr).splitlines() if line.startswith(prefix))
        parts.append(f"{named.group(0)}\n--- its lines:\n{own[-LIMIT:]}")
    parts.append(f"--- the end of stdout:\n{stdout[-LIMIT:]}\n--- the end of stderr:\n{stderr[-LIMIT:]}")
    return "\n".join(parts)
