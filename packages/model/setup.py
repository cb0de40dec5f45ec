"""Compiles every Cython module of the package at install time (never at run time)."""

from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(path[len("src/") : -len(".pyx")].replace("/", "."), [path])
    for path in sorted(glob("src/mds_model/**/*.pyx", recursive=True))
]
setup(ext_modules=cythonize(extensions, language_level=3) if extensions else [])
