"""pip install ./python — the tessera package with the libtessera.so the
CMake build made (TESSERA_LIBRARY, else ../build/libtessera.so); without
one, the build is run first (cmake, as `make build` does). Offline: it
needs nothing beyond Debian's setuptools (pip install --no-build-isolation
./python, or plain pip where it does not isolate builds)."""
import glob
import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def built_library():
    env = os.environ.get("TESSERA_LIBRARY")
    if env:
        if not os.path.exists(env):
            raise SystemExit(f"TESSERA_LIBRARY={env}: no such file")
        return env
    lib = os.path.join(ROOT, "build", "libtessera.so")
    if not os.path.exists(lib):
        if not os.path.exists(os.path.join(ROOT, "CMakeLists.txt")):
            raise SystemExit("libtessera.so not found: set TESSERA_LIBRARY to the built library")
        build = os.path.join(ROOT, "build")
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release"])
        subprocess.check_call(["cmake", "--build", build, "-j", str(os.cpu_count() or 2),
                               "--target", "tessera_shared"])
    return os.path.realpath(lib)


class BuildWithLibrary(build_py):
    """Copies the shared library into the package as libtessera.so.0."""

    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "tessera", "libtessera.so.0")
        self.mkpath(os.path.dirname(dst))
        shutil.copyfile(built_library(), dst)
        os.chmod(dst, 0o755)


class BinaryDistribution(Distribution):
    """A wheel for this platform (it carries a shared library), not any."""

    def has_ext_modules(self):
        return True


def version():
    for line in open(os.path.join(HERE, "tessera", "__init__.py")):
        if line.startswith("__version__"):
            return line.split('"')[1]
    return "0"


setup(
    name="tessera",
    version=version(),
    description="Tessera from Python: tensors, models, serving, training, and PyTorch modules on Tessera's devices",
    packages=["tessera", "tessera.torch"],
    python_requires=">=3.9",
    install_requires=[],
    extras_require={"torch": ["torch"], "numpy": ["numpy"]},
    cmdclass={"build_py": BuildWithLibrary},
    distclass=BinaryDistribution,
    zip_safe=False,
)
