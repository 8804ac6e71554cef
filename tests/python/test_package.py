"""The package itself: host_array, importing without the library, its pyproject (install_test.py,
ctest python_install, builds and installs it), and the examples (run against the test node; the
README's copy kept identical)."""

from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from kvnode_procs import ROOT

import kvnode

PYTHON_DIR = ROOT / "python"
EXAMPLE = PYTHON_DIR / "examples" / "store_load.py"


def child_env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PYTHON_DIR), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


# ---- host_array ---------------------------------------------------------------------------------

def test_host_array_is_zeroed_contiguous_and_writable():
    a = kvnode.host_array((4, 3, 5), np.float16)
    assert a.shape == (4, 3, 5) and a.dtype == np.float16
    assert a.flags.c_contiguous and a.flags.writeable
    assert not a.any()
    a[...] = 2.5
    assert (a == 2.5).all()
    assert a.ctypes.data % 4096 == 0  # page-aligned: the node maps it
    b = kvnode.host_array(7, "uint8")
    assert b.shape == (7,)


def test_host_array_memory_lives_as_long_as_a_view():
    a = kvnode.host_array((1024, 1024), np.uint8)
    view = a[512:]
    view[...] = 7
    del a
    gc.collect()
    assert (view == 7).all()  # still mapped: the view holds the memory


def test_host_array_arguments():
    with pytest.raises(ValueError, match="shape"):
        kvnode.host_array((2, -1), np.float16)
    with pytest.raises(ValueError, match="shape"):
        kvnode.host_array((0, 8), np.float16)
    with pytest.raises(TypeError, match="shape"):
        kvnode.host_array("big", np.float16)
    with pytest.raises(TypeError, match="dtype"):
        kvnode.host_array((2,), object)
    with pytest.raises(TypeError, match="dtype"):
        kvnode.host_array((2,), "no-such-dtype")


@pytest.mark.parametrize("shape, dtype", [
    ((2**40, 2**40), np.uint8),  # 2**80 bytes: past size_t
    ((2**62, 4), np.float32),  # 2**66 bytes
    ((2**31, 2**31, 2), np.float16),  # 2**64 bytes: size_t wraps to 0
])
def test_host_array_bytes_that_overflow_name_shape(shape, dtype):
    with pytest.raises(ValueError, match="shape"):
        kvnode.host_array(shape, dtype)


# ---- importing and finding the library ----------------------------------------------------------

def test_import_needs_no_library_and_connect_says_where_it_looked():
    code = (
        "import kvnode\n"
        "try:\n"
        "    kvnode.connect('/tmp/x.sock')\n"
        "except kvnode.Error as e:\n"
        "    print(e.status, '|', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_env(KVNODE_CLIENT_LIB="/nonexistent/libkvnode_client.so"),
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("not_found |"), out.stdout
    assert "/nonexistent/libkvnode_client.so" in out.stdout
    assert "KVNODE_CLIENT_LIB" in out.stdout


def test_a_copy_outside_the_tree_lists_every_place(tmp_path):
    import ctypes.util

    if ctypes.util.find_library("kvnode_client"):
        pytest.skip("an installed libkvnode_client would be found")
    shutil.copytree(PYTHON_DIR / "kvnode", tmp_path / "kvnode")
    env = {k: v for k, v in os.environ.items() if k != "KVNODE_CLIENT_LIB"}
    env["PYTHONPATH"] = str(tmp_path)
    code = "import kvnode\ntry:\n    kvnode.host_array(4, 'uint8')\nexcept kvnode.Error as e:\n" \
           "    print(e)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    for place in ("$KVNODE_CLIENT_LIB (not set)", "kvnode/_native/libkvnode_client.so",
                  "find_library", "build/client/libkvnode_client.so"):
        assert place in out.stdout, out.stdout


STRUCTS = {  # ctypes mirror -> C type
    "ErrorStruct": "kvnode_error_t",
    "ConnectParams": "kvnode_connect_params_t",
    "NodeInfo": "kvnode_node_info_t",
    "KvAllocation": "kvnode_kv_allocation_t",
    "KvBuffer": "kvnode_kv_buffer_t",
    "KvRegisterParams": "kvnode_kv_register_params_t",
    "KvTransferParams": "kvnode_kv_transfer_params_t",
    "KvResult": "kvnode_kv_result_t",
    "KvStrides": "kvnode_kv_strides_t",
    "PrefixInfo": "kvnode_prefix_info_t",
}


CONSTANTS = {  # _lib's name -> the header's
    "API_VERSION": "KVNODE_CLIENT_API_VERSION",
    "OK": "KVNODE_OK",
    "ERR_INVALID": "KVNODE_ERR_INVALID",
    "ERR_NOT_FOUND": "KVNODE_ERR_NOT_FOUND",
    "ERROR_MESSAGE_BYTES": "KVNODE_ERROR_MESSAGE_BYTES",
    "NAME_BYTES": "KVNODE_NAME_BYTES",
    "CONNECT_FIELD_TIMEOUT": "KVNODE_CONNECT_FIELD_TIMEOUT",
    "CONNECT_FIELD_SHARED_MEMORY": "KVNODE_CONNECT_FIELD_SHARED_MEMORY",
    "KV_XFER_FIELD_RETRIEVE": "KVNODE_KV_XFER_FIELD_RETRIEVE",
    "KV_XFER_FIELD_WAIT_EVENT": "KVNODE_KV_XFER_FIELD_WAIT_EVENT",
    "KV_XFER_FIELD_DONE_EVENT": "KVNODE_KV_XFER_FIELD_DONE_EVENT",
    "NODE_INFO_FIELD_CHUNK_BYTES": "KVNODE_NODE_INFO_FIELD_CHUNK_BYTES",
    "NODE_INFO_FIELD_CHUNK_SIZE": "KVNODE_NODE_INFO_FIELD_CHUNK_SIZE",
    "NODE_INFO_FIELD_PAGES": "KVNODE_NODE_INFO_FIELD_PAGES",
    "NODE_INFO_FIELD_WORKER_ID": "KVNODE_NODE_INFO_FIELD_WORKER_ID",
    "NODE_INFO_FIELD_MEMORY": "KVNODE_NODE_INFO_FIELD_MEMORY",
    "NODE_INFO_FIELD_INSTANCE": "KVNODE_NODE_INFO_FIELD_INSTANCE",
    "NODE_INFO_FIELD_LOCATION": "KVNODE_NODE_INFO_FIELD_LOCATION",
    "NODE_INFO_FIELD_SAVE_UNFULL_CHUNK": "KVNODE_NODE_INFO_FIELD_SAVE_UNFULL_CHUNK",
    "NODE_INFO_FIELDS_ALL": "KVNODE_NODE_INFO_FIELDS_ALL",
    "KV_RESULT_FIELD_CHUNKS": "KVNODE_KV_RESULT_FIELD_CHUNKS",
    "KV_RESULT_FIELD_TOKENS": "KVNODE_KV_RESULT_FIELD_TOKENS",
    "KV_RESULT_FIELD_PULLED": "KVNODE_KV_RESULT_FIELD_PULLED",
    "KV_RESULT_FIELDS_ALL": "KVNODE_KV_RESULT_FIELDS_ALL",
    "KV_STRIDED": "KVNODE_KV_STRIDED",
    "KV_MLA_STRIDED": "KVNODE_KV_MLA_STRIDED",
    "KV_REGISTER_FIELD_STRIDES": "KVNODE_KV_REGISTER_FIELD_STRIDES",
    "PREFIX_FIELDS_ALL": "KVNODE_PREFIX_FIELDS_ALL",
    "MEMORY_HOST_FD": "KVNODE_MEMORY_HOST_FD",
    "MEMORY_CUDA_IPC": "KVNODE_MEMORY_CUDA_IPC",
    "MEMORY_CUDA_VMM": "KVNODE_MEMORY_CUDA_VMM",
    "KV_VLLM": "KVNODE_KV_VLLM",
    "KV_FLASHINFER": "KVNODE_KV_FLASHINFER",
    "KV_MLA": "KVNODE_KV_MLA",
    "KV_SGLANG": "KVNODE_KV_SGLANG",
}


def test_the_structs_and_constants_match_the_header(tmp_path):
    """Every struct's size, every field's offset and every constant, as a C99 compiler reads the
    header; and the status names as the library spells them."""
    import ctypes

    from kvnode import _lib

    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    lines, want = [], []
    for mirror, c_type in STRUCTS.items():
        struct = getattr(_lib, mirror)
        lines.append(f'  printf("%zu\\n", sizeof({c_type}));')
        want.append(f"{c_type} size {ctypes.sizeof(struct)}")
        for name, *_ in struct._fields_:
            lines.append(f'  printf("%zu\\n", offsetof({c_type}, {name}));')
            want.append(f"{c_type}.{name} at {getattr(struct, name).offset}")
    for mirror, c_name in CONSTANTS.items():
        lines.append(f'  printf("%lld\\n", (long long)({c_name}));')
        want.append(f"{c_name} = {getattr(_lib, mirror)}")
    source = tmp_path / "layout.c"
    source.write_text("#include <stddef.h>\n#include <stdio.h>\n#include <kvnode/kvnode_client.h>\n"
                      "int main(void) {\n" + "\n".join(lines) + "\n  return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-I", str(ROOT / "client/include"),
                    str(source), "-o", str(exe)], check=True, timeout=120)
    got = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    c_said = [re.sub(r"-?\d+$", value, line) for line, value in zip(want, got)]
    assert c_said == want
    lib = _lib.library()
    for code, name in _lib.STATUS_NAMES.items():
        assert lib.kvnode_status_string(code).decode() == name


def test_the_header_and_the_bindings_name_the_same_functions():
    header = (ROOT / "client/include/kvnode/kvnode_client.h").read_text()
    declared = set(re.findall(r"\b(kvnode_[a-z_]+)\(", header))
    from kvnode import _lib

    assert declared == set(_lib._PROTOTYPES), declared ^ set(_lib._PROTOTYPES)


def test_the_header_says_for_every_function_how_threads_may_call_it():
    """Each function's comment (the last one before its declaration: its own, or its group's)
    states its thread safety: thread-safe, one call at a time per client, or what must not run
    at the same time."""
    header = (ROOT / "client/include/kvnode/kvnode_client.h").read_text()
    said = re.compile(r"thread-safe|one call at a time|at the same time", re.IGNORECASE)
    unsaid = []
    for m in re.finditer(r"\b(kvnode_[a-z_]+)\(", header):
        before = header[:m.start()]
        comment = before[before.rfind("/*"):before.rfind("*/")]
        if not said.search(comment):
            unsaid.append(m.group(1))
    assert not unsaid, f"no thread-safety statement before: {unsaid}"


# ---- packaging ----------------------------------------------------------------------------------

def test_the_pyproject_builds_the_library_and_depends_on_numpy_alone():
    """`pip install ./python` compiles libkvnode_client.so with the repository's CMake in its
    client-only mode (scikit-build-core) and needs numpy, as a range; engines bring torch."""
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((PYTHON_DIR / "pyproject.toml").read_text())
    assert pyproject["build-system"]["build-backend"] == "scikit_build_core.build"
    assert pyproject["project"]["version"] == kvnode.__version__
    dependencies = pyproject["project"]["dependencies"]
    assert [re.match(r"[\w.-]+", d).group() for d in dependencies] == ["numpy"]
    assert "==" not in dependencies[0]
    skbuild = pyproject["tool"]["scikit-build"]
    assert skbuild["cmake"]["source-dir"] == ".."
    assert skbuild["cmake"]["define"]["KVNODE_PYTHON_PACKAGE"] == "ON"


# ---- examples -----------------------------------------------------------------------------------

def test_the_readme_shows_the_example_as_it_is():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### From Python", 1)
    assert len(section) == 2, "README.md has no 'From Python' section"
    block = re.search(r"```python\n(.*?)```", section[1], re.DOTALL)
    assert block, "the 'From Python' section has no python block"
    assert block.group(1) == EXAMPLE.read_text()


def test_the_example_runs_against_a_node(cluster):
    out = subprocess.run([sys.executable, str(EXAMPLE), cluster.b.socket], capture_output=True,
                         text=True, env=child_env(), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "stored 64 tokens, loaded 64 into blocks 40-43"
