"""What the site tests share: the configurations of both MPI families and the parsing of doctor reports (RESULT lines:
support.results; tests/sites/conftest.py has the fixtures; docstring there)."""
import json

from support.collectives import smoke_arguments
from support.site_mpi import LIBRARY_VERSIONS
from support.stack import CONFIG, MANIFEST

MPICH_CONFIG = MANIFEST.config(CONFIG.stack, CONFIG.flavor, "mpich")
OPENMPI_CONFIG = MANIFEST.config(CONFIG.stack, CONFIG.flavor, "openmpi")


def _abi_config():
    """The MPI=abi configuration of the same stack and flavour, or None where versions.toml has none (the
    conservative stack, the GPU flavour)."""
    return MANIFEST.config(CONFIG.stack, CONFIG.flavor, "abi") if "abi" in CONFIG.site_test_mpis else None


ABI_CONFIG = _abi_config()
LEAF = MANIFEST.layers.leaf


def doctor_reports(output):
    """The JSON report of every rank that `tfhpc-doctor --json` printed, by rank."""
    reports = [json.loads(line[line.index("{"):]) for line in output.splitlines() if '{"schema_version"' in line]
    return {report["rank"]: report for report in reports}


def check(report, section, name):
    """The doctor's check `section`/`name` of one rank's report."""
    found = [c for c in report["checks"] if c["section"] == section and c["name"] == name]
    assert found, f"no check {section}/{name} in {[(c['section'], c['name']) for c in report['checks']]}"
    return found[0]


# The host MPIs of the MPICH ABI family that the MPICH images take, with how MPI_Get_library_version begins in each;
# Horovod's collectives on them (float16: a user-defined op on a derived datatype in Horovod's MPI path).
HOST_MPIS = {name: LIBRARY_VERSIONS[name] for name in ("mpich", "impi-rt")}
SIZES, DTYPES = (1, 4096), ("float32", "float16", "int32")
SMOKE = f"tfhpc-smoke-collectives {smoke_arguments(SIZES, DTYPES)}"
