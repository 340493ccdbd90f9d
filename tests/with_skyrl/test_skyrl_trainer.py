"""oma inside SkyRL 0.4.0, tested against SkyRL itself (runs in .venv-skyrl: `make test`).

The trainer is built the way SkyRL's own CPU trainer tests build it (no Ray, no GPU: tracker, tokenizer
and inference client None, generator mocked), the worker the way SkyRL's loss-scaling test builds it
(strategy and model mocked, losses captured at backward).
"""

from __future__ import annotations

import copy
from contextlib import ExitStack, nullcontext
from types import SimpleNamespace
from unittest.mock import MagicMock, patch

import pytest
import torch
from skyrl.backends.skyrl_train.training_batch import TrainingInputBatch, pad_training_input_batch
from skyrl.backends.skyrl_train.workers.worker import PolicyWorkerBase
from skyrl.train.dataset.preprocess import compute_prompt_boundaries, compute_prompt_mini_batch_boundaries
from skyrl.train.fully_async_trainer import FullyAsyncRayPPOTrainer
from skyrl.train.trainer import RayPPOTrainer

from oma import core
from oma.integrations.skyrl.batch import host_step
from oma.integrations.skyrl.trainer import (
    OMAFullyAsyncRayPPOTrainer,
    OMAPPOExp,
    OMARayPPOTrainer,
    OMASkyRLTrainConfig,
    OMATrainerMixin,
    parse_config,
)

L = 6  # response length (right-aligned masks, as SkyRL lays them out)
# (prompt, steps' response lengths, outcome): uneven turns and tokens, two to three samples per prompt
TRAJECTORIES = [
    ("p0", [2, 5, 1], 1.0), ("p0", [3], 0.0), ("p0", [1, 1, 2, 6], 0.0),
    ("p1", [4, 4], 1.0), ("p1", [6], 1.0), ("p1", [2, 3, 3], 0.0),
    ("p2", [5], 0.0), ("p2", [1, 2], 1.0),
]
PROMPTS = 3


class _Dataset:
    def __len__(self):
        return 1

    def __getitem__(self, idx):
        return "prompt"

    def collate_fn(self, batch):
        return batch


def make_cfg(oma: dict, loss_reduction: str = "token_mean", estimator: str = "grpo") -> OMASkyRLTrainConfig:
    cfg = OMASkyRLTrainConfig()
    cfg.generator.step_wise_trajectories = True
    cfg.generator.n_samples_per_prompt = 3
    algo = cfg.trainer.algorithm
    algo.oma = oma
    algo.advantage_estimator = estimator
    algo.loss_reduction = loss_reduction
    algo.max_seq_len = L if loss_reduction == "seq_mean_token_sum_norm" else None
    algo.use_kl_loss = False
    algo.temperature = 1.0
    cfg.trainer.train_batch_size = PROMPTS
    cfg.trainer.policy_mini_batch_size = 1
    cfg.trainer.micro_train_batch_size_per_gpu = 2
    cfg.trainer.remove_microbatch_padding = False
    # no Ray cluster here: no metrics scraping, no GPU monitor, no dataloader worker processes
    cfg.generator.inference_engine.enable_ray_prometheus_stats = False
    cfg.trainer.enable_ray_gpu_monitor = False
    cfg.data.dataloader.num_workers = 0
    return cfg


def make_trainer(cls, cfg):
    return cls(cfg=cfg, tracker=None, tokenizer=None, train_dataset=_Dataset(), eval_dataset=_Dataset(),
               inference_engine_client=None, generator=MagicMock())


def make_batch(pad: int = 2) -> TrainingInputBatch:
    """A step-wise training batch as SkyRL's convert_to_training_input leaves it (plus DP padding)."""
    uids, last, lengths, outcome = [], [], [], []
    for prompt, steps, s in TRAJECTORIES:
        for i, n in enumerate(steps):
            uids.append(prompt)
            last.append(i == len(steps) - 1)
            lengths.append(n)
            outcome.append(s)
    rows = len(uids)
    mask = torch.zeros(rows, L, dtype=torch.long)
    rewards = torch.zeros(rows, L)
    for r, n in enumerate(lengths):
        mask[r, L - n:] = 1
        if last[r]:
            rewards[r, -1] = outcome[r]
    data = TrainingInputBatch({
        "sequences": torch.arange(rows).unsqueeze(-1).repeat(1, 2 * L),  # column 0 names the row
        "attention_mask": torch.ones(rows, 2 * L, dtype=torch.long),
        "response_mask": mask.clone(),
        "loss_mask": mask.clone(),
        "rewards": rewards,
        "values": torch.zeros(rows, L),
    })
    data.metadata = {"uids": list(uids), "is_last_step": list(last), "response_length": L,
                     "avg_response_length": sum(lengths) / rows}
    data.metadata["policy_mini_batch_boundaries"] = compute_prompt_mini_batch_boundaries(uids, 1, PROMPTS, True, 3)
    data.metadata["policy_prompt_boundaries"] = compute_prompt_boundaries(uids)
    return pad_training_input_batch(data, pad)


def advantages_after_normalisation(cls, cfg, data=None):
    trainer = make_trainer(cls, cfg)
    data = make_batch() if data is None else data
    structure = host_step(list(data.metadata["uids"]), data.metadata["is_last_step"], data["rewards"], data["loss_mask"])
    data = trainer.compute_advantages_and_returns(data)
    raw = data["advantages"].clone()
    data = trainer._normalize_advantages(data, data.metadata["policy_mini_batch_boundaries"],
                                         data.metadata["policy_prompt_boundaries"])
    return raw, data["advantages"], structure, data


LOSS_REDUCTIONS = ["token_mean", "sequence_mean", "seq_mean_token_sum_norm"]
REDUCER = {"token_mean": "token-mean", "sequence_mean": "seq-mean-token-mean",
           "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"}


# -------------------------------------------------------------------------- weights and advantages


@pytest.mark.parametrize("loss_reduction", LOSS_REDUCTIONS)
@pytest.mark.parametrize("mass", ["uniform", "group"])
def test_each_trajectory_gets_oma_core_weights(loss_reduction, mass):
    cfg = make_cfg({"mass": mass}, loss_reduction)
    raw, adv, structure, data = advantages_after_normalisation(OMARayPPOTrainer, cfg)
    # the advantages themselves are SkyRL's (trajectory accounting is its step-wise semantics)
    skyrl_raw, _, _, _ = advantages_after_normalisation(RayPPOTrainer, make_cfg({"mass": "native"}, loss_reduction))
    assert torch.equal(raw, skyrl_raw)
    k = len(data.metadata["policy_mini_batch_boundaries"])
    weights = k * core.token_weights(data["loss_mask"].bool(), structure.group_index, structure.traj_index,
                                     reducer=REDUCER[loss_reduction], mass=mass,
                                     loss_scale_factor=float(L) if loss_reduction == "seq_mean_token_sum_norm" else None)
    assert torch.allclose(adv.double(), raw.double() * weights, rtol=1e-6, atol=1e-9)
    if loss_reduction != "seq_mean_token_sum_norm":  # mean reducers: each trajectory's total is its target
        totals = core.segment_sum(weights.sum(-1), structure.traj_index, int(structure.traj_index.max()) + 1)
        target = [k / len(TRAJECTORIES)] * len(TRAJECTORIES) if mass == "uniform" else \
            [k / (PROMPTS * sum(t[0] == p for t in TRAJECTORIES)) for p, _, _ in TRAJECTORIES]
        assert totals[:len(TRAJECTORIES)].tolist() == pytest.approx(target)
        assert totals[len(TRAJECTORIES):].abs().sum().item() == 0.0  # SkyRL's padding rows get nothing


@pytest.mark.parametrize("loss_reduction", LOSS_REDUCTIONS + ["prompt_mean"])
def test_oma_off_is_skyrl_unmodified(loss_reduction):
    off = {"accounting": "trajectory", "mass": "native"}
    _, ours, _, _ = advantages_after_normalisation(OMARayPPOTrainer, make_cfg(off, loss_reduction))
    _, skyrl, _, _ = advantages_after_normalisation(RayPPOTrainer, make_cfg(off, loss_reduction))
    assert torch.equal(ours, skyrl)


def test_skyrl_trajectory_advantages_equal_oma_core_trajectory_accounting():
    raw, _, structure, data = advantages_after_normalisation(RayPPOTrainer, make_cfg({"mass": "native"}))
    rows = len(raw) - data.metadata["pad_size"]
    outcome = torch.tensor([s for _, steps, s in TRAJECTORIES for _ in steps], dtype=torch.float64)
    expected = core.outcome_advantages(outcome, structure.group_index[:rows], structure.traj_index[:rows],
                                       accounting="trajectory")
    per_row = raw[:rows, -1]  # every response ends at the last column
    assert torch.allclose(per_row.double(), expected, atol=1e-6)


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_row_accounting_counts_every_step(estimator):
    cfg = make_cfg({"accounting": "row", "mass": "native"}, estimator=estimator)
    raw, adv, structure, data = advantages_after_normalisation(OMARayPPOTrainer, cfg)
    rows = len(raw) - data.metadata["pad_size"]
    outcome = [s for _, steps, s in TRAJECTORIES for _ in steps]
    uids = data.metadata.get("uids") or [p for p, steps, _ in TRAJECTORIES for _ in steps]
    for r in range(rows):  # naive loop: the group's members are its rows
        members = [outcome[q] for q in range(rows) if uids[q] == uids[r]]
        others = [outcome[q] for q in range(rows) if uids[q] == uids[r] and q != r]
        mean = sum(members) / len(members)
        if estimator == "grpo":
            std = (sum((m - mean) ** 2 for m in members) / (len(members) - 1)) ** 0.5
            expected = (outcome[r] - mean) / (std + 1e-6)
        else:
            expected = outcome[r] - sum(others) / len(others)
        assert raw[r, -1].item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    # mass native: SkyRL's token_mean per mini-batch applied to the row-accounted advantages
    for start, end in data.metadata["policy_mini_batch_boundaries"]:
        tokens = data["loss_mask"][start:end].sum()
        assert torch.allclose(adv[start:end], raw[start:end] / tokens)


def test_row_accounting_reports_its_own_advantage_metrics():
    trainer = make_trainer(OMARayPPOTrainer, make_cfg({"accounting": "row", "mass": "native"}))
    data = trainer.compute_advantages_and_returns(make_batch())
    rows = len(data["advantages"]) - data.metadata["pad_size"]
    valid = torch.masked_select(data["advantages"][:rows], data["response_mask"][:rows].bool())
    assert trainer.all_metrics["loss/avg_raw_advantages_abs"] == pytest.approx(valid.abs().mean().item())
    assert data.metadata["metrics"]["avg_advantages"] == pytest.approx(valid.mean().item())


def test_weights_ignore_where_mini_batch_boundaries_fall():
    """A trajectory cut by a mini-batch boundary keeps its total: only the number k of mini-batches enters."""
    cfg = make_cfg({"mass": "uniform"})
    trainer = make_trainer(OMARayPPOTrainer, cfg)
    data = trainer.compute_advantages_and_returns(make_batch())
    rows = len(data["loss_mask"])  # 17 rows and SkyRL's 2 padding rows, which no mini-batch trains
    a = trainer._normalize_advantages(copy.deepcopy(data), [(0, 4), (4, 9), (9, rows)])["advantages"]
    b = trainer._normalize_advantages(copy.deepcopy(data), [(0, 2), (2, 11), (11, rows)])["advantages"]
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------------- the worker


def _worker(cfg, rank, dp_size, logp):
    worker = PolicyWorkerBase(cfg=cfg.trainer, world_size=dp_size, rank=rank, local_rank=rank,
                              master_addr="localhost", master_port=12345 + rank, sequence_parallel_size=1)
    backward = []
    strategy = MagicMock()
    strategy.backward.side_effect = lambda loss, model, optimizer: backward.append(loss.detach().double().item())
    strategy.all_reduce.side_effect = lambda metrics, op, group=None: dict(metrics)
    worker.strategy = strategy
    worker.device_mesh = SimpleNamespace(get_group=lambda name: None)
    worker.mesh_rank = SimpleNamespace(dp_size=dp_size)

    def forward(sequences, num_actions, **kwargs):
        ids = sequences[:, 0].long()
        return logp[ids].clone().requires_grad_(True), {"entropy": torch.zeros(len(ids), num_actions + 1)}

    worker.model = MagicMock(side_effect=forward)
    worker.optimizer = None
    worker.scheduler = MagicMock(get_last_lr=MagicMock(return_value=[0.0]))
    return worker, backward


def expected_token_loss(policy_loss: str, algo, logp, logp_old, logp_rollout, adv, mask):
    """Each SkyRL policy loss per token, written out from its definition (skyrl 0.4.0, ppo_utils.py)."""
    if policy_loss in ("regular", "dual_clip", "gspo"):
        return core.token_objective(logp, logp_old, adv, mask, objective="gspo" if policy_loss == "gspo" else "ppo",
                                    clip_low=algo.eps_clip_low, clip_high=algo.eps_clip_high,
                                    clip_ratio_c=algo.clip_ratio_c if policy_loss == "dual_clip" else None)
    if policy_loss == "cispo":  # -A·clamp(π/π_anchor)·log π, the clamp stopped
        anchor = logp_rollout if algo.cispo.cispo_anchor == "rollout" else logp_old
        w = torch.exp(logp - anchor).clamp(1 - algo.cispo.cispo_eps_clip_low, 1 + algo.cispo.cispo_eps_clip_high)
        return -adv * w * logp
    ratio = torch.exp(logp - logp_rollout)
    if policy_loss == "rollout_is":  # -(r·1[1-ε_l < r < 1+ε_h])·A·log π
        inside = (ratio > 1 - algo.eps_clip_low) & (ratio < 1 + algo.eps_clip_high)
        return -(ratio * inside) * adv * logp
    assert policy_loss == "dppo" and algo.dppo.dppo_type == "binary_tv"  # -r·A·mask, mask from A's sign and Δp
    diff = torch.exp(logp) - torch.exp(logp_rollout)
    keep = ~(((adv > 0) & (diff > algo.dppo.delta_high)) | ((adv < 0) & (-diff > algo.dppo.delta_low)))
    return -ratio * adv * keep


@pytest.mark.parametrize("policy_loss", ["regular", "dual_clip", "gspo", "cispo", "rollout_is", "dppo"])
@pytest.mark.parametrize("dp_size", [1, 2])
@pytest.mark.parametrize("micro", [1, 3])
def test_worker_loss_equals_oma_core_weighted_loss(policy_loss, dp_size, micro):
    cfg = make_cfg({"mass": "uniform"})
    cfg.trainer.algorithm.policy_loss_type = policy_loss
    cfg.trainer.micro_train_batch_size_per_gpu = micro
    raw, adv, structure, data = advantages_after_normalisation(OMARayPPOTrainer, cfg)
    rows = len(adv)
    gen = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(rows, L, generator=gen) * 2
    logp_rollout = logp_old + 0.1 * torch.randn(rows, L, generator=gen)
    logp = logp_old + 0.4 * torch.randn(rows, L, generator=gen)  # ratios well outside the clip range
    batch = TrainingInputBatch({
        "sequences": data["sequences"], "attention_mask": data["attention_mask"],
        "action_log_probs": logp_old, "base_action_log_probs": torch.zeros(rows, L), "values": torch.zeros(rows, L),
        "returns": data["returns"], "advantages": adv, "loss_mask": data["loss_mask"].float(),
        "response_mask": data["response_mask"].float(), "rollout_logprobs": logp_rollout,
    })
    batch.metadata = {"response_length": L}
    total = 0.0
    per_rank = rows // dp_size
    with ExitStack() as stack:
        stack.enter_context(patch("torch.cuda.current_device", return_value=torch.device("cpu")))
        stack.enter_context(patch("torch.autocast", side_effect=lambda *a, **k: nullcontext()))
        for rank in range(dp_size):  # SkyRL hands each rank a contiguous chunk
            worker, backward = _worker(cfg, rank, dp_size, logp)
            chunk = batch[rank * per_rank:(rank + 1) * per_rank]
            chunk.metadata = {"response_length": L}
            worker.forward_backward(chunk)
            total += sum(backward) / dp_size  # the gradient all-reduce averages over ranks
    k = len(data.metadata["policy_mini_batch_boundaries"])
    weights = k * core.token_weights(data["loss_mask"].bool(), structure.group_index, structure.traj_index,
                                     reducer="token-mean", mass="uniform")
    token_loss = expected_token_loss(policy_loss, cfg.trainer.algorithm, logp, logp_old, logp_rollout, raw,
                                     data["loss_mask"].bool())
    assert total == pytest.approx(core.weighted_loss(token_loss.double(), weights).item(), rel=1e-5, abs=1e-7)


def test_fully_async_trainer_applies_the_same_weights():
    """SkyRL's fully async trainer (rollout-anchored loss, as it requires) inherits both overrides."""
    cfg = make_cfg({"mass": "group"})
    cfg.trainer.algorithm.policy_loss_type = "rollout_is"
    cfg.trainer.fully_async.enabled = True
    cfg.trainer.fully_async.num_parallel_generation_workers = PROMPTS
    cfg.trainer.policy_mini_batch_size = PROMPTS  # fully async trains one mini-batch per step
    cfg.trainer.placement.colocate_all = False
    batch = make_batch()
    batch.metadata["policy_mini_batch_boundaries"] = [(0, len(batch["loss_mask"]) - 2)]
    _, adv_async, _, _ = advantages_after_normalisation(OMAFullyAsyncRayPPOTrainer, cfg, copy.deepcopy(batch))
    _, adv_sync, _, _ = advantages_after_normalisation(OMARayPPOTrainer, cfg, batch)
    raw, _, _, _ = advantages_after_normalisation(RayPPOTrainer, make_cfg({"mass": "native"}))
    assert torch.equal(adv_async, adv_sync) and not torch.equal(adv_async, raw)


# ------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(("override", "message"), [
    ("trainer.algorithm.oma.mass=tokens",
     "trainer.algorithm.oma.mass must be one of ['native', 'uniform', 'group'], got 'tokens'"),
    ("trainer.algorithm.oma.accounting=rows",
     "trainer.algorithm.oma.accounting must be one of ['row', 'trajectory'], got 'rows'"),
    ("trainer.algorithm.oma.masss=uniform",
     "trainer.algorithm.oma.masss is not an option; known: ['accounting', 'mass', 'dump_dir']"),
    ("trainer.algorithm.oma.audit_dir=/tmp/x",
     "trainer.algorithm.oma.audit_dir was renamed trainer.algorithm.oma.dump_dir: set that instead"),
    ("trainer.algorithm.oma.estimator=rloo",
     "trainer.algorithm.oma.estimator is set by trainer.algorithm.advantage_estimator: set that instead"),
])
def test_bad_options_are_refused_by_key_when_parsing(override, message):
    with pytest.raises(ValueError) as e:
        parse_config([override, "generator.step_wise_trajectories=true"])
    assert str(e.value) == message


def test_another_skyrl_is_refused_before_the_trainer_exists(monkeypatch):
    import importlib.metadata

    from oma.hosts import HostConfigError

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.1" if name == "skyrl" else real(name))
    for build in (lambda: parse_config(["generator.step_wise_trajectories=true"]),
                  lambda: make_trainer(OMARayPPOTrainer, make_cfg({"mass": "uniform"}))):
        with pytest.raises(HostConfigError, match=r"^oma's skyrl integration supports skyrl 0\.4\.x \(tested on 0\.4\.0\); "
                                                  r"the installed skyrl is 0\.5\.1: pip install 'skyrl==0\.4\.0'$"):
            build()


def test_step_wise_off_is_refused_before_the_trainer_exists():
    cfg = make_cfg({"mass": "uniform"})
    cfg.generator.step_wise_trajectories = False
    with pytest.raises(ValueError, match=r"generator\.step_wise_trajectories must be true"):
        make_trainer(OMARayPPOTrainer, cfg)


def test_missing_is_last_step_is_refused_by_key_before_anything_is_written(tmp_path):
    trainer = make_trainer(OMARayPPOTrainer, make_cfg({"mass": "uniform", "dump_dir": str(tmp_path)}))
    data = make_batch()
    del data.metadata["is_last_step"]
    with pytest.raises(ValueError, match=r"metadata\['is_last_step'\] is missing"):
        trainer.compute_advantages_and_returns(data)
    assert not any(tmp_path.iterdir())


def test_the_entry_point_picks_oma_trainers():
    assert issubclass(OMAFullyAsyncRayPPOTrainer, FullyAsyncRayPPOTrainer)
    assert OMAFullyAsyncRayPPOTrainer.__mro__.index(OMATrainerMixin) < OMAFullyAsyncRayPPOTrainer.__mro__.index(
        RayPPOTrainer)
    exp = OMAPPOExp.__new__(OMAPPOExp)  # get_trainer needs no state of the experiment
    for enabled, cls in ((False, OMARayPPOTrainer), (True, OMAFullyAsyncRayPPOTrainer)):
        cfg = make_cfg({"mass": "uniform"})
        cfg.trainer.fully_async.enabled = enabled
        with patch.object(cls, "__init__", return_value=None) as init:
            trainer = exp.get_trainer(cfg, None, None, _Dataset(), _Dataset(), None, MagicMock(), None)
        assert type(trainer) is cls and init.call_args.kwargs["cfg"] is cfg


@pytest.mark.parametrize("oma", [{"mass": "native"}, {"mass": "uniform"}])
def test_dump_dir_writes_the_step_batch(tmp_path, oma):
    from oma.diagnostics import read_batch

    oma["dump_dir"] = str(tmp_path)
    trainer = make_trainer(OMARayPPOTrainer, make_cfg(oma))
    trainer.global_step = 3
    trainer.compute_advantages_and_returns(make_batch())
    b = read_batch(tmp_path / "batches" / "iter_000003.parquet")
    rows = sum(len(steps) for _, steps, _ in TRAJECTORIES)
    assert len(b.traj_index) == rows  # SkyRL's 2 padding rows left out
    assert b.scores.tolist() == [s for _, steps, s in TRAJECTORIES for _ in steps]
    assert b.response_tokens.tolist() == [n for _, steps, _ in TRAJECTORIES for n in steps]


@pytest.mark.parametrize(("oma", "loss_reduction", "mass_figures"), [
    ({"mass": "uniform"}, "token_mean", True),
    ({"accounting": "row", "mass": "native"}, "sequence_mean", True),
    ({"accounting": "row", "mass": "native"}, "prompt_mean", False),  # no oma reducer: no weights to read
])
def test_the_hosts_metrics_are_logged_every_step(oma, loss_reduction, mass_figures):
    trainer = make_trainer(OMARayPPOTrainer, make_cfg(oma, loss_reduction))
    data = trainer.compute_advantages_and_returns(make_batch())
    trainer._normalize_advantages(data, data.metadata["policy_mini_batch_boundaries"],
                                  data.metadata["policy_prompt_boundaries"])
    m = trainer.all_metrics
    assert m["oma/trajectories"] == len(TRAJECTORIES) and m["oma/groups"] == PROMPTS
    assert m["oma/optimizer_steps"] == len(data.metadata["policy_mini_batch_boundaries"])
    assert m["oma/padding_copies"] == 0  # SkyRL's padding rows lie outside the step
    assert m["oma/rows_per_trajectory/max"] == 4 and m["oma/expansion_ratio"] > 1  # failures take more steps here
    assert ("oma/effective_trajectories" in m) == mass_figures == ("oma/failure_mass_share" in m)
    if oma["mass"] == "uniform":
        assert m["oma/effective_trajectories"] == pytest.approx(len(TRAJECTORIES))


@pytest.mark.parametrize("command", [
    ["-m", "oma.integrations.skyrl"],
    ["-m", "skyrl.train.entrypoints.main_base", "trainer.override_entrypoint=oma.integrations.skyrl.trainer"],
])
def test_skyrl_command_reaches_oma_config(command):
    """SkyRL's own command with the override (and ours) parse oma's keys before starting Ray."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, *command, "trainer.algorithm.oma.mass=tokens"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode != 0
    assert "trainer.algorithm.oma.mass must be one of ['native', 'uniform', 'group'], got 'tokens'" in out.stderr
    assert "ray.init" not in out.stderr.lower()
