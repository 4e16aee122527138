"""Native Apptainer/Singularity recipes generated from the Dockerfiles, for sites that build with `apptainer build`
and no Docker. `make recipes` writes one recipe per layer for every configuration, recipes/native/<layer>.def (and
base-debootstrap.def, the base layer from debootstrap instead of a registry image), plus one arguments file per
configuration, recipes/native/args/<stack>-<flavor>-<mpi>.args; a test fails on drift. Build a layer with
`apptainer build --warn-unused-build-args --build-arg-file recipes/native/args/<config>.args <sif> <recipe>`.

Build arguments (Apptainer >= 1.3; 1.2 rejects empty values and values with `=`, such as TENSORFLOW_EXTRA_PINS):
apptainer replaces `{{ NAME }}` in each stage's whole text (header lines such as From: and OSVersion:, every section,
%labels and %help included; not after a `#` comment on the same line) with the value from --build-arg, else
--build-arg-file, else that stage's %arguments, and stops when a name has none of them. So a configuration's value
is a `{{ NAME }}` without %arguments default: a build without the arguments file stops at the first name instead of
building some default configuration. %arguments keeps what has a configuration-independent default: a Dockerfile
ARG's own default, and the optional CA_BUNDLE and PIP_INDEX_URL_FILE (empty). apptainer also stops on a given
argument the recipe does not use, unless --warn-unused-build-args: needed, as the file holds every layer's values.
Its lines are NAME=value only (apptainer warns on any other line, comments included, and trims the values):
- every Dockerfile ARG that versions.toml sets (tfhpc/manifest.py build_args), TAG (<stack>-<flavor>-<mpi>, in the
  parents' SIF names and labels), STACK, ROOT_IMAGE (the registry root image of the base layer);
- labels: a label whose value is a build argument's in every configuration uses that argument, a label equal in
  every configuration is written as is, one that varies is `key {{ LABEL_<KEY> }}`, and one that only some
  configurations have is a whole line `{{ LABEL_<KEY> }}` (value "key value", or empty: apptainer skips empty label
  lines);
- COMPONENTS: the leaf's %help line of component versions.
The Dockerfiles branch on FLAVOR at build time (`if [ "${FLAVOR}" = gpu ]`) rather than by structure, so one recipe
serves every flavour; rendering stops with an error if a configuration ever needs other text than a value.

spython (singularity-cli) parses each Dockerfile stage: continuation lines, ENV forms, COPY sources and destination,
WORKDIR, ENTRYPOINT/CMD. What spython drops or gets wrong for these Dockerfiles is handled here, before or after it:
- ARG without a default is skipped (singularity-cli issue 73): every ARG becomes an Apptainer build argument
  (`{{ NAME }}` in the text, its value in the arguments file or %arguments as above), so `apptainer build
  --build-arg` overrides it.
- a second FROM without `AS` is merged into the previous stage: each FROM starts its own stage here. Only the last
  stage and those it takes files from are rendered: a configuration built to a stage of its own (MPI=abi, whose mpi
  layer is the `abi` stage) has no native recipe yet.
- RUN --mount is passed through as text: secret and cache mounts are removed (the CA bundle and the pip index come
  from the %setup section below instead), a bind mount from a stage becomes `%files from <stage>` and is deleted at
  the end of that RUN, so it stays out of the SIF as it stays out of the Docker layer. A bind mount of the `cross`
  stage (an emulated Docker build's compilers) is removed: `apptainer build` runs on the image's own architecture,
  and containers/cross/cross-env then runs the compile as it is.
- COPY --from=<stage> is dropped with a warning ("layer not previously defined"): it becomes `%files from <stage>`.
- USER becomes `su - user`, which would end the build script: dropped (%post runs as root, the SIF as the caller).
- ENV only reaches %post as unexported assignments: exported here, for the RUNs after it.
- ENTRYPOINT + CMD become a runscript that always appends CMD (singularity-cli issue 160): arguments given to
  `apptainer run` replace CMD here, as they do in `docker run`.
- a RUN's failure must end the build as it ends `docker build`: each RUN runs in its own subshell under `set -e`
  (an `a && b` list does not stop `set -e` when `a` fails, and the %post is one script).
Drop a workaround when the spython release in requirements.txt fixes its issue (the drift test shows the change).
"""
from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from pathlib import Path

from spython.main.parse.parsers import DockerParser

from .common import REPO_ROOT, UserError
from .manifest import Config, Manifest
from .sif import render_definition

NATIVE_DIR = REPO_ROOT / "recipes" / "native"
ARGS_DIR = NATIVE_DIR / "args"
SECRETS = {"ca_bundle": "CA_BUNDLE", "pip_index_url": "PIP_INDEX_URL_FILE"}  # BuildKit secret id -> build argument
# Stages for the build host only (the `cross` stage: an emulated build's compilers, tfhpc/cross.py): their mounts
# are dropped, and the stage with them, since no rendered stage takes files from it.
BUILD_HOST_STAGES = {"cross"}

HEADER = """\
# GENERATED by `make recipes` (tfhpc/recipes.py) from containers/{layer}/Dockerfile: do not edit.
# One recipe for every configuration <config> (<stack>-<flavor>-<mpi>): its pins and labels are build arguments
# (Apptainer >= 1.3), valued in recipes/native/args/<config>.args. Build from the repository root, parent first (the
# chain is containers/layers.toml's); --warn-unused-build-args as the file also holds the other layers' arguments:
#   apptainer build --warn-unused-build-args --build-arg-file recipes/native/args/<config>.args \\
#     build/native/tfhpc-{layer}_<config>.sif recipes/native/{recipe}
# Behind a TLS-intercepting proxy: --build-arg CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt (a host path; copied in
# for the build and removed before the SIF is written). Private index: --build-arg PIP_INDEX_URL_FILE=<file with URL>.
"""

SETUP = """\
    # BuildKit secrets' counterpart: files given by path, present during %post only (removed at its end).
    mkdir -p "${APPTAINER_ROOTFS:-$SINGULARITY_ROOTFS}/run/secrets"
""" + "".join(
    f'    if [ -n "{{{{ {arg} }}}}" ]; then cp "{{{{ {arg} }}}}" '
    f'"${{APPTAINER_ROOTFS:-$SINGULARITY_ROOTFS}}/run/secrets/{secret}"; fi\n'
    for secret, arg in SECRETS.items())


def instructions(text: str) -> list[str]:
    """The Dockerfile as logical instructions (continuations joined, newlines kept) and comment lines."""
    result, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            result.append(line.strip())
            continue
        current += line + "\n"
        if not line.rstrip().endswith("\\"):
            result.append(current.rstrip("\n"))
            current = ""
    if current:
        result.append(current.rstrip("\n"))
    return result


def _keyword(instruction: str) -> str:
    return instruction.split(None, 1)[0].upper() if instruction and not instruction.startswith("#") else ""


def _substitute(text: str, arguments: dict[str, str]) -> str:
    """${NAME} -> a space-free placeholder (spython splits ENV values at spaces), made `{{ NAME }}` at the end."""
    for name in arguments:
        text = re.sub(r"\$\{%s\}|\$%s\b" % (name, name), "@@%s@@" % name, text)
    return text


class Stage:
    def __init__(self, name: str, from_line: str):
        self.name = name
        self.from_line = from_line
        self.lines: list[str] = []      # Dockerfile text for spython, rewritten
        self.binds: list[tuple[str, str, str]] = []  # (stage, source, target) from RUN --mount=type=bind,from=
        self.copies: list[tuple[str, str, str]] = []  # (stage, source, destination) from COPY --from=
        self.user = "root"
        self.shell = ""
        self.arguments: dict[str, str | None] = {}  # ARG -> its own default, None when versions.toml sets it


def split_stages(dockerfile: Path, build_args: Collection[str]) -> tuple[list[str], list[Stage]]:
    """Leading comments, and the stages with ARGs substituted and RUN mounts resolved (see the module docstring).
    build_args: the names versions.toml sets (their values come from the arguments file)."""
    leading, stages = [], []
    arguments: dict[str, str | None] = {}
    for instruction in instructions(dockerfile.read_text()):
        keyword = _keyword(instruction)
        if not stages and keyword not in ("FROM",):
            if keyword == "ARG":
                continue  # ARG BASE_IMAGE: the parent, which becomes the header's From
            leading.append(instruction)
            continue
        if keyword == "FROM":
            parts = [part for part in instruction.split() if not part.startswith("--")]  # FROM --platform=...
            name = parts[3] if len(parts) >= 4 and parts[2].upper() == "AS" else "final"
            stages.append(Stage(name, instruction))
            continue
        stage = stages[-1]
        if stage.name in BUILD_HOST_STAGES:
            continue  # never rendered (its ARGs would become every stage's build arguments)
        if keyword == "ARG":
            for item in instruction.split()[1:]:
                name, _, default = item.partition("=")
                if name not in build_args and not default:
                    raise UserError(f"{dockerfile}: ARG {name} has no value in versions.toml (tfhpc/manifest.py "
                                    "build_args) and no default: add it there")
                arguments[name] = None if name in build_args else default
            continue
        if keyword == "USER":
            stage.user = instruction.split()[1]
            continue
        if keyword == "SHELL":
            stage.shell = instruction
            continue
        instruction = _substitute(instruction, arguments)
        copy_from = re.fullmatch(r"COPY\s+--from=(\S+)\s+(\S+)\s+(\S+)", instruction.strip())
        if copy_from:
            stage.copies.append(copy_from.groups())
            continue
        if keyword == "RUN":
            binds = []
            for mount in re.findall(r"--mount=(\S+)", instruction):
                options = dict(option.partition("=")[::2] for option in mount.split(","))
                if options.get("type") == "bind" and options.get("from") in BUILD_HOST_STAGES:
                    continue  # an emulated build's cross compilers: a native recipe builds on its own machine
                if options.get("type") == "bind" and options.get("from"):
                    binds.append((options["from"], options["source"], options["target"]))
                elif options.get("type") not in ("secret", "cache"):
                    raise UserError(f"{dockerfile}: RUN --mount={mount} has no native translation: teach "
                                    "tfhpc/recipes.py or use a secret, cache or stage bind mount")
            command = re.sub(r"--mount=\S+\s*(\\\n\s*)?", "", instruction[len("RUN"):].strip())
            stage.binds += binds
            cleanup = "".join(f" && rm -rf {target}" for _, _, target in binds)
            instruction = f"RUN ( {command}\n){cleanup}" if cleanup else f"RUN ( {command}\n)"
        stage.lines.extend(instruction.splitlines())
    for stage in stages:
        stage.arguments = arguments
    return leading, used_stages(stages)


def used_stages(stages: list[Stage]) -> list[Stage]:
    """The last stage and the stages it takes files from, directly or through another (RUN --mount=type=bind,from=,
    COPY --from=): what `docker build` without --target builds. A stage another configuration builds as its target
    (MPI=abi's `abi` in containers/mpi/Dockerfile) is left out."""
    needed = {stages[-1].name}
    for stage in reversed(stages):
        if stage.name in needed:
            needed |= {source for source, _, _ in stage.binds} | {source for source, _, _ in stage.copies}
    return [stage for stage in stages if stage.name in needed]


def parse_stage(stage: Stage):
    """spython's recipe of one stage (its Dockerfile lines without FROM)."""
    parser = DockerParser(None, load=False)
    parser.lines = [line + "\n" for line in stage.lines]
    return parser.parse()["spython-base"]


def _indent(lines) -> str:
    return "".join(f"    {line}\n" if line else "\n" for line in lines)


def _post(recipe) -> list[str]:
    """spython's install list with ENV assignments exported (they reach the later RUNs of the same %post)."""
    exported = set(recipe.environ)
    lines = []
    for entry in recipe.install:
        entry = entry.rstrip("\n")
        lines.append(f"export {entry}" if entry in exported else entry)
    return lines


def _files_line(source: str, destination: str) -> str:
    """COPY dir/ /dest/ copies the directory's content; %files does that only without the trailing slashes (with
    them, apptainer makes /dest/dir)."""
    if (REPO_ROOT / source).is_dir():
        return f"{source.rstrip('/')} {destination.rstrip('/')}"
    return f"{source} {destination}"


def _runscript(entrypoint, cmd) -> list[str]:
    def words(value):
        if value is None:
            return []
        return [value] if isinstance(value, str) else list(value)

    def quoted(items):
        return " ".join("'" + item.replace("'", "'\\''") + "'" for item in items)

    entry, default = words(entrypoint), words(cmd)
    lines = []
    if default:
        lines.append(f'if [ "$#" -eq 0 ]; then set -- {quoted(default)}; fi  # CMD: replaced by any argument')
    lines.append(f'exec {quoted(entry)} "$@"' if entry else 'exec "$@"')
    return lines


def configurations(manifest: Manifest) -> Iterator[Config]:
    """Every stack x flavour x MPI of the manifest (a flavour without its section is skipped)."""
    for stack in manifest.stacks:
        for flavor in manifest.flavors:
            if flavor == "gpu" and not manifest.data["stacks"][stack].get("gpu"):
                continue  # this stack has no GPU flavour (no [stacks.<stack>.gpu] pins)
            for mpi in manifest.mpis(manifest.config(stack, flavor, None).os_release):
                try:
                    config = manifest.config(stack, flavor, mpi)
                except UserError:
                    continue  # an MPI without this flavour (versions.toml: its `flavors`)
                if any(config.build_target(layer) for layer in manifest.layers.names):
                    continue  # built to a stage of its own (MPI=abi): the recipes follow each Dockerfile's last stage
                yield config


def _values(config: Config) -> dict[str, str]:
    """The configuration's build arguments, apart from the labels'."""
    return {"TAG": config.tag, "STACK": config.stack, "ROOT_IMAGE": config.registry_root_image, **config.build_args()}


def _label_name(key: str) -> str:
    short = key.removeprefix("org.opencontainers.image.").removeprefix("io.tfhpc.")
    return "LABEL_" + re.sub(r"\W", "_", short).upper()


def _label_plan(manifest: Manifest, layer: str) -> list[tuple[str, str, str | None]]:
    """(key, %labels line, argument it needs or None) for the union of the configurations' labels, in their order
    (see the module docstring)."""
    configs = list(configurations(manifest))
    labels = [config.labels(layer) for config in configs]
    values = [_values(config) for config in configs]
    keys: list[str] = []
    for config_labels in labels:
        previous = None
        for key in config_labels:
            if key not in keys:
                keys.insert(keys.index(previous) + 1 if previous else 0, key)
            previous = key
    plan = []
    for key in keys:
        found = [config_labels.get(key) for config_labels in labels]
        name = _label_name(key)
        same = next((arg for arg in values[0] if all(v.get(arg) == f for v, f in zip(values, found))), None)
        if None in found:
            plan.append((key, f"{{{{ {name} }}}}", name))
        elif same:
            plan.append((key, f"{key} {{{{ {same} }}}}", None))
        elif len(set(found)) == 1:
            plan.append((key, f"{key} {found[0]}", None))
        else:
            plan.append((key, f"{key} {{{{ {name} }}}}", name))
    return plan


def arguments(manifest: Manifest, config: Config) -> dict[str, str]:
    """Every build argument the recipes take from the configuration's arguments file, with its value."""
    result = _values(config)
    for layer in manifest.layers.names:
        labels = config.labels(layer)
        for key, line, name in _label_plan(manifest, layer):
            if name:
                value = "" if key not in labels else labels[key] if line.startswith(key) else f"{key} {labels[key]}"
                if result.setdefault(name, value) != value:
                    raise UserError(f"label {key} differs between layers in {config.tag}: teach tfhpc/recipes.py")
    result["COMPONENTS"] = ", ".join(f"{k} {v}" for k, v in config.component_versions().items())
    return result


def render(manifest: Manifest, layer: str, root: str = "docker") -> str:
    """The native recipe of `layer` for every configuration. root: "docker" (registry image) or "debootstrap" (base
    layer only)."""
    dockerfile = REPO_ROOT / "containers" / layer / "Dockerfile"
    build_args = {name for config in configurations(manifest) for name in config.build_args()}
    leading, stages = split_stages(dockerfile, build_args)
    parent = manifest.layers.get(layer).parent
    recipe_name = f"{layer}-debootstrap.def" if root == "debootstrap" else f"{layer}.def"
    out = [HEADER.format(layer=layer, recipe=recipe_name)]
    out.append("# From the Dockerfile:\n" + "".join(f"{line}\n" for line in leading if line))
    for index, stage in enumerate(stages):
        recipe = parse_stage(stage)
        final = index == len(stages) - 1
        out.append("\n")
        if parent:
            out.append(f"Bootstrap: localimage\nFrom: build/native/tfhpc-{parent}_{{{{ TAG }}}}.sif\n")
        elif root == "debootstrap":
            out.append("Bootstrap: debootstrap\nOSVersion: {{ OS_RELEASE }}\nMirrorURL: {{ APT_MIRROR }}\n")
        else:
            out.append("Bootstrap: docker\nFrom: {{ ROOT_IMAGE }}\n")
        if len(stages) > 1:
            out.append(f"Stage: {stage.name}\n")
        defaults = [f"{name}={value}" for name, value in stage.arguments.items() if value is not None]
        out.append("\n%arguments\n" + _indent(defaults + [f"{arg}=" for arg in SECRETS.values()]))
        out.append("\n%setup\n" + SETUP)
        files = [_files_line(src, dst) for src, dst in recipe.files]
        if files:
            out.append("\n%files\n" + _indent(files))
        for from_stage, source, target in stage.binds:
            out.append(f"\n%files from {from_stage}\n" + _indent([f"{source} {target}"]))
        for from_stage, source, target in stage.copies:  # a directory's content, as COPY dir/ /dest/ copies it
            out.append(f"\n%files from {from_stage}\n" + _indent([f"{source.rstrip('/')} {target.rstrip('/')}"]))
        post = ["set -e", *_post(recipe), "rm -rf /run/secrets"]
        # `{{ NAME }}` is text substitution: a shell expansion with an operator such as ${NAME#gcc-} needs NAME as a
        # shell variable, so it is assigned from the build argument first.
        operated = sorted({name for name in re.findall(r"\$\{(\w+)[#%:/]", "\n".join(post))
                           if name in stage.arguments})
        post[1:1] = [f'{name}="@@{name}@@"' for name in operated]
        if stage.shell:
            post.insert(0, f"# {stage.shell}: the RUNs below are also valid POSIX sh; /bin/sh runs them here.")
        if final and stage.user != "root":
            post.append(f"# USER {stage.user}: Apptainer runs the image as the calling user.")
        out.append("\n%post\n" + _indent(post))
        if final:
            lines = [line for _, line, _ in _label_plan(manifest, layer)]
            lines.append(f"io.tfhpc.recipe recipes/native/{recipe_name} recipes/native/args/{{{{ TAG }}}}.args")
            out.append("\n%labels\n" + _indent(lines))
            if recipe.environ:
                out.append("\n%environment\n" + _indent(f"export {entry}" for entry in recipe.environ))
            if recipe.entrypoint or recipe.cmd:
                out.append("\n%runscript\n" + _indent(_runscript(recipe.entrypoint, recipe.cmd)))
    if layer == manifest.layers.leaf:
        out.append(_interface_sections(manifest, layer))
    return re.sub(r"@@(\w+)@@", r"{{ \1 }}", "".join(out))


def _interface_sections(manifest: Manifest, layer: str) -> str:
    """The leaf image's %help, %test and apps, taken from the definition `make sif` uses (recipes/app.def.in), so
    that a natively built SIF has the same interface as a converted one; TAG and COMPONENTS are build arguments."""
    texts = set()
    for config in configurations(manifest):
        keep, sections = False, []
        for line in render_definition(config, layer, "unused").splitlines():
            if line.startswith("%"):
                keep = line.split()[0] in ("%help", "%test", "%apprun", "%apphelp")
            if keep:
                sections.append(line.replace(f"({config.tag})", "({{ TAG }})").replace(
                    arguments(manifest, config)["COMPONENTS"], "{{ COMPONENTS }}"))
        texts.add("\n" + "\n".join(sections).rstrip() + "\n")
    if len(texts) != 1:
        raise UserError("recipes/app.def.in: the leaf's %help/%test/apps differ between configurations in more than "
                        "TAG and COMPONENTS: make the difference a build argument in tfhpc/recipes.py")
    return texts.pop()


def args_file(manifest: Manifest, config: Config, used: Collection[str]) -> str:
    """The configuration's arguments file: NAME=value for each argument of `used` (the names the recipes use)."""
    lines = []
    for name, value in arguments(manifest, config).items():
        if name not in used:
            continue
        if "\n" in value or value != value.strip() or "{{" in value:
            raise UserError(f"{name}={value!r} ({config.tag}) cannot be an apptainer build argument: no newline, "
                            "no surrounding spaces and no {{ (apptainer would substitute it)")
        lines.append(f"{name}={value}\n")
    return "".join(lines)


def expected_files(manifest: Manifest) -> dict[Path, str]:
    """Every native recipe and every configuration's arguments file."""
    files = {}
    for layer in manifest.layers.names:
        files[NATIVE_DIR / f"{layer}.def"] = render(manifest, layer)
        if not manifest.layers.get(layer).parent:
            files[NATIVE_DIR / f"{layer}-debootstrap.def"] = render(manifest, layer, "debootstrap")
    used = {name for text in files.values() for name in re.findall(r"\{\{ (\w+) \}\}", text)}
    for config in configurations(manifest):
        files[ARGS_DIR / f"{config.tag}.args"] = args_file(manifest, config, used)
    return files


def write_all(manifest: Manifest) -> list[Path]:
    """Write every recipe and arguments file (atomically each) and remove stale ones; returns the paths written."""
    files = expected_files(manifest)
    for path, text in files.items():
        if path.is_file() and path.read_text() == text:
            continue  # untouched: its time stamp tells `make native-sif` what is up to date
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text)
        partial.replace(path)
    for stale in (set(NATIVE_DIR.glob("**/*.def")) | set(ARGS_DIR.glob("*.args"))) - set(files):
        stale.unlink()
    for directory in NATIVE_DIR.iterdir():
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()  # emptied by the stale files' removal
    return sorted(files)


def check_committed(manifest: Manifest, paths: Collection[Path] | None = None) -> None:
    """`make recipes --check`, and `make native-sif` before it builds: each of `paths` (default: every file `make
    recipes` writes) is there and is what the Dockerfiles and versions.toml give, else a UserError names them."""
    expected = expected_files(manifest)
    stale = [str(path.relative_to(NATIVE_DIR)) for path in (expected if paths is None else paths)
             if not path.is_file() or path.read_text() != expected.get(path)]
    if stale:
        raise UserError(f"recipes/native is out of date ({', '.join(stale)}: missing or not what the Dockerfiles and "
                        "versions.toml give): run `make recipes`")
