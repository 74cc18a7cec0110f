"""Builds the π tokenizer's C kernel (matrixctl/_pi_kernel.c); everything else is pyproject.toml.

The kernel uses only the CPython C API and the C standard library, so the machine's C compiler
is the one requirement (`pip install -e .` builds it). docs/benchmarks.md says why it is C.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "matrixctl._pi_kernel",
            sources=["matrixctl/_pi_kernel.c"],
            extra_compile_args=["-O2", "-std=c11"],
        )
    ]
)
