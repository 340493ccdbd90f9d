"""The README runs as written, says what it claims, and stays a README: at most 150 lines, its sections in
the order a new user reads them, no dated timings."""

import math
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_usage_example_runs():
    block = re.search(r"## Quick start: `oma.core` in your trainer\n.*?```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert len(block.splitlines()) <= 10
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)
    adv = ns["adv"].tolist()
    # trajectory accounting: one success and one failure per group → ±1/√2 (σ = √2/2 ... ε aside)
    assert [round(a, 4) for a in adv] == [round(math.copysign(1 / math.sqrt(2), s - 0.5), 4) for s in ns["score"].tolist()]
    grad = ns["logp"].grad
    assert grad is not None and bool(grad.isfinite().all()) and float(grad.abs().sum()) > 0


def test_readme_is_short_and_in_a_new_users_order():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    headings = re.findall(r"^## (.+)$", text, re.M)
    order = ["Does it help?", "Install", "Quick start: `oma.core` in your trainer", "Quick start: inside verl 0.9.1",
             "Quick start: inside SkyRL 0.4.0", "Quick start: `oma audit`", "Quick start: `oma train`"]
    assert [h for h in headings if h in order] == order
    for block in re.findall(r"^## Quick start.*?```\w*\n(.*?)```", text, re.M | re.S):
        assert len(block.splitlines()) <= 10
    assert not re.search(r"20\d\d-\d\d-\d\d", text), "a dated figure belongs in its study, not the README"
    assert re.findall(r"^make (\w+)", text, re.M) == ["train", "test"]  # the two set-up commands
