"""tfhpc command line (the Makefile's back end): python3 -m tfhpc COMMAND [options].

Options default to the environment variables the Makefile exports (STACK, FLAVOR, MPI, BASE_SOURCE, CA_BUNDLE,
PIP_INDEX_URL, ARCH), so `make image MPI=mpich` and `STACK=conservative python3 -m tfhpc build` mean the same.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .common import UserError, default_ca_bundle, resolve_ca_bundle
from .manifest import Manifest


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", default=os.environ.get("STACK") or None, help="versions.toml stack")
    parser.add_argument("--flavor", default=os.environ.get("FLAVOR") or None, help="cpu or gpu")
    parser.add_argument("--mpi", default=os.environ.get("MPI") or None, help="openmpi or mpich")
    parser.add_argument("--arch", default=os.environ.get("ARCH") or None,
                        help="target architecture: amd64 (default) or arm64 (emulated on another host)")


def _add_source_options(parser: argparse.ArgumentParser, base_help: str, ca_help: str) -> None:
    """--base-source and --ca-bundle, defaulting to BASE_SOURCE and the host's CA bundle, for commands that build."""
    parser.add_argument("--base-source", default=os.environ.get("BASE_SOURCE") or "auto", help=base_help)
    parser.add_argument("--ca-bundle", default=default_ca_bundle(), help=ca_help)



def check_or_write(check_only: bool, check, write) -> int:
    """The generated-files commands (recipes, lock, pipelines, measurements): with --check, `check()` (it raises a
    UserError naming the drift); else `write()` and print each path it wrote."""
    if check_only:
        check()
        return 0
    for path in write():
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tfhpc", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="build a layer and its ancestors, then record build/images.json")
    _add_config_options(build)
    build.add_argument("--layer", default=os.environ.get("LAYER") or None, help="last layer to build (default: the leaf)")
    _add_source_options(build, base_help="registry, debootstrap or auto",
                        ca_help="PEM bundle for apt/pip during the build only ('none': no bundle)")
    build.add_argument("--pip-index-url", default=os.environ.get("PIP_INDEX_URL") or None,
                       help="PyPI mirror for the build (a BuildKit secret: never in a layer)")

    sif = commands.add_parser("sif", help="convert a built image into a SIF under build/sif/")
    _add_config_options(sif)
    sif.add_argument("--layer", default=os.environ.get("LAYER") or None,
                     help="image to convert: the leaf only (the default)")
    _add_source_options(sif, base_help="root of the apptainer helper image, when the host has no apptainer",
                        ca_help="CA bundle for the helper image's build")
    sif.add_argument("--sign-key", default=os.environ.get("SIGN_KEY") or None,
                     help="PEM private key: sign the SIF with it (apptainer sign --key)")
    sif.add_argument("--compression-level", default=os.environ.get("SQUASHFS_LEVEL") or None,
                     help="squashfs compression level (default: mksquashfs's, the shipped SIF's)")

    recipes = commands.add_parser("recipes", help="write recipes/native/ (native Apptainer recipes, via spython)")
    recipes.add_argument("--check", action="store_true", help="exit 1 if the committed recipes are out of date")

    native = commands.add_parser("native-sif", help="build every layer's SIF from recipes/native/ with apptainer")
    _add_config_options(native)
    _add_source_options(native,
                        base_help="root image for the base recipe and the helper: registry, debootstrap or auto",
                        ca_help="CA bundle for apt/pip during the builds")
    native.add_argument("--pip-index-url", default=os.environ.get("PIP_INDEX_URL") or None,
                        help="PyPI mirror for the builds (a file during %%post only, removed before the SIF is written)")

    bench = commands.add_parser("bench", help="measure the images side by side (build/bench/results.json, "
                                "results.md, PNG plots)")
    _add_config_options(bench)
    bench.add_argument("--quick", action="store_true", default=os.environ.get("QUICK", "0") not in ("", "0"),
                       help="the short version `make test` runs (~3 min), written to build/bench/quick/")
    bench.add_argument("--insist", action="store_true", default=os.environ.get("INSIST", "0") not in ("", "0"),
                       help="measure on a busy machine too (the results say so) instead of refusing")
    bench.add_argument("--wait", type=float, default=600, metavar="SECONDS",
                       help="how long to wait for an idle machine before refusing (default 600)")
    bench.add_argument("--startup-processes", type=int, default=8, metavar="N",
                       help="the start-up section's largest count of processes at once (default 8, the goals'; "
                            "the bench's own test runs 2)")

    show = commands.add_parser("show", help="print the resolved configuration as JSON")
    _add_config_options(show)

    site_mpis = commands.add_parser("site-mpis", help="print the MPIs (MPI=...) whose images and SIFs tests/sites "
                                                      "needs for this stack and flavour (`make site-images`)")
    _add_config_options(site_mpis)

    name = commands.add_parser("image-name", help="print the image name of a layer")
    _add_config_options(name)
    name.add_argument("--layer", default=None)

    commands.add_parser("layers", help="print the layers in build order")

    push = commands.add_parser("push", help="push the built images and the SIF to REGISTRY (tags from versions.toml)")
    _add_config_options(push)
    push.add_argument("--registry", default=os.environ.get("REGISTRY") or None, help="host[:port][/namespace]")
    push.add_argument("--sign-key", default=os.environ.get("SIGN_KEY") or None,
                      help="PEM private key: the pushed SIF is signed with it (apptainer sign --key)")

    lock = commands.add_parser("lock", help="write locks/<stack>-<flavor>/*.txt: every layer's Python packages, "
                               "pinned with their hashes (uv pip compile)")
    lock.add_argument("--check", action="store_true", help="exit 2 if a lock is out of date with versions.toml")
    lock.add_argument("--arch", action="append", default=[os.environ["ARCH"]] if os.environ.get("ARCH") else None,
                      help="lock this architecture only (repeatable; default: every one of versions.toml)")
    lock.add_argument("--flavor", action="append", default=[os.environ["FLAVOR"]] if os.environ.get("FLAVOR") else None,
                      help="lock this flavour only (repeatable; default: every one of versions.toml)")
    lock.add_argument("--upgrade", action="store_true",
                      help="resolve every package anew (default: keep the locked versions the inputs still allow)")

    pipelines = commands.add_parser("pipelines", help="write ci/ (GitHub Actions, GitLab CI) from containers/layers.toml")
    pipelines.add_argument("--check", action="store_true", help="exit 1 if the committed pipelines are out of date")

    measurements = commands.add_parser("measurements", help="write docs/measurements.md from "
                                       "docs/measurements/records.toml")
    measurements.add_argument("--check", action="store_true", help="exit 2 if the committed page is out of date")

    ci_layer = commands.add_parser("ci-build-layer", help="CI: build one layer on its parent image, already loaded")
    _add_config_options(ci_layer)
    ci_layer.add_argument("--layer", required=True)
    _add_source_options(ci_layer, base_help="root image of the first layer: registry, debootstrap or auto",
                        ca_help="CA bundle for apt/pip during the build")

    repro = commands.add_parser("repro", help="build the tensorflow and app layers twice without cache on the stack's "
                                "parent images and compare their files: build/repro/report.{json,md}")
    _add_config_options(repro)
    repro.add_argument("--layer", action="append", default=None,
                       help="layer to build twice (repeatable; default: tensorflow and app)")
    repro.add_argument("--ca-bundle", default=default_ca_bundle(),
                       help="PEM bundle for apt/pip during the builds only ('none': no bundle)")
    repro.add_argument("--pip-index-url", default=os.environ.get("PIP_INDEX_URL") or None,
                       help="PyPI mirror for the builds (a BuildKit secret: never in a layer)")

    upstream = commands.add_parser("upstream-tests", help="Horovod's own TensorFlow 2 and Keras suites on 2 ranks in the "
                                   "app image, with Keras 3 and tf_keras: build/upstream/results.{json,md}")
    _add_config_options(upstream)
    upstream.add_argument("--horovod-src", default=os.environ.get("HOROVOD_SRC") or None,
                          help="Horovod git checkout (or a tree with test/parallel); default: GitHub's tarball")
    upstream.add_argument("--keras", action="append", choices=("3", "2"), default=None,
                          help="Keras as tf.keras (repeatable; default: 3 and 2)")
    upstream.add_argument("--ca-bundle", default=default_ca_bundle(),
                          help="PEM bundle for the download and the test image's pip ('none': no bundle)")

    clean = commands.add_parser("clean", help="remove dangling images and the build cache")
    clean.add_argument("--all", action="store_true", help="also remove every tfhpc image")

    sqsh = commands.add_parser("sqsh", help="write build/sqsh/*.sqsh: the app image as enroot/pyxis squashfs")
    _add_config_options(sqsh)
    _add_source_options(sqsh, base_help="root of the apptainer helper image (its mksquashfs), when the host has none",
                        ca_help="CA bundle for the helper image's build")
    sqsh.add_argument("--output", default=None, help="file to write (default: build/sqsh/tfhpc-app_TAG.sqsh)")
    sqsh.add_argument("--mksquashfs", choices=("auto", "host", "helper"), default="auto",
                      help="whose mksquashfs: the host's when it has one (auto), or the helper image's")
    sqsh.add_argument("--force", action="store_true", help="rebuild even when made from the same image")
    edf = commands.add_parser("edf", help="write build/edf/*.toml: a CSCS Container Engine EDF for the app image")
    _add_config_options(edf)
    edf.add_argument("--registry", default=os.environ.get("REGISTRY") or None,
                     help="image = the versioned tag `make push` writes there (default: the .sqsh of `make sqsh`)")
    edf.add_argument("--image", default=None, help="image entry as is: REGISTRY#repository:tag or /path/x.sqsh")
    edf.add_argument("--output", default=None, help="file to write (default: build/edf/tfhpc-app_TAG.toml)")

    args = parser.parse_args(argv)
    # Each command imports its own module when it runs (the "# lazy" imports below), so that one command does not
    # import every other one's dependencies (docker, ruamel.yaml, spython, oras, cryptography, matplotlib).
    try:
        manifest = Manifest()
        if args.command == "layers":
            print(" ".join(manifest.layers.names))
            return 0
        if args.command == "clean":
            from .clean import clean as do_clean  # lazy: this command's module
            do_clean(remove_images=args.all)
            return 0
        if args.command == "recipes":
            from .recipes import check_committed, write_all  # lazy: this command's module
            return check_or_write(args.check, lambda: check_committed(manifest), lambda: write_all(manifest))
        if args.command == "lock":
            from .lock import check_locks, lock_configurations, write_locks  # lazy: this command's module
            return check_or_write(args.check,
                                  lambda: [check_locks(c) for c in lock_configurations(manifest, args.arch,
                                                                                       args.flavor)],
                                  lambda: write_locks(manifest, args.upgrade, args.arch, args.flavor))
        if args.command == "pipelines":
            from .ci import check_pipelines, write_pipelines  # lazy: this command's module
            return check_or_write(args.check, lambda: check_pipelines(manifest), lambda: write_pipelines(manifest))
        if args.command == "measurements":
            from .measurements import check, write  # this command's module only
            return check_or_write(args.check, check, lambda: [write()])
        config = manifest.config(args.stack, args.flavor, args.mpi, args.arch)
        if args.command == "push":
            from .publish import push as do_push  # lazy: this command's module
            key = Path(args.sign_key).expanduser().resolve() if args.sign_key else None
            print(json.dumps(do_push(manifest, config, args.registry, key), indent=2))
            return 0
        if args.command == "ci-build-layer":
            from .cilayer import build_one_layer  # lazy: this command's module
            print(build_one_layer(manifest, config, manifest.layers.get(args.layer).name, args.base_source,
                                  args.ca_bundle))
            return 0
        if args.command == "show":
            print(json.dumps({"tag": config.tag, "platform": config.platform, "build_args": config.build_args(),
                              "images": {layer: config.image(layer) for layer in manifest.layers.names},
                              "components": config.component_versions()}, indent=2))
        elif args.command == "site-mpis":
            print(" ".join(config.site_test_mpis))
        elif args.command == "image-name":
            print(config.image(args.layer or manifest.layers.leaf))
        elif args.command == "sif":
            from .sif import build_sif  # lazy: this command's module
            layer = manifest.layers.get(args.layer).name if args.layer else manifest.layers.leaf
            key = Path(args.sign_key).expanduser().resolve() if args.sign_key else None
            print(build_sif(manifest, config, layer, args.base_source, resolve_ca_bundle(args.ca_bundle), key,
                            args.compression_level))
        elif args.command == "native-sif":
            from .nativesif import build_native  # lazy: this command's module
            for path in build_native(manifest, config, args.base_source, resolve_ca_bundle(args.ca_bundle),
                                     args.pip_index_url):
                print(path)
        elif args.command == "bench":
            from .bench.run import run_bench  # lazy: this command's module
            print(run_bench(config, args.quick, insist=args.insist, max_wait=args.wait,
                            startup_processes=args.startup_processes))
        elif args.command == "sqsh":
            from .sqsh import build_sqsh  # lazy: this command's module
            print(build_sqsh(manifest, config, Path(args.output) if args.output else None, args.mksquashfs,
                             args.base_source, resolve_ca_bundle(args.ca_bundle), args.force))
        elif args.command == "edf":
            from .edf import write_edf  # lazy: this command's module
            print(write_edf(manifest, config, args.image, args.registry, Path(args.output) if args.output else None))
        elif args.command == "repro":
            from .repro import COMPARED_TREES, REPORT_DIR, run_repro  # lazy: this command's module
            report = run_repro(config, args.layer or list(COMPARED_TREES), resolve_ca_bundle(args.ca_bundle),
                               args.pip_index_url)
            print(REPORT_DIR / "report.md")
            if not report["passed"]:
                count = sum(layer["unexplained"] for layer in report["layers"].values())
                print(f"tfhpc: error: {count} files differ between two cold builds without an explanation: "
                      f"see {REPORT_DIR / 'report.md'}, fix the cause or name it in tfhpc/repro.py EXPLAINED",
                      file=sys.stderr)
                return 1
        elif args.command == "upstream-tests":
            from .upstream import upstream_tests  # lazy: this command's module
            upstream_tests(config, args.horovod_src, resolve_ca_bundle(args.ca_bundle), tuple(args.keras or ("3", "2")))
        elif args.command == "build":
            from .build import build_stack  # lazy: this command's module
            layer = manifest.layers.get(args.layer).name if args.layer else manifest.layers.leaf
            for image in build_stack(config, layer, args.base_source, args.ca_bundle, args.pip_index_url):
                print(image)
        return 0
    except UserError as error:
        print(f"tfhpc: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tfhpc: interrupted: no image was tagged by the interrupted step", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
