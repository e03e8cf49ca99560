"""pip's build of the `tessera` Python package: setuptools.build_meta (pyproject.toml) with a
build_ext that builds the compiled core with CMake.

build_ext configures this tree with CMake (Ninja where it is installed, Release, no tests,
benchmarks, worker, CUDA or install rules; Python3_EXECUTABLE is the interpreter pip runs),
builds only the `tessera_python` target and copies its _tessera*.so into the wheel; build_py
adds python/tessera/*.py, the *.pyi stubs and py.typed.

Everything the build writes lies under one folder, `build-pip/` in this tree (its CMake build
tree in build-pip/temp.*/cmake, kept for incremental builds; the egg-info beside it), never in
the developer's `build/`.

Environment (read by this build script only):
  TESSERA_PY_BUILD_DIR        that folder instead of build-pip/ (a path, made absolute)
  CMAKE_ARGS                  more configure arguments, e.g. "-DCMAKE_BUILD_TYPE=RelWithDebInfo"
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: ninja's default, or pip's -j)
ccache is used as the compiler launcher when it is on PATH (unless CMAKE_ARGS names one).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUILD_BASE = Path(os.environ.get("TESSERA_PY_BUILD_DIR") or ROOT / "build-pip").resolve()
BUILD_BASE.mkdir(parents=True, exist_ok=True)  # egg_info wants its egg_base to exist


def project_version():
    """The version of CMakeLists.txt's project(tessera ... VERSION x.y.z): one source of truth."""
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(\s*tessera\b[^)]*\bVERSION\s+([0-9][0-9.]*)", text)
    if not m:
        raise RuntimeError("CMakeLists.txt: no project(tessera ... VERSION x.y.z)")
    return m.group(1)


class CMakeExtension(Extension):
    """An extension module that CMake target `target` builds (no sources for setuptools)."""

    def __init__(self, name, target):
        super().__init__(name, sources=[])
        self.target = target


class CMakeBuildExt(build_ext):
    def build_extension(self, ext):
        if not isinstance(ext, CMakeExtension):
            return super().build_extension(ext)
        cmake = shutil.which("cmake")
        if cmake is None:
            raise RuntimeError("tessera: building the module needs cmake (Debian: cmake)")
        tree = Path(self.build_temp).resolve() / "cmake"
        tree.mkdir(parents=True, exist_ok=True)
        self._configure(cmake, tree)
        build = [cmake, "--build", str(tree), "--target", ext.target]
        if "CMAKE_BUILD_PARALLEL_LEVEL" not in os.environ and self.parallel:
            build += ["--parallel", str(self.parallel)]
        subprocess.run(build, check=True)
        built = self._built_module(tree, ext)
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, dest)
        shutil.copymode(built, dest)

    def _configure(self, cmake, tree):
        args = [
            cmake, "-S", str(ROOT), "-B", str(tree),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DPython3_EXECUTABLE=" + sys.executable,
            # Only what the module links: the client, the core and tessera_coord.
            "-DTESSERA_BUILD_TESTS=OFF", "-DTESSERA_BUILD_BENCHMARKS=OFF",
            "-DTESSERA_BUILD_WORKER=OFF", "-DTESSERA_ENABLE_CUDA=OFF", "-DTESSERA_INSTALL=OFF",
            "-DTESSERA_BUILD_PYTHON=ON",
        ]
        extra = shlex.split(os.environ.get("CMAKE_ARGS", ""))
        if not (tree / "CMakeCache.txt").exists() and shutil.which("ninja"):
            args += ["-G", "Ninja"]
        if shutil.which("ccache") and not any("COMPILER_LAUNCHER" in a for a in extra):
            args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
        subprocess.run(args + extra, check=True)

    @staticmethod
    def _built_module(tree, ext):
        """The module file the target wrote (CMake names it with this interpreter's suffix)."""
        leaf = ext.name.split(".")[-1]
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        path = tree / "python" / Path(*ext.name.split(".")[:-1]) / (leaf + suffix)
        if not path.is_file():
            raise RuntimeError(
                "tessera: CMake built no %s; the configure output above says why the Python "
                "module is OFF (Debian: pybind11-dev python3-dev python3-numpy)" % path)
        return path


class FreshBuildPy(build_py):
    """build_py that first drops the package files an earlier build left in the build folder
    (kept for the CMake tree's incremental builds): a file removed from python/tessera/ must
    leave the wheel too. build_ext runs after it and copies the module in again."""

    def run(self):
        for package in self.packages or ():
            shutil.rmtree(Path(self.build_lib, *package.split(".")), ignore_errors=True)
        super().run()


setup(
    version=project_version(),
    ext_modules=[CMakeExtension("tessera._tessera", target="tessera_python")],
    cmdclass={"build_ext": CMakeBuildExt, "build_py": FreshBuildPy},
    options={
        "build": {"build_base": str(BUILD_BASE)},
        "egg_info": {"egg_base": str(BUILD_BASE)},
    },
)
