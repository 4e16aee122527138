"""scripts/doctor.py loaded as a module on the host (a script, not a package member), for unit tests of its checks."""
import importlib.util

from tfhpc import REPO_ROOT


def load_doctor(name="doctor_checks"):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / "doctor.py")
    doctor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doctor)
    return doctor
