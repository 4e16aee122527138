"""The versions of the image's components, as `info` and the doctor print them (from the installed distributions'
metadata: no framework is imported)."""
from importlib import metadata

COMPONENTS = ("tensorflow", "tensorflow-cpu", "tf-keras", "horovod", "mpi4py", "numpy", "tensorboard", "matplotlib")


def installed_versions(names=COMPONENTS):
    """{distribution: version} of those of `names` that are installed, in the order given."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions
