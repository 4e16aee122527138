"""tfhpc host tooling: reads versions.toml and containers/layers.toml, builds and describes the image stack."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


class UserError(Exception):
    """A problem the user can fix; printed as one line with the fix, exit status 2."""
