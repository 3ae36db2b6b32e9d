"""What the docs state as facts of the code, read back from the code: the
number of mistakes the errors catalogue lists, the crates of the
workspace and their arrows, and the Makefile targets the README names. A doc that drifts
from what is built fails here."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib

from conftest import ROOT
from errors_page import CATALOGUE


def test_the_catalogue_count_the_docs_give_is_the_pages():
    said = {}
    for doc in ("README.md", "docs/architecture.md"):
        text = (ROOT / doc).read_text()
        counts = re.findall(r"(\d+) mistakes", text)
        assert counts, f"{doc} no longer gives the catalogue's count: drop this check or say it again"
        said[doc] = {int(n) for n in counts}
    assert all(counts == {len(CATALOGUE)} for counts in said.values()), f"docs/errors.md has {len(CATALOGUE)} rows; the docs say {said}"


def test_the_crates_table_lists_the_workspace():
    members = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["members"]
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Crates and packages", 1)[1].split("```")[1]
    listed = re.findall(r"^(crates/[a-z0-9-]+)\s", block, re.M)
    assert sorted(listed) == sorted(members), f"docs/architecture.md lists {sorted(listed)}; Cargo.toml's members are {sorted(members)}"


def test_the_map_of_the_crates_gives_each_crates_own_dependencies():
    meta = json.loads(subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120).stdout)
    ours = {p["name"] for p in meta["packages"]}
    built = {p["name"]: {d["name"] for d in p["dependencies"] if d["name"] in ours and d["kind"] is None} for p in meta["packages"]}
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Map of the crates", 1)[1].split("```")[1]
    drawn = {}
    for line in block.strip().splitlines():
        name, _, deps = line.partition("->")
        drawn[name.strip()] = {d.strip() for d in deps.split(",") if d.strip()}
    wrong = {name: {"drawn": sorted(drawn.get(name, ())), "built": sorted(built.get(name, ()))} for name in drawn.keys() | built.keys() if drawn.get(name) != built.get(name)}
    assert not wrong, f"the map at the top of docs/architecture.md differs from the workspace's crates: {wrong}"


def test_the_readmes_make_targets_exist():
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = set(re.findall(r"`make ([a-z][a-z0-9-]*)", (ROOT / "README.md").read_text()))
    assert named, "the README names no make target"
    assert sorted(named - targets) == [], "the README names targets the Makefile does not have"
