"""The host's unit tests import the scripts' helper package, tfhpc_runtime, from the source tree: the image installs
it (containers/app/Dockerfile), the host does not, so its parent directory goes on sys.path once, here."""
import sys

from tfhpc import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts" / "runtime"))
