"""The project's patch sets (versions.toml's keras_patches and horovod_patches) as tests use them: where they are, and
how a test reverses one in a container to show that a user script fails without it."""
from support.stack import REPO_ROOT

KERAS_PATCHES = REPO_ROOT / "containers" / "tensorflow" / "patches" / "keras"
HOROVOD_PATCHES = REPO_ROOT / "containers" / "horovod" / "patches"
# The image Python's site-packages, as a shell expression evaluated in the container.
PURELIB = "$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"

# Reverses a unified diff under a directory of symbolic links to the installed package (cp -rs), in Python (the image
# has no `patch`): each hunk's new text must occur exactly once in its file and becomes the old text; a changed file
# replaces its link, the installed file stays as it is. Run as `python -c REVERSE PATCH ROOT`.
REVERSE = r"""
import os, re, sys
patch, root = open(sys.argv[1]).read(), sys.argv[2]
for section in re.split(r'^--- a/', patch, flags=re.M)[1:]:
    path = section.splitlines()[1][len('+++ b/'):]
    text = open(f'{root}/{path}').read()
    for hunk in re.split(r'^@@[^\n]*\n', section, flags=re.M)[1:]:
        lines = [line for line in hunk.splitlines(keepends=True) if line[:1] in (' ', '-', '+')]
        old = ''.join(line[1:] for line in lines if line[0] in ' -')
        new = ''.join(line[1:] for line in lines if line[0] in ' +')
        assert text.count(new) == 1, (path, new)
        text = text.replace(new, old)
    os.remove(f'{root}/{path}')
    open(f'{root}/{path}', 'w').write(text)
"""
