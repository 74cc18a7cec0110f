"""The .npy header's fast parse (numpy's canonical spelling) gives what ast.literal_eval gives,
and every other spelling still goes to ast.literal_eval."""

from __future__ import annotations

import ast
import io

import numpy as np
import pytest

from matrixctl.formats import npy


@pytest.mark.parametrize(
    ("dtype", "shape", "fortran"),
    [
        ("<f4", (65536,), False),
        ("<f8", (), False),
        ("|u1", (0,), False),
        ("<i8", (2, 3), True),
        (">f2", (1, 2, 3, 4), False),
        ("|b1", (10, 0), False),
        ("<c16", (12345678901,), False),
    ],
)
def test_numpy_headers_parse_as_literal_eval_reads_them(
    dtype: str, shape: tuple[int, ...], fortran: bool
) -> None:
    buf = io.BytesIO()
    header = {"descr": dtype, "fortran_order": fortran, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    text = buf.getvalue()[10:].decode("latin1")
    fast = npy._canonical_header(text)
    assert fast is not None, text
    assert fast == ast.literal_eval(text)
    assert type(fast["shape"]) is tuple


@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (1, 0, 5)])
def test_matrixctl_headers_take_the_fast_parse(shape: tuple[int, ...]) -> None:
    head = npy.header_bytes("f32", shape)
    text = head[10:].decode("latin1")
    assert npy._canonical_header(text) == ast.literal_eval(text)
    assert npy.parse_header(head).shape == shape


@pytest.mark.parametrize(
    "text",
    [
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2), }\n",  # an int, not a tuple
        "{'descr': '<f4', 'fortran_order': False, 'shape': (02,), }\n",  # leading zero
        "{'shape': (2,), 'fortran_order': False, 'descr': '<f4'}\n",  # another key order
        "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }\n",
        "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }\n",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}\n",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,),}\n",
    ],
)
def test_other_spellings_go_to_literal_eval(text: str) -> None:
    assert npy._canonical_header(text) is None
