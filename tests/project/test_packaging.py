"""What a wheel install gets: the package data the presets read ships inside the package."""

import os
import subprocess
import sys
import zipfile

import pytest

from vpo.launch import presets

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "-q", "-w", str(out), ROOT], check=True, capture_output=True)
    (path,) = [p for p in out.iterdir() if p.suffix == ".whl"]
    with zipfile.ZipFile(path) as z:
        return set(z.namelist())


def test_the_dataset_presets_files_are_in_the_wheel(wheel_names):
    for preset, (data, rewards, _) in presets.PRESET_DATA.items():
        for rel in (data, *(r.partition(":")[0] for r in rewards)):
            assert f"vpo/launch/preset_data/{rel}" in wheel_names, (preset, rel)


def test_the_preset_reads_its_files_from_the_package_not_a_clone():
    kwargs = presets.preset_dataset("smollm-arith")
    package = os.path.dirname(os.path.abspath(presets.__file__))
    assert kwargs["path"].startswith(package + os.sep) and os.path.isfile(kwargs["path"])
    for spec in kwargs["rewards"]:
        assert spec.startswith(package + os.sep) and os.path.isfile(spec.partition(":")[0])
