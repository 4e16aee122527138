"""tfhpc host tooling: reads versions.toml and containers/layers.toml, builds and describes the image stack."""
from .common import REPO_ROOT, UserError

__all__ = ["REPO_ROOT", "UserError"]
