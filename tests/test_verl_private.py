"""Every verl private oma relies on (:mod:`oma.integrations.verl._verl_private`), pinned against the installed
verl: a release that renames, removes or changes one fails here, loudly, instead of in a user's run. And
no other module of the integration touches a name verl keeps private."""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import inspect
from pathlib import Path

import pytest
import verl

from oma.hosts import HostConfigError
from oma.integrations.verl import _verl_private

SRC = Path(__file__).resolve().parents[1] / "src" / "oma" / "integrations" / "verl"


def test_the_installed_verl_is_the_one_the_privates_were_read_from():
    _verl_private.check_version()
    assert verl.__version__ == importlib.metadata.version("verl") == _verl_private.TESTED


@pytest.mark.parametrize("installed", ["0.10.0", "0.8.5", "1.0.0"])
def test_another_verl_is_refused_in_one_line(monkeypatch, installed):
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: installed if name == "verl" else real(name))
    with pytest.raises(HostConfigError) as e:
        _verl_private.check_version()
    assert str(e.value) == (f"oma's verl integration supports verl 0.9.x (tested on 0.9.1); the installed verl is "
                            f"{installed}: pip install 'verl==0.9.1'")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.9.2" if name == "verl" else real(name))
    _verl_private.check_version()  # a 0.9.x patch release is accepted


def _trainers():
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    return PPOTrainer, (PPOTrainerSync, PPOTrainerColocateAsync, PPOTrainerSeparateAsync)


def test_compute_advantage_is_the_method_oma_copied():
    PPOTrainer, modes = _trainers()
    source = inspect.getsource(PPOTrainer._compute_advantage)
    assert hashlib.sha256(source.encode()).hexdigest() == _verl_private.COMPUTE_ADVANTAGE_SHA256, (
        "verl's PPOTrainer._compute_advantage changed: re-read it, update the copy in "
        "oma.integrations.verl._verl_private.TrainerOverrides and COMPUTE_ADVANTAGE_SHA256")
    assert list(inspect.signature(PPOTrainer._compute_advantage).parameters) == ["self", "batch", "metrics"]
    copy = inspect.getsource(_verl_private.TrainerOverrides._compute_advantage)
    for step in ("apply_kl_penalty(", "compute_rollout_correction_and_add_to_batch(", "response_to_nested(",
                 "kv_batch_put(", '"rollout_is_weights"', "bypass_mode"):  # verl's steps 1, 2 and 4, kept
        assert step in source and step in copy
    assert "compute_advantage_for_multi_trajectories" in source and "_oma_advantages" in copy  # step 3, replaced
    for mode in modes:  # the copy sits above each mode's class: none of them has its own
        assert "_compute_advantage" not in vars(mode)


def test_compute_old_log_prob_returns_the_batch_and_fills_metrics():
    PPOTrainer, modes = _trainers()
    assert list(inspect.signature(PPOTrainer._compute_old_log_prob).parameters) == ["self", "batch", "metrics"]
    source = inspect.getsource(PPOTrainer._compute_old_log_prob)
    assert '"actor/entropy"' in source and "metrics.update(" in source and "return batch" in source
    for mode in modes:  # oma's extension calls the mode's own, which must end in verl's
        if "_compute_old_log_prob" in vars(mode):
            assert "super()._compute_old_log_prob(batch, metrics)" in inspect.getsource(mode._compute_old_log_prob)


def test_dp_size_is_read_as_verls_balance_batch_reads_it():
    from verl.single_controller.base.worker import Worker
    from verl.single_controller.base.worker_group import WorkerGroup

    PPOTrainer, _ = _trainers()
    assert "self._dispatch_info = {}" in inspect.getsource(WorkerGroup.__init__)
    assert list(inspect.signature(Worker._query_dispatch_info).parameters)[:2] == ["self", "mesh_name"]
    balance = inspect.getsource(PPOTrainer._balance_batch)
    for line in ('role, worker_group = "actor", self.actor_rollout_wg', "worker_group._dispatch_info[role] = dp_rank_mapping",
                 "worker_group._query_dispatch_info(role)", "dp_size = max(dp_rank_mapping) + 1"):
        assert line in balance

    class Group:
        def __init__(self):
            self._dispatch_info, self.asked = {}, []

        def _query_dispatch_info(self, role):
            self.asked.append(role)
            return [0, 1, 2, 0, 1, 2]  # each worker's data-parallel rank

    group = Group()
    assert _verl_private.dp_size(group) == 3 and _verl_private.dp_size(group) == 3 and group.asked == ["actor"]


def test_the_engine_registry_is_read_as_it_is_filled():
    import verl.workers.engine.fsdp.transformer_impl  # noqa: F401  (registers verl's FSDP engines)
    from verl.workers.engine.base import EngineRegistry

    assert EngineRegistry._engines["language_model"]["fsdp"]["cuda"] is not None
    assert _verl_private.engine_registered(EngineRegistry, "language_model", ("fsdp", "fsdp2"), "cuda")
    assert not _verl_private.engine_registered(EngineRegistry, "language_model", ("fsdp", "fsdp2"), "tpu")


def test_a_rollout_registered_by_name_is_what_verl_loads(monkeypatch):
    from verl.workers.rollout import base

    from oma.integrations.verl.hf_rollout import HFServerAdapter

    assert ("vllm", "async") in base._ROLLOUT_REGISTRY and isinstance(base._ROLLOUT_REGISTRY[("vllm", "async")], str)
    monkeypatch.setattr(base, "_ROLLOUT_REGISTRY", dict(base._ROLLOUT_REGISTRY))
    _verl_private.register_rollout(base, "hf", "oma.integrations.verl.hf_rollout.HFServerAdapter")
    assert base.get_rollout_class("hf", "async") is HFServerAdapter


def test_a_replicas_server_is_what_verl_reads_back():
    from verl.workers.rollout.replica import RolloutReplica

    init = inspect.getsource(RolloutReplica.__init__)
    assert "self._server_address" in init and "self._server_handle" in init
    from oma.integrations.verl.hf_rollout import HFReplica

    assert issubclass(HFReplica, RolloutReplica)
    replica = object.__new__(HFReplica)
    _verl_private.set_replica_server(replica, "handle", "oma_hf_server_0")
    assert (replica.server_handle, replica.server_address) == ("handle", "oma_hf_server_0")


def _verl_privates() -> set[str]:
    """Every private name verl's source defines: functions, classes, module and class attributes, ``self._x``."""
    names = set()
    for path in Path(verl.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                    names |= {n.attr for n in ast.walk(target) if isinstance(n, ast.Attribute)}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _private_names_used(path: Path) -> set[str]:
    """The private names a module reads, defines or imports: ``x._name``, ``def _name``, ``import _name``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("verl"):
            out |= {a.name for a in node.names}
    return {n for n in out if n.startswith("_") and not n.startswith("__")}


def test_no_other_module_of_the_integration_touches_a_verl_private():
    privates = _verl_privates()
    pinned = _private_names_used(SRC / "_verl_private.py") & privates
    assert {"_compute_advantage", "_compute_old_log_prob", "_dispatch_info", "_query_dispatch_info", "_engines",
            "_ROLLOUT_REGISTRY", "_server_handle", "_server_address"} <= pinned  # the scan sees what it must
    found = {p.name: sorted(_private_names_used(p) & privates) for p in sorted(SRC.glob("*.py"))
             if p.name not in ("_verl_private.py", "_hooks.py")}
    assert not any(found.values()), f"verl privates outside oma.integrations.verl._verl_private: {found}"
