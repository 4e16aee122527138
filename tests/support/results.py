"""The one parser of the `RESULT {json}` lines that the smoke tests, training scripts and test programs print, one per
rank. Launchers prefix lines differently (mpirun's "[1,0]<stdout>:", srun's "0: ", none when apptainer or docker
forward them): taking what follows "RESULT " on any line that holds "RESULT {" serves them all. mpirun may also split a
long line of one rank and tag each piece: such a tag inside the payload is dropped (it is never JSON).

Slurm forwards a task's output in messages of at most 1 KiB, and another task's output may fall between two of them
(srun's own output, a job's output file): a RESULT line longer than that then arrives as its first piece followed by
the other task's text on the same line, and its rest at the start of a later line. Such a line is put together again:
the first later line whose text completes the piece into JSON, the piece cut at the longest length that does (no
longer than a message less "RESULT ": a longer cut would take in the other task's text)."""
import json
import re

# Open MPI's output tag, "[job,rank]<stdout>:", as mpirun inserts it where it split a long line of the same rank.
MPIRUN_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
SRUN_LABEL = re.compile(r"^\d+: ")
SLURM_PIECE = 1024  # bytes of a task's output per message (slurmstepd)


def results(output, ranks=None):
    """The JSON report of every RESULT line of `output`, sorted by rank.

    ranks: when given, exactly ranks 0 .. ranks-1 must have reported, each once (a missing, extra or duplicated rank
    fails, with the end of the output to show why)."""
    lines = output.splitlines()
    reports = sorted((_report(lines, index) for index, line in enumerate(lines) if "RESULT {" in line),
                     key=lambda report: report["rank"])
    if ranks is not None:
        assert [r["rank"] for r in reports] == list(range(ranks)), f"expected {ranks} ranks to report:\n{output[-3000:]}"
    return reports


def _report(lines, index):
    payload = MPIRUN_TAG.sub("", lines[index].partition("RESULT ")[2])
    try:
        return json.loads(payload)
    except json.JSONDecodeError as error:
        joined = _rejoined(payload, lines[index + 1:])
        if joined is None:
            raise AssertionError(f"a RESULT line is not JSON ({error}) and no later line completes it:\n"
                                 f"{lines[index][:3000]}") from error
        return joined


def _rejoined(payload, later):
    """The report that the first piece of `payload` and the text of a later line make together, or None."""
    for line in later:
        rest = SRUN_LABEL.sub("", line)
        if "RESULT {" in rest or not rest.rstrip().endswith("}"):
            continue
        for cut in range(min(len(payload), SLURM_PIECE - len("RESULT ")), 0, -1):
            try:
                return json.loads(payload[:cut] + rest)
            except json.JSONDecodeError:
                continue
    return None
