"""Rendering of the SIF definition: same labels as Docker, one app per shipped command, nothing left unfilled."""
import re
import tomllib

from tfhpc import REPO_ROOT
from tfhpc.sif import render_definition, sif_path


def test_definition_has_docker_labels_apps_and_no_placeholder(config):
    text = render_definition(config, "app", "/tmp/layout")
    assert text.splitlines()[4:6] == ["Bootstrap: oci", "From: /tmp/layout"]
    labels_section = text.split("%labels\n", 1)[1].split("\n%", 1)[0]
    labels = dict(line.strip().split(" ", 1) for line in labels_section.strip().splitlines())
    assert labels == config.labels("app")
    with (REPO_ROOT / "scripts" / "entrypoints.toml").open("rb") as handle:
        names = list(tomllib.load(handle))
    assert re.findall(r"^%apprun (\S+)$", text, re.M) == names
    assert re.findall(r"^%apphelp (\S+)$", text, re.M) == names
    assert not re.search(r"@[A-Z]+@", text)
    for section in ("%help", "%environment", "%runscript", "%test"):
        assert f"\n{section}\n" in text
    assert "LD_LIBRARY_PATH=" not in text


def test_sif_name_follows_the_image_tag(config):
    assert sif_path(config, "app").name == f"tfhpc-app_{config.tag}.sif"
