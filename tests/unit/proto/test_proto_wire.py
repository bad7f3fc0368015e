"""Our .proto files describe the very wire format the kubelet v1.37.2 speaks.

Both our files and the kubelet module's own copies (k8s.io/kubelet@v0.37.2, from the Go module
proxy) are compiled with grpcio-tools' protoc into descriptors, and everything that reaches the
wire is compared: package, services and methods (types, streaming), messages, fields (names,
numbers, types, repeated/optional/map, oneofs) and enum values. Comments, options (go_package) and
file names are not compared: they never reach the wire.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from tessera.proto.generate import PACKAGE_PATH, proto_files, run_protoc

KUBELET_MODULE = "k8s.io/kubelet@v0.37.2"

#: Our folder below proto/ -> the kubelet module's folder below pkg/apis/.
UPSTREAM = {
    "dra/v1": "dra/v1",
    "dra/v1beta1": "dra/v1beta1",
    "health/v1": "dra-health/v1",
    "health/v1alpha1": "dra-health/v1alpha1",
    "registration/v1": "pluginregistration/v1",
}

#: (label, number, type[, value type] or oneof): what a field puts on the wire.
FieldShape = tuple[object, ...]
#: (request type, response type, client streaming, server streaming).
MethodShape = tuple[str, str, bool, bool]


@dataclass(frozen=True)
class Shape:
    """What decides the bytes on the wire and the gRPC method paths; full names start with a dot."""

    syntax: str
    package: str
    services: dict[str, dict[str, MethodShape]]
    messages: dict[str, dict[str, FieldShape]]
    enums: dict[str, dict[str, int]]


@pytest.fixture(scope="module")
def kubelet_apis(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pkg/apis`` of the kubelet module, downloaded (or found in the module cache) by go itself."""
    go = shutil.which("go")
    if go is None:
        pytest.skip(f"go is not installed: cannot download {KUBELET_MODULE} to compare the .proto files with")
    result = subprocess.run(
        [go, "mod", "download", "-json", KUBELET_MODULE],
        cwd=tmp_path_factory.mktemp("gomod"),  # outside any go.mod
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"go mod download {KUBELET_MODULE} failed:\n{result.stdout}{result.stderr}"
    return Path(json.loads(result.stdout)["Dir"]) / "pkg" / "apis"


def load_descriptor(path: Path) -> descriptor_pb2.FileDescriptorProto:
    files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes()).file
    assert len(files) == 1, [file.name for file in files]  # neither side imports anything
    return files[0]


def ours(folder: str, tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    out = tmp_path / "ours.pb"
    run_protoc([f"--descriptor_set_out={out}", "--include_imports", f"{PACKAGE_PATH}/{folder}/api.proto"])
    return load_descriptor(out)


def theirs(apis: Path, folder: str, tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    out = tmp_path / "theirs.pb"
    argv = ["protoc", f"--proto_path={apis / folder}", f"--descriptor_set_out={out}", "--include_imports"]
    assert protoc.main([*argv, "api.proto"]) == 0
    return load_descriptor(out)


def type_of(field: descriptor_pb2.FieldDescriptorProto) -> str:
    return str(field.type_name or descriptor_pb2.FieldDescriptorProto.Type.Name(field.type))


def shape_of_field(
    field: descriptor_pb2.FieldDescriptorProto,
    message: descriptor_pb2.DescriptorProto,
    map_entries: dict[str, descriptor_pb2.DescriptorProto],
) -> FieldShape:
    entry = map_entries.get(field.type_name)
    if entry is not None:
        key, value = entry.field
        return ("map", field.number, type_of(key), type_of(value))
    if field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
        label = "repeated"
    elif field.proto3_optional:
        label = "optional"  # explicit presence: HasField works
    else:
        label = "singular"
    oneof = message.oneof_decl[field.oneof_index].name if field.HasField("oneof_index") else None
    return (label, field.number, type_of(field), None if field.proto3_optional else oneof)


def shape_of_method(method: descriptor_pb2.MethodDescriptorProto) -> MethodShape:
    return (
        str(method.input_type),
        str(method.output_type),
        bool(method.client_streaming),
        bool(method.server_streaming),
    )


def shape(file: descriptor_pb2.FileDescriptorProto) -> Shape:
    prefix = f".{file.package}"
    messages: dict[str, dict[str, FieldShape]] = {}
    enums: dict[str, dict[str, int]] = {}

    def add_enums(scope: str, declared: list[descriptor_pb2.EnumDescriptorProto]) -> None:
        for enum in declared:
            enums[f"{scope}.{enum.name}"] = {value.name: value.number for value in enum.value}

    def add_messages(scope: str, declared: list[descriptor_pb2.DescriptorProto]) -> None:
        for message in declared:
            name = f"{scope}.{message.name}"
            if message.options.map_entry:
                continue  # described by the map field that uses it
            nested = list(message.nested_type)
            entries = {f"{name}.{entry.name}": entry for entry in nested if entry.options.map_entry}
            messages[name] = {field.name: shape_of_field(field, message, entries) for field in message.field}
            add_messages(name, nested)
            add_enums(name, list(message.enum_type))

    add_messages(prefix, list(file.message_type))
    add_enums(prefix, list(file.enum_type))
    services = {
        f"{file.package}.{service.name}": {method.name: shape_of_method(method) for method in service.method}
        for service in file.service
    }
    return Shape(file.syntax, file.package, services, messages, enums)


def test_every_proto_file_has_an_upstream_copy_to_compare_with() -> None:
    assert proto_files() == [f"{PACKAGE_PATH}/{folder}/api.proto" for folder in sorted(UPSTREAM)]


@pytest.mark.parametrize("folder", sorted(UPSTREAM))
def test_proto_file_matches_the_kubelet_module_field_by_field(
    folder: str, kubelet_apis: Path, tmp_path: Path
) -> None:
    assert shape(ours(folder, tmp_path)) == shape(theirs(kubelet_apis, UPSTREAM[folder], tmp_path))


def test_the_comparison_sees_share_id_and_streaming(tmp_path: Path) -> None:
    """The shape keeps what tells the versions apart, so an equal shape means an equal wire format."""
    v1 = shape(ours("dra/v1", tmp_path))
    v1beta1 = shape(ours("dra/v1beta1", tmp_path))
    health = shape(ours("health/v1", tmp_path))
    share_id = v1.messages[".k8s.io.kubelet.pkg.apis.dra.v1.Device"]["share_id"]
    assert share_id == ("optional", 5, "TYPE_STRING", None)
    assert "share_id" not in v1beta1.messages[".k8s.io.kubelet.pkg.apis.dra.v1beta1.Device"]
    assert v1.messages[".k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesResponse"]["claims"] == (
        "map",
        1,
        "TYPE_STRING",
        ".k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourceResponse",
    )
    assert health.services["v1.DRAResourceHealth"]["NodeWatchResources"] == (
        ".v1.NodeWatchResourcesRequest",
        ".v1.NodeWatchResourcesResponse",
        False,
        True,
    )
    assert health.enums[".v1.HealthStatus"] == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


@pytest.mark.parametrize(
    ("folder", "upstream_types", "supported_version"),
    [
        ("dra/v1", "dra/v1/types.go", "v1.DRAPlugin"),
        ("dra/v1beta1", "dra/v1beta1/types.go", "v1beta1.DRAPlugin"),
        ("health/v1", "dra-health/v1/types.go", "v1.DRAResourceHealth"),
        ("health/v1alpha1", "dra-health/v1alpha1/types.go", "v1alpha1.DRAResourceHealth"),
    ],
)
def test_supported_versions_entry_is_last_package_component_dot_service(
    folder: str, upstream_types: str, supported_version: str, kubelet_apis: Path, tmp_path: Path
) -> None:
    """What a plugin lists in PluginInfo.supported_versions, as the kubelet module's constants say."""
    file = ours(folder, tmp_path)
    [service] = file.service
    assert f"{file.package.rsplit('.', 1)[-1]}.{service.name}" == supported_version
    constants = re.findall(r'Service\s*=\s*"([^"]+)"', (kubelet_apis / upstream_types).read_text())
    assert constants == [supported_version]
