"""Output that one rank writes for all: whole or not at all (a temporary file in the same directory, then a rename),
with the mode a plain open() would give."""
import io
import os
import tempfile
from pathlib import Path

UMASK = os.umask(0o022)  # read once (os.umask can only be read by setting it) and put back
os.umask(UMASK)


def atomic_write_bytes(path, data):
    """Write `data` to `path`, creating its directory: readers see the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(temporary, 0o666 & ~UMASK)  # mkstemp makes 0600; give the file the mode open() would
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)  # readers see the old file or the new one, never half of one
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def save_weights_npz(path, model):
    """--weights-out: every weight of the model, named by position and name, in one .npz."""
    import numpy as np  # here: the doctor imports this module and must start without numpy
    buffer = io.BytesIO()
    np.savez(buffer, **{f"{i:03d}:{w.name}": w.numpy() for i, w in enumerate(model.weights)})
    atomic_write_bytes(path, buffer.getvalue())


def listing(directory):
    """Relative paths under a directory (for the RESULT line), or None."""
    if not directory or not Path(directory).is_dir():
        return None
    return sorted(str(p.relative_to(directory)) for p in Path(directory).rglob("*"))
