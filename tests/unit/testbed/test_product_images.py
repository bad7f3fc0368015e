"""images/Dockerfile and the test bed's local build make the same images: both follow
images/images.toml (base and packages, virtual environment, environment, user, entrypoint), and a
change to one that the other does not follow fails here."""

from __future__ import annotations

import json
import re
import shlex
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testbed import product_images
from testbed.images import build_image
from testbed.product_images import DOCKERFILE, Manifest, load_manifest

# Where the Dockerfile's build stage finds constraints.txt: the build context is copied to /src.
DOCKER_CONSTRAINTS = "/src/constraints.txt"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [value for key, value in self.instructions if key == keyword]


def parse_dockerfile(text: str) -> dict[str, Stage]:
    """Stages by name, each with its instructions (continuation lines joined, comments dropped,
    global ARG defaults substituted into FROM)."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or (stripped.startswith("#") and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    arguments: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in lines:
        keyword, _, value = line.partition(" ")
        keyword, value = keyword.upper(), value.strip()
        if keyword == "ARG" and current is None:
            name, _, default = value.partition("=")
            arguments[name] = default
        elif keyword == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", value, re.IGNORECASE)
            assert match, f"every stage is named: {line}"
            base = re.sub(r"\$\{(\w+)\}", lambda m: arguments[m.group(1)], match.group(1))
            current = stages[match.group(2)] = Stage(match.group(2), base)
        else:
            assert current is not None, f"instruction before the first FROM: {line}"
            current.instructions.append((keyword, value))
    return stages


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest()


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


def runtime_ancestry(stages: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and the stages it is built FROM, outermost first."""
    chain = [stages[name]]
    while chain[0].base in stages:
        chain.insert(0, stages[chain[0].base])
    return chain


def test_every_image_is_a_target_with_the_manifests_user_and_entrypoint(
    manifest: Manifest, stages: dict[str, Stage]
) -> None:
    assert set(manifest.images) <= set(stages)
    for name, image in manifest.images.items():
        stage = stages[name]
        assert stage.all("USER") == [image.user], name
        assert [json.loads(e) for e in stage.all("ENTRYPOINT")] == [list(image.entrypoint)], name
        assert stage.base == "runtime", f"{name} is built on the shared runtime stage"


def test_the_runtime_stage_installs_the_manifests_packages_on_its_base(
    manifest: Manifest, stages: dict[str, Stage]
) -> None:
    runtime = stages["runtime"]
    assert runtime.base == manifest.base
    [install] = [run for run in runtime.all("RUN") if "apt-get install" in run]
    words = shlex.split(install.split("apt-get install", 1)[1].split("&&", 1)[0])
    assert sorted(w for w in words if not w.startswith("-")) == sorted(manifest.apt_packages)


def test_every_image_gets_the_manifests_environment_and_working_directory(
    manifest: Manifest, stages: dict[str, Stage]
) -> None:
    for name in manifest.images:
        chain = runtime_ancestry(stages, name)
        env = [value for stage in chain for value in stage.all("ENV")]
        assert env == list(manifest.env), name
        assert [value for stage in chain for value in stage.all("WORKDIR")][-1] == manifest.workdir


def test_the_virtual_environment_is_made_and_filled_as_the_local_build_does(
    manifest: Manifest, stages: dict[str, Stage]
) -> None:
    """The build stage runs venv_commands at the manifest's path (the wheel by its glob, the
    constraints from the build context), and the runtime stage copies the environment whole: what
    make_venv runs in the local build's root."""
    build = stages["build"].all("RUN")
    commands = [
        shlex.join(c) for c in product_images.venv_commands(manifest, manifest.venv, "WHEEL", "CONSTRAINTS")
    ]
    [venv_run] = [run for run in build if f"-m venv --copies {manifest.venv}" in run]
    python = Path(manifest.python).name
    dockerfile = [
        part.strip()
        for part in venv_run.replace("/build/wheels/tessera-*.whl", "WHEEL")
        .replace(DOCKER_CONSTRAINTS, "CONSTRAINTS")
        .split("&&")
    ]
    assert dockerfile == [c.replace(manifest.python, python, 1) for c in commands]
    assert f"--from=build {manifest.venv} {manifest.venv}" in stages["runtime"].all("COPY")


def test_both_builds_fill_the_virtual_environment_in_the_manifests_build_environment(
    manifest: Manifest, stages: dict[str, Stage]
) -> None:
    """The Dockerfile's build stage sets it; make_venv runs its commands with it (below)."""
    assert stages["build"].all("ENV") == list(manifest.build_env)


def test_both_builds_take_every_version_from_the_constraints_file(stages: dict[str, Stage]) -> None:
    """The Dockerfile's wheel build (its isolated build environment) and its install read
    constraints.txt from the build context, and the local build copies that file with the context."""
    [wheel_run] = [run for run in stages["build"].all("RUN") if " wheel " in run]
    assert wheel_run.startswith(f"PIP_CONSTRAINT={DOCKER_CONSTRAINTS} ")
    assert ". /src" in stages["build"].all("COPY")
    assert product_images.CONSTRAINTS.relative_to(product_images.REPO).as_posix() in (
        product_images.context_files()
    )


def test_the_local_archives_carry_the_manifests_configuration(manifest: Manifest, tmp_path: Path) -> None:
    """The configuration each local archive gets (from image_spec, written by build_image) is the
    manifest's: entrypoint, user, environment, working directory."""
    marker = tmp_path / "marker"
    marker.write_text("x")
    for image in manifest.images.values():
        spec = product_images.image_spec(manifest, image, {"/marker": marker})
        archive = build_image(spec, tmp_path / image.target)
        with tarfile.open(archive) as tar:
            blobs = {m.name: tar.extractfile(m) for m in tar.getmembers() if m.isfile()}
            contents = {name: f.read() for name, f in blobs.items() if f is not None}
        index = json.loads(contents["index.json"])
        [descriptor] = index["manifests"]
        assert descriptor["annotations"]["io.containerd.image.name"] == product_images.reference(image)
        image_manifest = json.loads(contents[f"blobs/sha256/{descriptor['digest'].removeprefix('sha256:')}"])
        config_digest = image_manifest["config"]["digest"].removeprefix("sha256:")
        config = json.loads(contents[f"blobs/sha256/{config_digest}"])["config"]
        assert config["Entrypoint"] == list(image.entrypoint)
        assert config["User"] == image.user
        assert config["Env"] == list(manifest.env)
        assert config["WorkingDir"] == manifest.workdir


def test_the_parser_reads_continuations_args_and_stage_names() -> None:
    stages = parse_dockerfile(
        "# comment\nARG BASE=debian:12\nFROM ${BASE} AS one\nRUN a \\\n  && b\nFROM one AS two\nUSER 1:1\n"
    )
    assert stages["one"].base == "debian:12"
    assert stages["one"].all("RUN") == ["a && b"]
    assert stages["two"].base == "one"
    assert stages["two"].all("USER") == ["1:1"]


def test_the_local_venv_takes_the_images_path_in_its_scripts_and_configuration(
    manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """make_venv runs venv_commands under the build's root, then rewrites the build folder to the
    image's path in pyvenv.cfg and the scripts (pip writes the interpreter's path into their first
    line), leaving binaries alone."""
    ran: list[list[str]] = []
    environments: list[dict[str, str]] = []
    venv = tmp_path / manifest.venv.lstrip("/")

    def fake_run(argv: list[object], *, env: dict[str, str], **_: object) -> str:
        command = [str(a) for a in argv]
        ran.append(command)
        environments.append(env)
        if "venv" in command:
            (venv / "bin").mkdir(parents=True)
            (venv / "pyvenv.cfg").write_text(f"home = /usr/bin\ncommand = {' '.join(command)}\n")
            (venv / "bin" / "tessera-driver").write_text(f"#!{venv}/bin/python\nimport sys\n")
            (venv / "bin" / "python").write_bytes(b"\x7fELF" + str(venv).encode())
        return ""

    monkeypatch.setattr(product_images, "run_checked", fake_run)
    wheel = tmp_path / "tessera-0.1.0-cp311-cp311-linux_x86_64.whl"
    constraints = tmp_path / "constraints.txt"
    product_images.make_venv(manifest, tmp_path, wheel, constraints)
    assert ran == product_images.venv_commands(manifest, str(venv), str(wheel), str(constraints))
    assert manifest.build_env
    for env in environments:
        assert set(manifest.build_env) <= {f"{name}={value}" for name, value in env.items()}
    config = (venv / "pyvenv.cfg").read_text()
    assert f"command = {manifest.python} -m venv --copies {manifest.venv}\n" in config
    assert (venv / "bin" / "tessera-driver").read_text().startswith(f"#!{manifest.venv}/bin/python\n")
    assert (venv / "bin" / "python").read_bytes() == b"\x7fELF" + str(venv).encode()


def test_the_local_build_context_leaves_out_what_dockerignore_does() -> None:
    """Top-level folders .dockerignore names are not copied (nor part of the cache digest): all of the
    development tree, and never the product's package."""
    left_out = product_images.ignored_folders()
    assert {"tests", "docs", "charts", "examples", "dev", "testbed", "simgpu", "demo", "tools"} <= left_out
    assert "tessera" not in left_out
    files = product_images.context_files()
    assert not [name for name in files if name.split("/", 1)[0] in left_out]
    assert "tessera/driver/daemon.py" in files
    assert {"setup.py", "pyproject.toml", "README.md", "MANIFEST.in"} <= set(files)


def test_a_second_build_changes_the_version_and_nothing_else(tmp_path: Path) -> None:
    """The upgrade test's first build is this tree at another version: the copy's pyproject.toml
    names it, the images are tagged with it, and what the images are made of is digested with it."""
    pyproject = tmp_path / "pyproject.toml"
    original = (product_images.REPO / "pyproject.toml").read_text()
    pyproject.write_text(original)
    product_images.set_version(pyproject, "0.1.0.dev0")
    changed = pyproject.read_text()
    assert 'version = "0.1.0.dev0"\n' in changed
    assert (
        changed.replace('version = "0.1.0.dev0"\n', f'version = "{product_images.project_version()}"\n')
        == original
    )
    image = product_images.load_manifest().images["driver"]
    assert product_images.reference(image, "0.1.0.dev0").endswith(":0.1.0.dev0")
