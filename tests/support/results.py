"""The one parser of the `RESULT {json}` lines that the smoke tests, training scripts and test programs print, one per
rank. Launchers prefix lines differently (mpirun's "[1,0]<stdout>:", srun's "0: ", none when apptainer or docker
forward them): taking what follows "RESULT " on any line that holds "RESULT {" serves them all. mpirun may also split a
long line of one rank and tag each piece: such a tag inside the payload is dropped (it is never JSON)."""
import json
import re

# Open MPI's output tag, "[job,rank]<stdout>:", as mpirun inserts it where it split a long line of the same rank.
MPIRUN_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")


def results(output, ranks=None):
    """The JSON report of every RESULT line of `output`, sorted by rank.

    ranks: when given, exactly ranks 0 .. ranks-1 must have reported, each once (a missing, extra or duplicated rank
    fails, with the end of the output to show why)."""
    reports = sorted((json.loads(MPIRUN_TAG.sub("", line.partition("RESULT ")[2])) for line in output.splitlines()
                      if "RESULT {" in line),
                     key=lambda report: report["rank"])
    if ranks is not None:
        assert [r["rank"] for r in reports] == list(range(ranks)), f"expected {ranks} ranks to report:\n{output[-3000:]}"
    return reports
