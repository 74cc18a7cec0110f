"""The API says no to what it does not do: `matrixctl.save` and `matrixctl.convert` take every
option the CLI's `convert` has, as keywords, refuse an unknown keyword with a TypeError naming
it, and refuse a foreign tensor numpy cannot take as it is (torch bfloat16) with a UsageError
and a hint (docs/api.md)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import matrixctl
from matrixctl.cli.convert_fast import CONVERT_OPTIONS
from matrixctl.errors import UsageError
from tests.helpers import ggufcraft
from tests.validate.differential import verify_report

W = np.arange(64, dtype=np.float32).reshape(2, 32) / 7

# Options of the command line that are not options of a conversion: output and process control.
NOT_CONVERSION = {"json_out", "quiet", "spool_limit"}
# Options only a file input has: save's input is arrays (no GGUF blocks, atoms or ids).
SOURCE_ONLY = {"keep_quantized", "atoms", "vocab_size", "to"}


def cli_options() -> set[str]:
    return {name for name, _kind in CONVERT_OPTIONS.values()} - NOT_CONVERSION


def test_convert_has_a_keyword_for_every_cli_option() -> None:
    keywords = set(inspect.signature(matrixctl.convert).parameters) - {"src", "dst"}
    assert cli_options() <= keywords, cli_options() - keywords
    assert keywords <= cli_options(), keywords - cli_options()


def test_save_has_a_keyword_for_every_cli_option_that_applies_to_arrays() -> None:
    keywords = set(inspect.signature(matrixctl.save).parameters)
    wanted = cli_options() - SOURCE_ONLY
    assert wanted <= keywords, wanted - keywords
    assert "format" in keywords  # the CLI's --to


@pytest.mark.parametrize("call", ["save", "convert"])
def test_an_unknown_keyword_is_a_type_error_naming_it(tmp_path: Path, call: str) -> None:
    matrixctl.save(tmp_path / "a.zt", {"w": W})
    with pytest.raises(TypeError, match="bogus"):
        if call == "save":
            matrixctl.save(tmp_path / "b.zt", {"w": W}, bogus=1)  # type: ignore[call-arg]
        else:
            matrixctl.convert(tmp_path / "a.zt", tmp_path / "b.zt", bogus=1)  # type: ignore[call-arg]
    assert not (tmp_path / "b.zt").exists()


def test_open_refuses_an_unknown_keyword(tmp_path: Path) -> None:
    matrixctl.save(tmp_path / "a.zt", {"w": W})
    with pytest.raises(TypeError, match="bogus"):
        matrixctl.open(tmp_path / "a.zt", bogus=1)  # type: ignore[call-arg]
    with matrixctl.open(tmp_path / "a.zt", keep_quantized=False) as f:
        assert list(f) == ["w"]


def test_save_zt_version_2_writes_ztensor_2(tmp_path: Path) -> None:
    matrixctl.save(tmp_path / "v2.zt", {"w": W}, zt_version=2)
    matrixctl.save(tmp_path / "v1.zt", {"w": W})
    assert verify_report(tmp_path / "v2.zt").format == "ztensor-v2"
    assert verify_report(tmp_path / "v1.zt").format == "ztensor"
    with pytest.raises(UsageError, match="zt-version"):
        matrixctl.save(tmp_path / "x.safetensors", {"w": W}, zt_version=2)


def test_convert_takes_the_cli_options(tmp_path: Path) -> None:
    src = tmp_path / "a.npz"
    np.savez(src, w=W, b=np.ones(3, np.float16), skip=np.zeros(2))
    done = matrixctl.convert(
        src,
        tmp_path / "o.gguf",
        quantize="q8_0",
        exclude="skip",
        dtype=["b=f32"],
        meta={"general.name": "tiny"},
    )
    assert done["tensors"] == 2 and done["cast"] == {"b": "f32"}
    assert verify_report(tmp_path / "o.gguf").ok(strict=False)
    v2 = matrixctl.convert(src, tmp_path / "o.zt", zt_version=2, select=["w"], compress="zstd")
    assert v2["to"] == "ztensor-v2" and v2["tensors"] == 1
    model = tmp_path / "m.gguf"
    ggufcraft.write_model(model)
    kept = matrixctl.convert(model, tmp_path / "k.zt", keep_quantized=True)
    assert kept["lossy"] == []
    with pytest.raises(UsageError, match="--per-file"):
        matrixctl.convert(src, tmp_path / "p.zt", per_file=2)


class FakeTorchBf16:
    """What a torch bfloat16 tensor looks like to numpy (torch need not be installed)."""

    __module__ = "torch"
    dtype = "torch.bfloat16"
    shape = (2, 2)

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("Got unsupported ScalarType BFloat16")


def test_a_torch_bf16_tensor_is_a_usage_error_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        matrixctl.save(tmp_path / "t.safetensors", {"w": FakeTorchBf16()})
    assert "'w'" in err.value.message and "bfloat16" in err.value.message
    assert err.value.hint is not None and "float()" in err.value.hint
    assert not (tmp_path / "t.safetensors").exists()


def test_a_real_torch_bf16_tensor_when_torch_is_installed(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(UsageError, match="bfloat16"):
        matrixctl.save(tmp_path / "t.safetensors", {"w": torch.ones(2, dtype=torch.bfloat16)})
