"""The default path of each kernel comes from the committed measurements (`vpo.kernels.choice`):
a kernel only where it compiles and was measured faster than XLA; unmeasured or slower: XLA;
an explicit choice as given; the table refreshed from a device run's kernel cells."""

import json
import sys

import jax
import pytest
from vpo.kernels import choice


def _row(kernel="decode_attention", use="forward", platform="gpu", keys=768, speedups=(1.2,),
         device="X", **shape):
    row = dict(kernel=kernel, use=use, platform=platform, device=device,
               shape=shape or {"P": keys // 2, "C": keys - keys // 2},
               speedups=list(speedups), measured_at="abc1234")
    if kernel == "decode_attention":
        row["keys"] = keys
    return row


def test_the_committed_table_is_well_formed_and_says_where_it_was_measured():
    rows = choice.committed_table()
    assert rows, "kernels/measured.json holds no row"
    for r in rows:
        assert r["measured_at"] and r["device"], r


def test_a_kernel_slower_than_xla_is_never_the_default():
    table = [_row(kernel="logprob_entropy", use="backward", speedups=(1.3, 0.9), N=8)]
    assert not choice.kernel_wins("logprob_entropy", "gpu", "backward", table=table)
    table = [_row(kernel="logprob_entropy", use="backward", speedups=(1.3,), N=8),
             _row(kernel="logprob_entropy", use="backward", speedups=(0.6,), N=16)]
    assert not choice.kernel_wins("logprob_entropy", "gpu", "backward", table=table)
    table = [_row(kernel="logprob_entropy", use="backward", speedups=(1.3,), N=8)]
    assert choice.kernel_wins("logprob_entropy", "gpu", "backward", table=table)


def test_an_unmeasured_platform_or_use_takes_xla():
    table = [_row(kernel="logprob_entropy", use="forward", speedups=(1.5,), N=8)]
    assert not choice.kernel_wins("logprob_entropy", "tpu", "forward", table=table)
    assert not choice.kernel_wins("logprob_entropy", "gpu", "backward", table=table)
    assert not choice.kernel_wins("decode_attention", "gpu", table=table)


def test_decode_attention_is_judged_by_the_row_covering_the_context():
    """Won at 768 keys, lost at 3,072: the kernel up to 768, XLA beyond (the longer row covers
    1,000 keys; past every row the longest judges)."""
    table = [_row(keys=768, speedups=(1.04, 1.5)), _row(keys=3072, speedups=(0.85,))]
    wins = {k: choice.kernel_wins("decode_attention", "gpu", keys=k, table=table)
            for k in (64, 768, 1000, 3072, 10_000)}
    assert wins == {64: True, 768: True, 1000: False, 3072: False, 10_000: False}


def test_auto_needs_a_platform_that_compiles_the_kernel():
    table = [_row(platform="cpu", keys=768)]
    assert choice.default_impl("decode_attention", "cpu", "auto", keys=64, table=table) == "xla"
    assert choice.default_impl("decode_attention", "cpu", "xla", table=table) == "xla"
    assert choice.default_impl("decode_attention", "cpu", "pallas", table=table) == "pallas"
    with pytest.raises(ValueError, match="expected one of"):
        choice.default_impl("decode_attention", "gpu", "triton")


def test_the_committed_defaults_on_the_measured_gpu():
    """What the committed H200 rows decide (when this jax lowers Pallas to the GPU): decode
    attention through the kernel at a short context only, the log-prob gradient pass in XLA."""
    assert choice.kernel_wins("decode_attention", "gpu", keys=512)
    assert not choice.kernel_wins("decode_attention", "gpu", keys=4096)
    assert not choice.kernel_wins("logprob_entropy", "gpu", "backward")
    assert not choice.kernel_wins("decode_attention", "tpu", keys=512)


def test_a_device_runs_cells_refresh_the_table(tmp_path):
    cells = [dict(kernel="decode_attention", direction="forward", case="short prefix",
                  shape=dict(B=2, G=2, N=2, H=4, E=16, P=256, C=512, length=512,
                             dtype="bfloat16"), xla_s=2e-3, kernel_s=1e-3),
             dict(kernel="logprob_entropy", direction="backward", case="long",
                  shape=dict(N=8, D=4, V=16, dtype="bfloat16"), xla_s=1.0, kernel_s=2.0),
             dict(kernel="logprob_entropy", direction="forward", case="long",
                  shape=dict(N=8, D=4, V=16, dtype="bfloat16"), skipped="out of time")]
    rows = choice.rows_from_cells(cells, platform="cuda", device="NVIDIA H100",
                                  measured_at="abc1234", jax_version="0.11.2")
    assert [(r["kernel"], r["use"], r["speedups"]) for r in rows] == [
        ("decode_attention", "forward", [2.0]), ("logprob_entropy", "backward", [0.5])]
    assert rows[0]["keys"] == 768 and rows[0]["platform"] == "gpu"
    old = [_row(keys=768, device="NVIDIA H100", speedups=(0.5,),
                **{k: v for k, v in cells[0]["shape"].items()}), _row(keys=3072, device="B")]
    merged = choice.merge_rows(old, rows)
    assert len(merged) == 3  # the H100 decode row replaced, the other kept, one added
    path = tmp_path / "measured.json"
    choice.write_table(merged, path)
    assert choice.load_table(path) == tuple(json.loads(path.read_text())["rows"])
    assert choice.kernel_wins("decode_attention", "gpu", keys=700, table=merged)
    with pytest.raises(ValueError, match="interpreter"):
        choice.rows_from_cells(cells, platform="cpu", device="cpu", measured_at="x",
                               jax_version="0")


def test_a_bad_row_is_named():
    with pytest.raises(ValueError, match="lacks"):
        choice.check_row({"kernel": "decode_attention"})
    with pytest.raises(ValueError, match="keys"):
        choice.check_row({k: v for k, v in _row().items() if k != "keys"})
    with pytest.raises(ValueError, match="positive"):
        choice.check_row(_row(speedups=()))


def test_on_this_cpu_every_default_is_xla():
    from vpo.model.decoder import decode_attention_impl
    from vpo.rl.step import logprob_impl_for

    assert decode_attention_impl(jax.devices()[:1], keys=64) == "xla"
    assert logprob_impl_for("cpu") == "chunked"
    with pytest.raises(ValueError, match="decode_attention=pallas"):
        decode_attention_impl(jax.devices()[:1], choice="pallas")


def test_the_device_check_writes_the_refreshed_table(tmp_path, monkeypatch):
    """`experiments/device_check.py` merges its kernel cells into a copy of the committed table
    (a CPU run, which times the interpreter, writes none)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "device_check.py"
    spec = importlib.util.spec_from_file_location("device_check_under_test", path)
    device_check = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, device_check)  # its dataclasses look it up
    spec.loader.exec_module(device_check)
    for name in device_check.ABSENT_ON_DEVICE:  # what its child set-up blocks, restored after
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name))
    cell = dict(kernel="logprob_entropy", direction="backward", case="long",
                shape=dict(N=8, D=4, V=16, dtype="bfloat16"), xla_s=1.0, kernel_s=0.5)
    data = dict(interpret=False, platform="gpu", device="NVIDIA H100", jax="0.11.2",
                cells=[cell])
    report = dict(measured_at="abc1234", parts={"kernels": {"data": data}})
    written = device_check.write_kernel_table(report, tmp_path)
    rows = choice.load_table(written)
    assert len(rows) == len(choice.committed_table()) + 1
    assert [r for r in rows if r["device"] == "NVIDIA H100"] == [
        dict(kernel="logprob_entropy", use="backward", platform="gpu", device="NVIDIA H100",
             shape=cell["shape"], speedups=[2.0], measured_at="abc1234", jax="0.11.2")]
    data["interpret"] = True
    assert device_check.write_kernel_table(report, tmp_path) is None
