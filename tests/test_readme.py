"""The README's usage example runs as written and says what it claims."""

import math
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_usage_example_runs():
    block = re.search(r"## Usage: OMA on a hand-made batch\n.*?```python\n(.*?)```", README.read_text(), re.S).group(1)
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)
    adv = ns["adv"].tolist()
    # trajectory accounting: one success and one failure per group → ±1/√2 (σ = √2/2 ... ε aside)
    assert [round(a, 4) for a in adv] == [round(math.copysign(1 / math.sqrt(2), s - 0.5), 4) for s in ns["score"].tolist()]
    assert math.isfinite(ns["loss"].item()) and ns["logp"].grad is not None
