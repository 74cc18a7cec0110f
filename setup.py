"""Builds the C kernels of the π and SCX tokenizers (matrixctl/_pi_kernel.c, _scx_kernel.c),
the CRC-32C of the zTensor digests (matrixctl/_crc_kernel.c), the strict CBOR decoders of the
zTensor manifests (matrixctl/_cbor_kernel.c), the JSON Lines text-field extractor of
`ingest docs` (matrixctl/_jsonl_kernel.c) and the byte-level BPE model tokenizer's pre-tokenizer
and merges (matrixctl/_bpe_kernel.c); everything else is pyproject.toml.

The kernels use only the CPython C API and the C standard library, so the machine's C compiler
is the one requirement (`pip install -e .` builds them). docs/benchmarks.md says why they are C.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "matrixctl._pi_kernel",
            sources=["matrixctl/_pi_kernel.c"],
            extra_compile_args=["-O2", "-std=c11"],
        ),
        Extension(
            "matrixctl._scx_kernel",
            sources=["matrixctl/_scx_kernel.c"],
            extra_compile_args=["-O2", "-std=c11"],
        ),
        Extension(
            "matrixctl._crc_kernel",
            sources=["matrixctl/_crc_kernel.c"],
            extra_compile_args=["-O2", "-std=gnu11"],
        ),
        Extension(
            "matrixctl._cbor_kernel",
            sources=["matrixctl/_cbor_kernel.c"],
            extra_compile_args=["-O2", "-std=gnu11"],
        ),
        Extension(
            "matrixctl._jsonl_kernel",
            sources=["matrixctl/_jsonl_kernel.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
        ),
        Extension(
            "matrixctl._bpe_kernel",
            sources=["matrixctl/_bpe_kernel.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
        ),
    ]
)
