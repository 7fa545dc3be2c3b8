"""Writes the sha256 of every file PyPI publishes for each pinned requirement into a
requirements file, so that pip installs it with `--require-hashes`: a file that changed
on the index, or one nobody pinned, is refused.

    python3 tests/engines/lock.py tests/engines/requirements/NAME.txt...

Each file keeps its comments and its `name==version` lines; each pin gets the hashes of
its source archive and of its wheels for Linux on x86-64 (manylinux) or any platform,
for every Python version, as PyPI's simple index (PEP 691 JSON) lists them. Run it after
changing a pin; the scripts that install from these files key their venvs by the file's
contents, so the next test run installs afresh.
"""

import json
import re
import sys
import urllib.request

INDEX = "https://pypi.org/simple"


def normalized(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def files_of(name, version):
    request = urllib.request.Request(
        f"{INDEX}/{normalized(name)}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        listing = json.load(answer)
    prefix = re.sub(r"[-_.]+", "_", name).lower()
    kept = []
    for file in listing["files"]:
        filename = file["filename"]
        stem = re.sub(r"[-_.]+", "_", filename).lower()
        if file.get("yanked") or "sha256" not in file["hashes"]:
            continue
        if filename.endswith((".tar.gz", ".zip")):
            match = filename[: -len(".tar.gz") if filename.endswith(".tar.gz") else -len(".zip")]
            if match.rsplit("-", 1)[-1] == version and stem.startswith(prefix + "_"):
                kept.append(file)
        elif filename.endswith(".whl"):
            parts = filename[:-4].split("-")
            platform = parts[-1]
            if parts[1] == version and normalized(parts[0]) == normalized(name) and (
                platform == "any" or ("x86_64" in platform and ("manylinux" in platform or platform == "linux_x86_64"))
            ):
                kept.append(file)
    if not kept:
        sys.exit(f"lock.py: PyPI lists no file of {name}=={version} for Linux x86-64")
    return sorted(f["hashes"]["sha256"] for f in kept)


def lock(path):
    lines = []
    with open(path) as text:
        for line in text:
            line = line.rstrip("\n")
            stripped = line.strip()
            if stripped.startswith("--hash") or not stripped:
                continue
            if stripped.startswith("#"):
                lines.append(line)
                continue
            pin = stripped.rstrip("\\").strip()
            name, _, version = pin.partition("==")
            if not version:
                sys.exit(f"lock.py: {path}: `{pin}` is not pinned (name==version)")
            hashes = files_of(name, version)
            lines.append(f"{name}=={version} \\")
            for i, sha in enumerate(hashes):
                more = " \\" if i + 1 < len(hashes) else ""
                lines.append(f"    --hash=sha256:{sha}{more}")
    with open(path, "w") as text:
        text.write("\n".join(lines) + "\n")


for path in sys.argv[1:]:
    lock(path)
