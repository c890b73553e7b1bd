"""Write a hash-pinned requirements file (``pip install --require-hashes``) from pip's resolution reports.

    pip install --dry-run --ignore-installed --report R.json [--target DIR --platform ...] PACKAGES
    python scripts/pin_hashes.py OUT.txt R1.json [R2.json ...]

Each report is one resolution of the same packages (for one Python and platform); every package it would
download becomes ``name==version --hash=sha256:...``, with one hash per report where the files differ (an
x86_64 and an aarch64 wheel of the same version). A package resolved to different versions by two reports
is refused: pip evaluates markers for the running interpreter, not for ``--platform``, so one file cannot
pick a version per platform. Local paths (the project itself) are left out; they are installed ``--no-deps``.
docs/TESTING.md ("Downloads pinned by hash") says which files come from which reports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def pins(reports: list[Path]) -> dict[str, tuple[str, set[str]]]:
    """Package name (as pip normalises it) -> (version, sha256 hashes) over ``reports``."""
    found: dict[str, tuple[str, set[str]]] = {}
    for report in reports:
        for item in json.loads(report.read_text())["install"]:
            hashes = item["download_info"].get("archive_info", {}).get("hashes", {})
            if "sha256" not in hashes:  # a directory or a VCS checkout: the project itself
                continue
            name = item["metadata"]["name"].lower().replace("_", "-").replace(".", "-")
            version = item["metadata"]["version"]
            seen_version, seen = found.setdefault(name, (version, set()))
            if seen_version != version:
                raise SystemExit(f"pin_hashes: {name} is {seen_version} in one report and {version} in {report}")
            seen.add(hashes["sha256"])
    return found


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    out, reports = Path(argv[0]), [Path(a) for a in argv[1:]]
    lines = ["# Written by scripts/pin_hashes.py from pip's reports; regenerate as docs/TESTING.md says.\n"]
    for name, (version, hashes) in sorted(pins(reports).items()):
        lines.append(f"{name}=={version}" + "".join(f" \\\n    --hash=sha256:{h}" for h in sorted(hashes)) + "\n")
    out.write_text("".join(lines))
    print(f"pin_hashes: {len(lines) - 1} packages -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
