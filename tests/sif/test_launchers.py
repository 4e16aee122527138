"""Ranks started by the image's mpirun inside `apptainer exec` see a PATH with /usr/bin first (Open MPI acts as if
given --prefix /usr when started by absolute path): python3 there must still find the venv's packages."""
import json

from support.stack import CONFIG


def test_python3_under_mpirun_in_the_sif_sees_the_venv(user_host, in_sif):
    out = user_host.check_output(
        f"apptainer exec {in_sif} mpirun -np 2 python3 -c "
        "'import json, horovod, tensorflow as tf; print(\"RESULT \" + json.dumps([horovod.__version__, tf.__version__]))'")
    seen = [json.loads(line.partition("RESULT ")[2]) for line in out.splitlines() if "RESULT [" in line]
    assert seen == [[CONFIG.versions["horovod"], CONFIG.versions["tensorflow"]]] * 2
