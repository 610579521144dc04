"""experiments/device_carry.py: SmolLM2's GGUF split into parts that each fit one GPU call's
transfer beside the working tree, joined and hash-checked there."""

import importlib.util
import json
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _carry():
    spec = importlib.util.spec_from_file_location("device_carry",
                                                  REPO / "experiments" / "device_carry.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parts_fit_each_call_beside_the_tree_and_the_first_calls_wheels():
    carry = _carry()
    mib = 2 ** 20
    # the measured case: a 93 MB file, an 18 MB tree and 5 MB of wheels under 62.5 MiB a call
    sizes = carry.plan_parts(93 * 10 ** 6, 18 * 10 ** 6, 5 * 10 ** 6, int(62.5 * mib))
    assert sum(sizes) == 93 * 10 ** 6 and len(sizes) == 3
    assert 18 * 10 ** 6 + 5 * 10 ** 6 + sizes[0] <= 62.5 * mib
    assert all(18 * 10 ** 6 + s <= 62.5 * mib for s in sizes[1:])
    assert carry.plan_parts(10, 5, 0, 100) == [10]  # one call when it fits
    with pytest.raises(ValueError, match="no room"):
        carry.plan_parts(10, 60, 50, 100)


def test_split_then_join_gives_the_file_back_and_names_a_broken_part(tmp_path):
    carry = _carry()
    data = os.urandom(10_000)
    src = tmp_path / "file.gguf"
    src.write_bytes(data)
    out = tmp_path / "parts"
    out.mkdir()
    parts = carry.split_file(str(src), [4000, 3000, 3000], str(out))
    for k, part in enumerate(parts):
        part["call"] = k + 1
    (out / carry.MANIFEST).write_text(json.dumps(
        {"file": "file.gguf", "sha256": carry.sha256(src), "parts": parts}))
    dest = carry.join_parts(str(out), str(tmp_path / "site" / "x" / "file.gguf"))
    assert pathlib.Path(dest).read_bytes() == data
    with pytest.raises(ValueError, match="do not cover"):
        carry.split_file(str(src), [4000, 3000], str(tmp_path))
    bad = bytearray((out / "part-1").read_bytes())
    bad[0] ^= 1
    (out / "part-1").write_bytes(bytes(bad))
    with pytest.raises(RuntimeError, match="part-1: sha256 differs"):
        carry.join_parts(str(out), str(tmp_path / "again.gguf"))
    (out / "part-2").unlink()
    (out / "part-1").write_bytes(data[4000:7000])
    with pytest.raises(RuntimeError, match="part-2 is missing: carry it \\(call 3"):
        carry.join_parts(str(out), str(tmp_path / "again.gguf"))
    assert not (tmp_path / "again.gguf").exists()  # nothing half-written under the name
