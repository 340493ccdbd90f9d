"""``python -m oma.integrations.verl_agent check-install``'s plumbing, without verl-agent: a fake checkout
(tests/fixtures/verl_agent_checkout; its advantages by tests/verl_agent_sim.py, which shares no code with
oma) passes; the same checkout with a wrong advantage, a wrong actor scaling or a misplaced patch line
fails; a bad PATH is one line and exit 2; nothing of the checkout stays imported."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from oma.integrations.verl_agent import check_install
from oma.integrations.verl_agent.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fixtures" / "verl_agent_checkout"
TRAINER = Path("verl/trainer/ppo/ray_trainer.py")


def checkout(tmp_path: Path, **edits: tuple[str, str]) -> Path:
    """A copy of the fake checkout, each edit ``file=(old, new)`` a text replacement that must apply
    (``file`` is the path with ``__`` for ``/`` and no ``.py``)."""
    root = tmp_path / "verl-agent"
    shutil.copytree(FAKE, root, ignore=shutil.ignore_patterns("__pycache__"))
    for name, (old, new) in edits.items():
        path = root / (name.replace("__", "/") + ".py")
        text = path.read_text()
        assert text.count(old) == 1, (name, old)
        path.write_text(text.replace(old, new))
    return root


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["check-install", *args])
    out, err = capsys.readouterr()
    return code, out, err


def table(out: str) -> dict[str, list[str]]:
    """The table's rows by their first two columns: [layouts, worst, tolerance, result(, detail)]."""
    start = next(i for i, line in enumerate(out.splitlines()) if line.startswith("estimator / mode / place"))
    rows = {}
    for line in out.splitlines()[start + 1:-1]:
        cells = re.split(r"\s{2,}", line.strip())
        rows[f"{cells[0]} | {cells[1]}"] = cells[2:]
    return rows


def docs_patch(source: str) -> str:
    """The fake fit patched with docs/verl-agent.md's Quick-start diff: its added lines after the Tracking import and
    before adjust_batch, its oma_compute_advantage line in place of the compute_advantage call."""
    docs = (ROOT / "docs" / "verl-agent.md").read_text()
    diff = re.search(r"```diff\n(.*?)```", docs, re.S).group(1).splitlines()
    added = [line[1:].strip() for line in diff if line.startswith("+")]
    assert len(added) == 4 and added[0].startswith("from oma.integrations.verl_agent import check_config")
    lines = source.splitlines()
    out = []
    skipping = False
    for line in lines:
        indent = line[: len(line) - len(line.lstrip())]
        if line.strip() == "batch = adjust_batch(self.config, batch)":
            out.append(indent + added[2])
        if line.strip() == "batch = compute_advantage(":
            out.append(indent + added[3])
            skipping = True
            continue
        if skipping:
            skipping = line.strip() != ")"
            continue
        out.append(line)
        if line.strip() == "from verl.utils.tracking import Tracking":
            out += [indent + added[0], indent + added[1]]
    return "\n".join(out) + "\n"


def test_the_fake_checkout_passes_and_nothing_of_it_stays(tmp_path, capsys):
    root = checkout(tmp_path)
    path, verl, ray = list(sys.path), sys.modules.get("verl"), sys.modules.get("ray")
    state = np.random.get_state()[1].copy()
    code, out, err = run(capsys, str(root))
    assert code == 0, out + err
    rows = table(out)
    assert len(rows) == 17 and all(cells[3] == "pass" for cells in rows.values()), out
    assert rows["invalid-action penalty | row scores, |Δ|"][0] == "A B C"
    assert [k.split(" | ")[0] for k in rows if "advantages" in k] == [
        "grpo, norm_adv_by_std_in_grpo=True", "grpo, norm_adv_by_std_in_grpo=False", "rloo", "gigpo, mode=mean_norm",
        "gigpo, mode=mean_std_norm"]
    actor = {k.split(" | ")[0]: cells[0] for k, cells in rows.items() if "actor loss" in k}
    assert actor == {"token-mean": "A B C", "seq-mean-token-sum": "A B C D", "seq-mean-token-mean": "A B C D",
                     "seq-mean-token-sum-norm": "A B C", "gspo (seq-mean-token-mean)": "A B C D"}
    assert "ray (no cluster" in out and "oma_fake_checkout_missing_dependency (not installed)" in out
    assert "oma's minimal stand-in for ppo_trainer.yaml" in out and "is unpatched" in out
    refused = {k.split(" | ")[0]: cells[1] for k, cells in rows.items() if "refuses" in k}
    assert refused == {"row_id after adjust_batch": "refused", "use_kl_loss=True, kl_loss_coef=0.01": "refused",
                       "entropy_coeff=0.001 (the checkout's default)": "refused"}
    assert out.splitlines()[-1] == "17 of 17 checks pass"
    # nothing leaks: sys.path, the modules (the checkout's, the stubs), numpy's global generator
    assert sys.path == path and sys.modules.get("verl") is verl and sys.modules.get("ray") is ray
    assert "oma_fake_checkout_missing_dependency" not in sys.modules
    assert not [k for k, m in sys.modules.items() if str(getattr(m, "__file__", "") or "").startswith(str(root))]
    assert (np.random.get_state()[1] == state).all()


def test_a_hook_that_misses_the_misplaced_row_id_fails(tmp_path, capsys, monkeypatch):
    import oma.integrations.verl_agent.batch as batch_module
    monkeypatch.setattr(batch_module, "_check_row_ids", lambda step, content: None)
    code, out, _ = run(capsys, str(checkout(tmp_path)))
    assert code == 1 and out.splitlines()[-1] == "16 of 17 checks pass; 1 FAIL"
    assert table(out)["row_id after adjust_batch | the hook refuses"][1:] == ["accepted", "-", "FAIL", "not refused"]


def test_a_wrong_advantage_fails(tmp_path, capsys):
    root = checkout(tmp_path, verl__trainer__ppo__core_algos=("std=norm_adv_by_std_in_grpo", "std=False"))
    code, out, _ = run(capsys, str(root))
    assert code == 1
    rows = table(out)
    failed = [k for k, cells in rows.items() if cells[3] == "FAIL"]
    assert failed == ["grpo, norm_adv_by_std_in_grpo=True | advantages, |Δ|"], out
    assert float(rows[failed[0]][1]) > 0.1 and out.splitlines()[-1] == "16 of 17 checks pass; 1 FAIL"


def test_an_actor_that_scales_otherwise_fails(tmp_path, capsys):
    # dividing by the micro-batches a mini-batch really has, not by ppo_mini_batch_size // micro: the last,
    # short mini-batch of each rank weighs more than oma's factor f says
    root = checkout(tmp_path, verl__workers__actor__dp_actor=(
        "loss = pg_loss / (mini // cfg.ppo_micro_batch_size_per_gpu)", "loss = pg_loss / len(micro_batches)"))
    code, out, _ = run(capsys, str(root))
    assert code == 1
    rows = table(out)
    failed = sorted(k.split(" | ")[0] for k, cells in rows.items() if cells[3] == "FAIL")
    assert failed == ["gspo (seq-mean-token-mean)", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                      "token-mean"], out


def test_the_docs_patch_is_found_and_a_misplaced_row_id_fails(tmp_path, capsys):
    root = checkout(tmp_path)
    trainer = root / TRAINER
    trainer.write_text(docs_patch(trainer.read_text()))
    code, out, _ = run(capsys, str(root))
    assert code == 0, out
    rows = table(out)
    assert "is patched" in out
    assert [k for k in rows if k.startswith("patch")] == [
        "patch 1/3 | check_config(self.config)", "patch 2/3 | row_id = np.arange(len(batch)) before adjust_batch",
        "patch 3/3 | oma's compute_advantage for verl-agent's"]
    text = trainer.read_text()
    row_id = next(line for line in text.splitlines() if '"row_id"' in line) + "\n"
    adjust = next(line for line in text.splitlines() if "adjust_batch(self.config" in line) + "\n"
    trainer.write_text(text.replace(row_id + adjust, adjust + row_id))
    state, rows = check_install.check_fit(trainer)
    assert [r.ok for r in rows] == [True, False, True]
    assert rows[1].detail.startswith("misplaced: after adjust_batch (line ")
    code, out, _ = run(capsys, str(root))
    assert code == 1 and "FAIL  misplaced: after adjust_batch" in out


@pytest.mark.parametrize(("change", "detail"), [
    (lambda t: t.replace("oma_compute_advantage(batch, self.config, metrics, iteration=self.global_steps)",
                         "compute_advantage(batch, adv_estimator=self.config.algorithm.adv_estimator)"),
     None),  # oma's call gone, verl-agent's back
    (lambda t: t.replace("logger.log(data=metrics, step=0)",
                         "batch = compute_advantage(batch, adv_estimator='grpo')\n"
                         "            logger.log(data=metrics, step=0)"),
     "verl-agent's compute_advantage is still called at line "),
    (lambda t: t.replace("print(check_config(self.config))", "pass"), None),
    (lambda t: t.replace('batch.non_tensor_batch["row_id"] = np.arange(len(batch))', "pass"), None),
])
def test_a_broken_patch_is_reported(tmp_path, change, detail):
    root = checkout(tmp_path)
    trainer = root / TRAINER
    patched = docs_patch(trainer.read_text())
    trainer.write_text(change(patched))
    assert trainer.read_text() != patched
    _, rows = check_install.check_fit(trainer)
    bad = [r for r in rows if not r.ok]
    assert len(bad) == 1, rows
    if detail:
        assert bad[0].detail.startswith(detail)
    else:
        assert bad[0].worst == "missing"


def test_an_unimportable_ray_trainer_falls_back_to_core_algos(tmp_path, capsys):
    root = checkout(tmp_path, verl__trainer__ppo__ray_trainer=("import numpy as np\n",
                                                               "import numpy as np\n\nraise RuntimeError('needs a GPU')\n"))
    code, out, _ = run(capsys, str(root))
    assert code == 0, out
    assert ("verl.trainer.ppo.ray_trainer not imported (cannot import verl.trainer.ppo.ray_trainer from the checkout: "
            "RuntimeError: needs a GPU)") in " ".join(out.split())
    assert "core_algos.compute_{grpo,rloo}_outcome_advantage" in out and "is unpatched" in out


def test_a_bad_path_is_one_line_and_exit_2(tmp_path, capsys):
    code, out, err = run(capsys, str(tmp_path / "nowhere"))
    assert (code, out) == (2, "") and err.count("\n") == 1 and "nowhere: no such folder" in err
    code, out, err = run(capsys, str(tmp_path))
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert f"{tmp_path}: not a verl-agent checkout: expected verl/protocol.py" in err
    root = checkout(tmp_path)
    (root / "verl" / "protocol.py").write_text("raise ImportError('broken', name='verl.protocol')\n")
    code, out, err = run(capsys, str(root))
    assert code == 2 and err.count("\n") == 1 and "cannot import verl.protocol from the checkout: broken" in err


def test_without_path_the_installed_verl_must_have_agent_system_beside_it(tmp_path, capsys, monkeypatch):
    site = tmp_path / "site"
    (site / "verl").mkdir(parents=True)
    (site / "verl" / "__init__.py").write_text("")
    monkeypatch.delitem(sys.modules, "verl", raising=False)
    monkeypatch.syspath_prepend(str(site))
    code, _, err = run(capsys)
    assert code == 2 and err.count("\n") == 1 and "has no agent_system/ beside it" in err
    monkeypatch.syspath_prepend(str(checkout(tmp_path)))
    code, out, _ = run(capsys)
    assert code == 0 and f"verl-agent at {tmp_path / 'verl-agent'} " in out


def test_stubs_stand_for_what_an_import_does_with_them():
    module = check_install._StubModule("ray")
    assert module.remote(len) is len  # a decorator
    assert module.remote(num_gpus=1)(len) is len
    assert module.util.placement_group.__qualname__ == "ray.util.placement_group"
    assert module.ObjectRef[int] is module.ObjectRef and not isinstance(1, module.ObjectRef)

    class Worker(module.actor.ActorHandle):
        def __init__(self, x):
            self.x = x

    assert Worker(3).x == 3
    with module.Timer(name="x"):
        pass
    with pytest.raises(AttributeError):
        module.__wrapped__  # noqa: B018


def test_importing_the_command_imports_no_verl():
    code = ("import sys, oma.integrations.verl_agent.__main__, oma.integrations.verl_agent.check_install; "
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('verl', 'ray', 'agent_system', 'gigpo')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")}).stdout
    assert out.strip() == "[]"
