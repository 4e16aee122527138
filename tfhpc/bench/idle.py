"""Is the machine idle enough to benchmark? `make bench` looks before it measures: the load average and the other
containers. A busy machine is waited for (up to --wait seconds), then refused with one line, unless the caller insists
(INSIST=1 marks every figure of the run as taken on a busy machine). The quick run inside `make test` never waits:
its figures check that the benchmark works, not how fast the images are.

`busy_reasons` is pure (unit-tested in tests/unit/test_bench.py); `machine_state` reads the host.
"""
from __future__ import annotations

import os
import subprocess
import time

from ..common import UserError
from ..dockerhost import client

# An idle Linux host with dockerd running shows a 1-minute load of 0.0-0.3; a docker build, a test run or another
# benchmark keeps it near the number of cores. The 1-minute average decays by 1/e per minute, so a machine that has
# just gone quiet passes within 1-3 minutes of waiting.
IDLE_LOAD_PER_CORE = 0.25
POLL_SECONDS = 15


def machine_state(exclude_prefix: str = "tfhpc-bench-") -> dict:
    """Load average, the running containers not started by the benchmark and the busiest processes of the host
    (a docker build shows as processes, not as a container)."""
    others = [f"{c.name} ({c.image.tags[0] if c.image.tags else c.image.short_id})"
              for c in client().containers.list() if not c.name.startswith(exclude_prefix)]
    try:
        top = subprocess.run(["ps", "-eo", "pcpu=,comm=", "--sort=-pcpu"], capture_output=True, text=True,
                             timeout=30).stdout.splitlines()[:6]
    except (OSError, subprocess.TimeoutExpired):
        top = []
    return {"loadavg": list(os.getloadavg()), "other_containers": others,
            "busiest_processes": [" ".join(t.split()) for t in top]}


def busy_reasons(state: dict, cpus: int) -> list[str]:
    """Why `state` is not idle on a machine of `cpus` cores (empty: idle)."""
    reasons = []
    limit = IDLE_LOAD_PER_CORE * cpus
    if state["loadavg"][0] > limit:
        reasons.append(f"load {state['loadavg'][0]:.2f} > {limit:.2f}")
    if state["other_containers"]:
        reasons.append(f"containers running: {', '.join(state['other_containers'])}")
    return reasons


def wait_until_idle(max_wait: float, insist: bool, quick: bool, log, state=machine_state, sleep=time.sleep,
                    clock=time.monotonic, cpus: int | None = None) -> dict:
    """Poll until the machine is idle or `max_wait` seconds have passed. Returns the record results.json keeps:
    idle (bool), waited_seconds, reasons, insisted, state. Raises BusyMachine when still busy, unless `insist`
    or `quick`."""
    cpus = cpus or os.cpu_count() or 1
    started = clock()
    current = state()
    reasons = busy_reasons(current, cpus)
    while reasons and not quick and clock() - started < max_wait:
        log(f"bench: waiting for an idle machine ({'; '.join(reasons)}), "
            f"{max_wait - (clock() - started):.0f} s left")
        sleep(POLL_SECONDS)
        current = state()
        reasons = busy_reasons(current, cpus)
    record = {"idle": not reasons, "waited_seconds": round(clock() - started, 1), "reasons": reasons,
              "insisted": bool(reasons) and (insist or quick), "state": current}
    if reasons and not (insist or quick):
        raise BusyMachine(f"the machine is busy after {record['waited_seconds']:.0f} s of waiting "
                          f"({'; '.join(reasons)}): stop what runs, or `make bench INSIST=1` to measure anyway "
                          "(the results then say they were taken on a busy machine)")
    return record


class BusyMachine(UserError):
    """The machine did not become idle; the message is the one line `make bench` prints (exit status 2)."""
