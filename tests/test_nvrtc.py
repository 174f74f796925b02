"""The plugins' compilers: nvcc where it is found (PATH, then $CUDA_HOME/bin), else NVRTC.

NVRTC is what the launchers use on a JetPack install whose /usr/local/cuda/bin is not on PATH, or in an image
with cuda-python's wheels and no toolkit; it has no C library headers. CI's resource table
(tools/compile_kernels.py) checks the sources with nvcc only, so every source is compiled with NVRTC here and
must define the same kernels as nvcc's cubin.
"""

import os
import shutil
import struct

import pytest

from edgesdk.kernels import _cuda, bitmap_linear, sparse_kv, vitbit_gemm

MODS = {"bitmap_linear": bitmap_linear, "vitbit_gemm": vitbit_gemm, "sparse_kv": sparse_kv}


def _nvrtc_major():
    try:
        from cuda.bindings import nvrtc

        return _cuda.check(nvrtc.nvrtcVersion())[0]
    except Exception:
        return None


MAJOR = _nvrtc_major()
HAVE_NVRTC = MAJOR is not None and _cuda.cuda_include_dir(MAJOR) is not None
needs_nvrtc = pytest.mark.skipif(not HAVE_NVRTC, reason="needs cuda-python's NVRTC (extra [gpu]) and the CUDA "
                                                        "headers (a toolkit in $CUDA_HOME or NVIDIA's runtime wheel)")


def functions(cubin: bytes) -> set[str]:
    """Names of the STT_FUNC symbols of an ELF64 little-endian cubin that are not mangled: its ``extern "C"``
    kernels (device functions left out of line are mangled with a per-compilation hash)."""
    assert cubin[:4] == b"\x7fELF" and cubin[4] == 2 and cubin[5] == 1, "not an ELF64 little-endian file"
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _, sh_type, _, _, off, size, link, _, _, entsize in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        str_off = sections[link][4]
        for j in range(size // entsize):
            st_name, st_info = struct.unpack_from("<IB", cubin, off + j * entsize)
            if st_info & 0xF == 2:  # STT_FUNC
                end = cubin.index(b"\0", str_off + st_name)
                names.add(cubin[str_off + st_name:end].decode())
    return {n for n in names if not n.startswith(("_Z", "$"))}


@needs_nvrtc
@pytest.mark.parametrize("op", list(MODS))
def test_every_plugin_source_compiles_with_nvrtc(op, tmp_path, monkeypatch):
    """A source that includes a C library header (<stdint.h>: the first version here) compiles with nvcc but
    not with NVRTC, i.e. not on a stock JetPack venv. The NVRTC cubin defines the same functions as nvcc's."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path))
    src = _cuda.PLUGINS_DIR / MODS[op].SOURCE
    got = functions(_cuda.compile_cubin(src, "sm_87", compiler="nvrtc"))
    assert got, "no extern \"C\" kernel in the NVRTC cubin"
    assert _cuda.cubin_path(src, "sm_87", compiler="nvrtc").is_file()
    if _cuda.find_nvcc() is not None:
        assert got == functions(_cuda.compile_cubin(src, "sm_87", compiler="nvcc"))


def test_the_cache_key_names_the_compiler(monkeypatch, tmp_path):
    """Cubins from another toolkit (an image built elsewhere, an upgraded JetPack) are not reused."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path))
    src = _cuda.PLUGINS_DIR / sparse_kv.SOURCE
    monkeypatch.setattr(_cuda, "compiler_id", lambda compiler=None: "nvcc 12.6.68")
    a = _cuda.cubin_path(src, "sm_87")
    monkeypatch.setattr(_cuda, "compiler_id", lambda compiler=None: "nvcc 13.0.88")
    b = _cuda.cubin_path(src, "sm_87")
    monkeypatch.setattr(_cuda, "compiler_id", lambda compiler=None: "nvrtc 12.6")
    c = _cuda.cubin_path(src, "sm_87")
    assert len({a, b, c}) == 3 and all(p.parent == tmp_path / "cubin" for p in (a, b, c))


def test_nvcc_is_found_in_cuda_home_when_not_on_path(monkeypatch, tmp_path):
    """JetPack installs nvcc as /usr/local/cuda/bin/nvcc without putting it on PATH."""
    fake = tmp_path / "cuda" / "bin" / "nvcc"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.6, V12.6.68'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert _cuda.find_nvcc() == str(fake)
    assert _cuda.compiler_id() == "nvcc 12.6.68"
    fake.chmod(0o644)  # not executable: not taken
    assert _cuda.find_nvcc() is None
    with pytest.raises(RuntimeError, match="nvcc is neither on PATH"):
        _cuda.compiler_id("nvcc")


@needs_nvrtc
def test_nvrtc_without_cuda_headers_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path))
    monkeypatch.setattr(_cuda, "cuda_include_dir", lambda major: None)
    with pytest.raises(RuntimeError, match=r"needs the CUDA headers \(cuda_fp16.h\).*set CUDA_HOME"):
        _cuda.compile_cubin(_cuda.PLUGINS_DIR / sparse_kv.SOURCE, "sm_87", compiler="nvrtc")


def test_compiler_choice_is_checked():
    with pytest.raises(ValueError, match="compiler must be"):
        _cuda.compile_cubin(_cuda.PLUGINS_DIR / sparse_kv.SOURCE, "sm_87", compiler="clang")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to make a cubin (CI has it)")
def test_functions_reads_an_nvcc_cubin(tmp_path):
    """The ELF reader above, on a cubin nvcc makes from a two-kernel source."""
    cu = tmp_path / "k.cu"
    cu.write_text('extern "C" __global__ void alpha(int* p) { p[0] = 1; }\n'
                  'extern "C" __global__ void beta(float* p) { p[threadIdx.x] = 2.f; }\n')
    out = tmp_path / "k.cubin"
    assert os.system(f"nvcc -cubin -arch=sm_87 -o {out} {cu}") == 0
    assert {"alpha", "beta"} <= functions(out.read_bytes())


def test_nvrtc_takes_the_headers_of_its_own_cuda_version(monkeypatch, tmp_path):
    """NVRTC 12.6 from a wheel beside a CUDA 13 toolkit compiles against the 12.x wheel's headers."""
    import sys
    import types

    def headers(d, version):
        d.mkdir(parents=True)
        (d / "cuda_fp16.h").write_text("")
        (d / "cuda.h").write_text(f"#define CUDA_VERSION {version}\n")
        return d

    toolkit = headers(tmp_path / "cuda" / "include", 13000)
    wheel12 = headers(tmp_path / "site" / "nvidia" / "cuda_runtime" / "include", 12060)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setitem(sys.modules, "nvidia", types.SimpleNamespace(__path__=[str(tmp_path / "site" / "nvidia")]))
    assert _cuda.cuda_include_dir(12) == wheel12
    assert _cuda.cuda_include_dir(13) == toolkit
    assert _cuda.cuda_include_dir(14) == toolkit  # none of its version: the first there is
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    assert _cuda.cuda_include_dir(13) is None


@pytest.mark.parametrize("threads", [1, 6])
def test_both_compilers_split_their_work_over_the_cpus(threads, monkeypatch, tmp_path):
    """--split-compile=<CPUs> goes to nvcc and to NVRTC for the sources whose SASS it leaves as it is
    (tools/split_compile_check.py), none for one CPU or another source; it is not part of the cache key."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_cuda, "compile_threads", lambda: threads)
    assert _cuda.SPLIT_COMPILE == {vitbit_gemm.SOURCE.split("/")[-1], bitmap_linear.SOURCE.split("/")[-1]}
    src = _cuda.PLUGINS_DIR / vitbit_gemm.SOURCE
    fake = tmp_path / "cuda" / "bin" / "nvcc"  # records its arguments, writes the -o file
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n"
                    "case \"$1\" in --version) echo 'Cuda compilation tools, release 12.6, V12.6.68'; exit 0;; esac\n"
                    f"echo \"$@\" > {tmp_path / 'args'}\n"
                    "while [ $# -gt 0 ]; do [ \"$1\" = -o ] && printf nvcc > \"$2\"; shift; done\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    key = _cuda.cubin_path(src, "sm_87", compiler="nvcc")
    assert _cuda.compile_cubin(src, "sm_87", compiler="nvcc") == b"nvcc" and key.is_file()
    args = (tmp_path / "args").read_text().split()
    assert args[:2] == ["-cubin", "-arch=sm_87"]
    assert [a for a in args if "split-compile" in a] == ([f"--split-compile={threads}"] if threads > 1 else [])
    seen = []
    monkeypatch.setattr(_cuda, "_nvrtc_compile", lambda src, name, arch, options: seen.extend(options) or b"nvrtc")
    monkeypatch.setattr(_cuda, "_nvrtc_version", lambda: "12.6")
    assert _cuda.compile_cubin(src, "sm_87", compiler="nvrtc") == b"nvrtc"
    assert [a for a in seen if "split-compile" in a] == ([f"-split-compile={threads}"] if threads > 1 else [])
    seen.clear()  # sparse_kv.cu: always whole (split compilation changes its code)
    assert _cuda.compile_cubin(_cuda.PLUGINS_DIR / sparse_kv.SOURCE, "sm_87", compiler="nvrtc") == b"nvrtc"
    assert seen and not [a for a in seen if "split-compile" in a]
    monkeypatch.setattr(_cuda, "compile_threads", lambda: 1 if threads > 1 else 6)
    assert _cuda.cubin_path(src, "sm_87", compiler="nvcc") == key


def test_compile_threads_are_the_cpus_this_process_may_use(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert _cuda.compile_threads() == 3
