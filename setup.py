"""pip install . : builds the C++ core with CMake and ships it inside the chorus package."""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        target_dir = os.path.abspath(os.path.dirname(self.get_ext_fullpath(ext.name)))
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        os.makedirs(build_dir, exist_ok=True)
        # The TensorFlow ops too, when this Python has TensorFlow.
        has_tf = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True).returncode == 0
        subprocess.check_call([
            "cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython3_EXECUTABLE={sys.executable}", "-DCHORUS_BUILD_TESTS=OFF",
            "-DCHORUS_BUILD_EXAMPLES=OFF", "-DCHORUS_BUILD_TORCH=OFF",
            f"-DCHORUS_TF_PYTHON={sys.executable if has_tf else ''}"])
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "chorus_python_package",
                               "-j", os.environ.get("JOBS", "2")])
        os.makedirs(target_dir, exist_ok=True)
        built = os.path.join(build_dir, "python", "chorus")
        for pattern in ("_core*.so", "libchorus.so*", "libchorus_cuda.so", "chorusrun"):
            for path in glob.glob(os.path.join(built, pattern)):
                shutil.copy2(path, target_dir)
        for path in glob.glob(os.path.join(built, "tensorflow", "_chorus_tf_ops.so")):
            os.makedirs(os.path.join(target_dir, "tensorflow"), exist_ok=True)
            shutil.copy2(path, os.path.join(target_dir, "tensorflow"))


setup(
    packages=find_packages(where="python"),
    package_dir={"": "python"},
    ext_modules=[CMakeExtension("chorus._core")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
    options={"build": {"build_base": os.path.join("build", "pip")}},
)
