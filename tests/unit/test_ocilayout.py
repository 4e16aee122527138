"""tfhpc/ocilayout.py: a `docker save` stream (both of Docker's formats) becomes an OCI layout whose every blob is
named by the sha256 of its bytes, with the image's layers uncompressed and in order."""
import hashlib
import io
import json
import tarfile

import pytest

from tfhpc import ocilayout
from tfhpc.common import UserError

LAYERS = [b"first layer " * 200_000, b"second"]  # one larger than IN_MEMORY (written to disk), one small


def saved(oci_names):
    """The bytes of a `docker save` archive of one image with LAYERS: legacy names (<id>/layer.tar, <id>.json) or
    Docker 25's (blobs/sha256/<digest>)."""
    diff_ids = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in LAYERS]
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/opt/venv/bin:/usr/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    config_id = hashlib.sha256(config).hexdigest()
    if oci_names:
        layer_names = [f"blobs/sha256/{d.removeprefix('sha256:')}" for d in diff_ids]
        config_name = f"blobs/sha256/{config_id}"
    else:
        layer_names = [f"{n}abc/layer.tar" for n in range(len(LAYERS))]
        config_name = f"{config_id}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": ["tfhpc-app:test"], "Layers": layer_names}]).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in [*zip(layer_names, LAYERS), (config_name, config), ("manifest.json", manifest)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue(), config


def chunks(data, size=65536):
    return (data[start:start + size] for start in range(0, len(data), size))


@pytest.mark.parametrize("oci_names", [False, True], ids=["docker-before-25", "docker-25"])
def test_the_layout_holds_the_image_with_its_layers_uncompressed(tmp_path, oci_names):
    data, config = saved(oci_names)
    digest = ocilayout.write_layout(chunks(data), tmp_path / "layout")
    layout = tmp_path / "layout"
    blobs = layout / "blobs" / "sha256"
    for blob in blobs.iterdir():  # the layout's rule: a blob's name is the sha256 of its bytes; nothing else there
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    (descriptor,) = json.loads((layout / "index.json").read_text())["manifests"]
    assert descriptor["digest"] == digest and descriptor["mediaType"] == ocilayout.MANIFEST_MEDIA_TYPE
    manifest = json.loads((blobs / digest.removeprefix("sha256:")).read_bytes())
    assert (blobs / manifest["config"]["digest"].removeprefix("sha256:")).read_bytes() == config
    assert [(blobs / layer["digest"].removeprefix("sha256:")).read_bytes() for layer in manifest["layers"]] == LAYERS
    assert {layer["mediaType"] for layer in manifest["layers"]} == {"application/vnd.oci.image.layer.v1.tar"}
    assert len(list(blobs.iterdir())) == len(LAYERS) + 2


def test_a_stream_without_manifest_json_is_one_line(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("repositories")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(UserError, match="not one image with manifest.json"):
        ocilayout.write_layout(chunks(buffer.getvalue()), tmp_path / "layout")
