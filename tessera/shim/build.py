"""Build the enforcement shim: the cffi binding of the shared formats and the preload libraries.

Two products, one set of C sources (tessera/shim/src, tessera/shim/include/tessera_shim.h):

* ``tessera.shim._format`` - a cffi extension module compiling ``limits.c``, ``region.c``,
  ``priority_board.c`` and ``region_read.c`` (the exporter's copy-only reader), so the driver
  (writing limits files, creating usage regions and priority boards), the exporter (reading them)
  and the tests use the very code the shim uses. ``setup.py`` names :data:`ffibuilder` in
  ``cffi_modules``.
* ``libtessera-cuda.so`` (soname ``libcuda.so.1``) and ``libtessera-nvml.so`` (soname
  ``libnvidia-ml.so.1``) - the preload libraries. They do not link Python. Each carries a
  ``DT_NEEDED`` on an alias (``libcuda-real.so.1``, ``libnvidia-ml-real.so.1``) found through a
  ``$ORIGIN`` runpath; at run time a symlink of that name beside the library points at the real
  driver (docs/shim.md, "How calls reach the shim").

Run as a script to build both in place (``python tessera/shim/build.py``); ``setup.py`` runs the same
functions during the package build.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from cffi import FFI

SHIM_DIR = Path(__file__).resolve().parent
REPO = SHIM_DIR.parents[1]
INCLUDE_DIRS = [SHIM_DIR / "include", SHIM_DIR / "src", REPO / "include" / "cuda-abi"]
LIB_DIR = SHIM_DIR / "lib"

CFLAGS = [
    "-std=gnu11",
    "-O2",
    "-g",
    "-fPIC",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-fvisibility=hidden",
    "-fno-semantic-interposition",
    "-D_GNU_SOURCE",
]

FORMAT_SOURCES = ["create_once.c", "limits.c", "region.c", "priority_board.c"]
READER_SOURCES = ["region_read.c"]
"""Only the binding compiles these: the exporter's reader, which no preload library needs."""
CUDA_SOURCES = [
    *FORMAT_SOURCES,
    "log.c",
    "real.c",
    "ptrtable.c",
    "keylock.c",
    "mounts.c",
    "limits_source.c",
    "shim_state.c",
    "memory.c",
    "pools.c",
    "compute.c",
    "priority.c",
    "cuda_capture_hooks.c",
    "cuda_memory_hooks.c",
    "cuda_launch_hooks.c",
    "graph_mem.c",
    "cuda_graph_hooks.c",
    "procaddr.c",
]
NVML_SOURCES = [*FORMAT_SOURCES, "log.c", "mounts.c", "limits_source.c", "nvml_hooks.c"]

CUDA_LIBRARY = "libtessera-cuda.so"
NVML_LIBRARY = "libtessera-nvml.so"
CUDA_ALIAS = "libcuda-real.so.1"
NVML_ALIAS = "libnvidia-ml-real.so.1"

# --------------------------------------------------------------------------- cffi binding ---

ffibuilder = FFI()
ffibuilder.cdef(
    """
    #define TESSERA_MAX_GPUS 16
    #define TESSERA_UUID_MAX 80
    #define TESSERA_REGION_SLOTS 1024
    #define TESSERA_LIMITS_MAX_BYTES 65536
    #define TESSERA_LIMITS_VERSION 1
    #define TESSERA_EXIT_BAD_LIMITS 78
    #define TESSERA_OOM_WAIT_NS ...
    #define TESSERA_SLOT_ACTIVE 1
    #define TESSERA_GPU_READY 2

    #define TESSERA_PRIORITY_HIGH 0
    #define TESSERA_PRIORITY_LOW 1
    #define TESSERA_BOARD_MAX_AHEAD_NS ...
    #define TESSERA_BOARD_LINGER_NS ...

    struct tessera_gpu_limit {
        char uuid[80];
        uint64_t memory_bytes;
        uint32_t cores;
        uint32_t priority;
    };
    struct tessera_limits {
        uint32_t count;
        struct tessera_gpu_limit gpus[16];
    };
    int tessera_limits_parse(const char *text, size_t len, struct tessera_limits *out,
                             char *err, size_t errlen);
    int tessera_limits_read(const char *path, struct tessera_limits *out, char *err,
                            size_t errlen);
    int tessera_limits_format(const struct tessera_limits *limits, char *buf, size_t buflen,
                              char *err, size_t errlen);

    struct tessera_region_gpu {
        uint32_t state;
        char uuid[80];
        int64_t budget_ns;
        uint64_t refill_ns;
        uint64_t charged_ns;
        uint64_t throttled_ns;
        uint64_t launches;
        uint64_t held_ns;
        uint64_t holds;
        ...;
    };
    struct tessera_region_slot {
        uint32_t state;
        int32_t pid;
        uint64_t start_time;
        uint64_t used[16];
        ...;
    };
    struct tessera_region {
        char magic[8];
        uint32_t version;
        uint32_t size;
        uint32_t slot_hwm;
        struct tessera_region_gpu gpus[16];
        struct tessera_region_slot slots[1024];
        ...;
    };
    struct tessera_region_handle {
        struct tessera_region *map;
        int fd;
        int slot;
    };
    int tessera_region_create(const char *path, char *err, size_t errlen);
    int tessera_region_open(const char *path, struct tessera_region_handle *h, char *err,
                            size_t errlen);
    void tessera_region_close(struct tessera_region_handle *h);
    int tessera_region_gpu(struct tessera_region *r, const char *uuid);
    int tessera_region_claim_slot(struct tessera_region_handle *h);
    int tessera_region_reserve(struct tessera_region_handle *h, int gpu, uint64_t bytes,
                               uint64_t limit);
    void tessera_region_release(struct tessera_region_handle *h, int gpu, uint64_t bytes);
    uint64_t tessera_region_used(const struct tessera_region *r, int gpu);
    int tessera_region_reap(struct tessera_region_handle *h);
    struct tessera_region_view {
        struct tessera_region region;
        uint8_t live[1024];
    };
    int tessera_region_read(const char *path, struct tessera_region_view *out, char *err,
                            size_t errlen);

    struct tessera_priority_board {
        char magic[8];
        uint32_t version;
        uint32_t size;
        uint64_t heartbeat_ns;
        uint64_t busy_until_ns;
        uint64_t high_launches;
        ...;
    };
    int tessera_board_create(const char *path, char *err, size_t errlen);
    int tessera_board_read(int fd, struct tessera_priority_board *out);
    uint64_t tessera_board_hold_until(const struct tessera_priority_board *b, uint64_t now);
    int tessera_board_publish(int fd, uint64_t now, uint64_t busy_until);
    uint64_t tessera_now_ns(void);
    """
)
# The extension compiles the format code itself (included, so no object files land beside the
# sources), exactly the files the preload library links.
ffibuilder.set_source(
    "tessera.shim._format",
    "\n".join(
        ['#include "tessera_shim.h"']
        + [f'#include "{SHIM_DIR / "src" / name}"' for name in (*FORMAT_SOURCES, *READER_SOURCES)]
    ),
    include_dirs=[str(SHIM_DIR / "include")],
    extra_compile_args=["-std=gnu11", "-O2", "-D_GNU_SOURCE"],
    depends=[str(SHIM_DIR / "src" / name) for name in (*FORMAT_SOURCES, *READER_SOURCES, "fail.h")],
)

# --------------------------------------------------------------------- preload libraries ---


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{done.stdout}{done.stderr}")


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC", "cc"))


def _link(out: Path, soname: str, alias_stub: Path, objects: list[Path]) -> None:
    _run(
        [
            *_compiler(),
            "-shared",
            f"-Wl,-soname,{soname}",
            "-Wl,-z,defs",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN",
            "-Wl,-Bsymbolic",
            *map(str, objects),
            "-Wl,--no-as-needed",
            str(alias_stub),
            "-lpthread",
            "-ldl",
            "-o",
            str(out),
        ]
    )


def build_preload(out_dir: Path = LIB_DIR) -> list[Path]:
    """Compile the preload libraries into ``out_dir``; return their paths. Rebuilds only when a
    source or header is newer than the library."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = sorted((SHIM_DIR / "src").glob("*.[ch]")) + sorted(
        p for d in INCLUDE_DIRS for p in d.glob("*.h")
    )
    newest = max(p.stat().st_mtime for p in sources)
    targets = {CUDA_LIBRARY: ("libcuda.so.1", CUDA_ALIAS, CUDA_SOURCES)}
    targets[NVML_LIBRARY] = ("libnvidia-ml.so.1", NVML_ALIAS, NVML_SOURCES)
    built = []
    with tempfile.TemporaryDirectory(prefix="tessera-shim-build-") as tmp:
        work = Path(tmp)
        for name, (soname, alias, srcs) in targets.items():
            out = out_dir / name
            built.append(out)
            if out.exists() and out.stat().st_mtime >= newest:
                continue
            # The alias stub: an empty library whose only job is to give the shim a DT_NEEDED
            # entry naming the real driver's alias. It is not installed.
            stub_c = work / "stub.c"
            stub_c.write_text("/* alias stub: see shim/build.py */\n")
            stub = work / alias
            _run([*_compiler(), "-shared", "-fPIC", f"-Wl,-soname,{alias}", str(stub_c), "-o", str(stub)])
            objects = []
            for src in srcs:
                obj = work / f"{name}-{src}.o"
                includes = [f"-I{d}" for d in INCLUDE_DIRS]
                _run([*_compiler(), *CFLAGS, *includes, "-c", str(SHIM_DIR / "src" / src), "-o", str(obj)])
                objects.append(obj)
            partial = out.with_suffix(".so.tmp")
            _link(partial, soname, stub, objects)
            partial.replace(out)
    return built


def build_format_inplace() -> Path:
    """Build the cffi extension beside this file (what an editable install does), keeping the
    generated C and objects out of the source tree."""
    with tempfile.TemporaryDirectory(prefix="tessera-shim-cffi-") as tmp:
        built = Path(ffibuilder.compile(tmpdir=tmp, verbose=False))
        target = SHIM_DIR / built.name
        partial = target.with_name(target.name + ".tmp")
        partial.write_bytes(built.read_bytes())
        partial.chmod(0o755)
        partial.replace(target)
    return target


if __name__ == "__main__":
    for path in build_preload(Path(sys.argv[1]) if len(sys.argv) > 1 else LIB_DIR):
        print(path)
    print(build_format_inplace())
