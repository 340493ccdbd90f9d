"""oma's trajectory-aware verl trainer, on hand-built batches with verl's session keys.

verl's v1 trainer package needs verl's ``verl-core`` extras (TransferQueue, ...), which the
``oma[verl]`` install does not pull in; the trainer logic lives in
:class:`OMATrainerMixin`, exercised here over a stand-in base class and an in-memory TransferQueue
with verl's own TensorDict/DataProto/padding utilities.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from omegaconf import OmegaConf

import oma.integrations.verl.plugin  # noqa: F401
from oma import core
from oma.integrations.verl.batch import (
    UnsupportedConfigError,
    check_trainer_config,
    compute_oma_batch,
    host_step,
    minibatch_rows,
)
from oma.integrations.verl.trainer_mixin import OMATrainerMixin
from verl.trainer.ppo import core_algos  # noqa: F401  (registers oma's estimators through the hook)
from verl.utils import tensordict_utils as tu
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from test_verl_support import session_batch, trainer_config


def test_minibatch_rows_matches_verls_dispatch_and_iterator():
    n, dp, mini = 24, 3, 6
    td = tu.get_tensordict({"row": torch.arange(n)})
    seen = []
    per_rank = [list(tu.make_iterator(chunk, mini_batch_size=mini // dp, epochs=1, seed=0, dataloader_kwargs={"shuffle": False}))
                for chunk in tu.chunk_tensordict(td, dp)]
    for i in range(len(per_rank[0])):
        seen.append(sorted(int(x) for rank in per_rank for x in rank[i]["row"]))
    assert [sorted(m.tolist()) for m in minibatch_rows(n, dp, mini)] == seen
    with pytest.raises(ValueError):
        minibatch_rows(25, 3, 6)


def _session_keys(lengths: list[list[int]]) -> list[str]:
    """verl's keys for groups of trajectories of the given row counts, uids g0, g1, ..."""
    return [f"g{g}_{t}_{k}" for g, trajs in enumerate(lengths) for t, n in enumerate(trajs) for k in range(n)]


def test_masses_are_exact_when_trajectories_straddle_minibatches():
    """The issue's case: 4 trajectories of 3 rows, 4-row mini-batches (k = 3). Per-mini-batch weights
    gave masses 0.5, 1, 1, 0.5 (in units of one step); over the step each trajectory gets k/T = 0.75."""
    keys = _session_keys([[3, 3], [3, 3]])
    rewards = torch.zeros(12, 5)
    rewards[:, -1] = torch.tensor([1.0] * 3 + [0.0] * 3 + [1.0] * 3 + [0.0] * 3)
    mask = torch.ones(12, 5, dtype=torch.bool)
    mask[::2, 3:] = False  # rows of 3 and 5 tokens: token-mean's native mass follows tokens
    for mass in ("uniform", "group"):
        cfg = trainer_config()
        cfg.algorithm.oma.mass = mass
        out = compute_oma_batch(rewards, mask, keys, cfg.algorithm, dp_size=1, mini_batch_rows=4)
        ids = out.step
        traj_mass = core.segment_sum(out.weights.sum(-1), ids.traj_index, 4)
        torch.testing.assert_close(traj_mass, torch.full((4,), 0.75, dtype=torch.float64))
        per_step = [float(out.weights[idx].sum()) for idx in out.step.layout]
        assert sum(per_step) == pytest.approx(3.0)  # k steps of total 1 on average
        # equal to oma.core over the whole step, times k
        full = core.token_weights(mask, ids.group_index, ids.traj_index, mass=mass)
        torch.testing.assert_close(out.weights, 3 * full)


@pytest.mark.parametrize("dp", [1, 2])
@pytest.mark.parametrize("mass", ["uniform", "group", "native"])
def test_gradient_over_minibatches_equals_the_full_step(dp, mass):
    """Σ over mini-batches (and ranks) of verl's token-sum loss Σ mask·ℓ(A·W), at ρ = 1, has the gradient
    of k·oma.core.weighted_loss(ℓ(A), W_step) for MA, and of verl's per-mini-batch reducer for native."""
    keys = _session_keys([[2, 5, 1], [4, 1, 3], [6, 2]])  # 24 rows, uneven trajectories
    keys = keys + [f"padfeed_{i}_0" for i in range(8)]  # verl's padding rows: 32 rows
    rows, L = len(keys), 6
    gen = torch.Generator().manual_seed(7)
    perm = torch.randperm(rows, generator=gen).tolist()  # verl's balancing scatters trajectories
    keys = [keys[i] for i in perm]
    mask = torch.rand(rows, L, generator=gen) < 0.8
    mask[:, 0] = True
    for i, k in enumerate(keys):
        if k.startswith("pad"):
            mask[i] = False
    rewards = torch.zeros(rows, L)
    rewards[:, -1] = (torch.rand(rows, generator=gen) < 0.5).float()
    cfg = trainer_config()
    cfg.algorithm.oma.mass = mass
    cfg.algorithm.oma.accounting = "row"  # row scores may differ inside a trajectory: any advantage will do
    out = compute_oma_batch(rewards, mask, keys, cfg.algorithm, dp_size=dp, mini_batch_rows=4 * dp)
    k = len(out.step.layout)
    assert k == rows // (4 * dp)
    logp = torch.randn(rows, L, generator=gen, dtype=torch.float64, requires_grad=True)
    a_w = out.weighted_advantages.detach().to(torch.float64)
    total = 0.0
    for idx in out.step.layout:  # verl: each rank's piece, token-sum, gradients summed over ranks
        for rank_rows in idx.chunk(dp):
            ratio = torch.exp(logp[rank_rows] - logp[rank_rows].detach())
            total = total + (-(a_w[rank_rows] * ratio) * mask[rank_rows]).sum()
    (g_verl,) = torch.autograd.grad(total, logp)
    adv = out.advantages.detach().to(torch.float64)
    ratio = torch.exp(logp - logp.detach())
    ell = -(adv * ratio)
    if mass == "native":
        expected = sum(core.weighted_loss(ell[idx], core.token_weights(mask[idx], out.step.group_index[idx],
                                                                       out.step.traj_index[idx], mass="native"))
                       for idx in out.step.layout)
    else:
        expected = k * core.weighted_loss(ell, core.token_weights(mask, out.step.group_index, out.step.traj_index,
                                                                  mass=mass))
    (g_full,) = torch.autograd.grad(expected, logp)
    torch.testing.assert_close(g_verl, g_full, rtol=1e-6, atol=1e-9)


# --------------------------------------------------------------- the mixin over a stand-in trainer


class _Meta:
    """Stand-in for TransferQueue's KVBatchMeta (keys, tags, partition, in-place reorder)."""

    def __init__(self, keys, tags):
        self.keys, self.tags, self.partition_id, self.extra_info = list(keys), list(tags), "train", {}

    def __len__(self):
        return len(self.keys)

    def reorder(self, perm):
        self.keys = [self.keys[i] for i in perm]
        self.tags = [self.tags[i] for i in perm]


class _TQ:
    """In-memory TransferQueue: per-key rows in, verl's nested TensorDict out."""

    def __init__(self, rows):
        self.rows, self.written = rows, None

    def kv_batch_get(self, keys, partition_id, select_fields):
        return list_of_dict_to_tensordict([{f: self.rows[k][f] for f in select_fields if f in self.rows[k]} for k in keys])

    def kv_batch_put(self, keys, partition_id, fields):
        self.written = (list(keys), fields)
        return _Meta(keys, [{}] * len(keys))


class _StandInTrainer:
    """What OMATrainerMixin needs from verl's PPOTrainer."""

    def __init__(self, config):
        self.config = config
        self.trainer_mode = config.trainer.v1.trainer_mode  # as PPOTrainer.__init__ does
        self.global_steps, self.parameter_sync_step, self.local_trigger_step = 1, 1, 0  # as PPOTrainer sets them

    def _compute_old_log_prob(self, batch, metrics):
        metrics["actor/entropy"] = 2.0 * 23  # verl's agg_loss under token-sum: Σ over the step's 23 tokens of 2.0
        return batch


def _trainer(config, tq, dp=2):
    class Trainer(OMATrainerMixin, _StandInTrainer):
        _oma_base_mode = "sync"

        def _tq(self):
            return tq

        def _oma_dp_size(self):
            return dp

    return Trainer(config)


@pytest.mark.parametrize("estimator", ["oma_grpo", "oma_gigpo"])
def test_mixin_computes_oma_advantages_from_session_keys(estimator):
    keys, rewards, mask, *_ = session_batch([[3, 5, 2, 6], [4, 4, 6]], [[1, 0, 0, 1], [0, 1, 1]], seed=3)
    keys = keys + ["padfeed_0_0", "padfeed_1_0"]  # verl's padding rows (empty response mask): 32 rows
    rewards = torch.cat([rewards, torch.zeros(2, rewards.shape[1])])
    mask = torch.cat([mask, torch.zeros(2, mask.shape[1], dtype=torch.bool)])
    rows = {}
    for k, r, m in zip(keys, rewards, mask, strict=True):
        n = max(int(m.sum()), 1)  # nested rows keep their own length, as TransferQueue stores them
        rows[k] = {"uid": k.rsplit("_", 2)[0], "response_mask": m[:n].long(), "rm_scores": r[:n],
                   "old_log_probs": torch.zeros(n), "prompts": torch.tensor([5, 6, int(k[-1]) % 3])}
    tq = _TQ(rows)
    shuffled = torch.randperm(len(keys), generator=torch.Generator().manual_seed(1)).tolist()
    meta = _Meta([keys[i] for i in shuffled], [{"seq_len": 50 + i, "is_padding": keys[i].startswith("pad")} for i in shuffled])
    cfg = trainer_config(ppo_mini_batch_size=2)  # 2 prompts × n=4 → 8 rows per mini-batch
    cfg.algorithm.adv_estimator = estimator
    trainer = _trainer(cfg, tq)
    assert trainer.trainer_mode == "sync" and trainer._oma_trainer_name == "oma_sync"
    assert trainer._oma_mini_batch_rows(34) is None and trainer._oma_mini_batch_rows(32) == 8

    metrics = {}
    trainer._compute_advantage(meta, metrics)
    written_keys, fields = tq.written
    assert written_keys == meta.keys and set(fields.keys()) == {"advantages", "returns"}

    ids = host_step(meta.keys, torch.zeros(len(meta.keys), 1), torch.ones(len(meta.keys), 1))
    R = len(meta.keys)
    L = rewards.shape[1]
    full_mask = torch.zeros(R, L, dtype=torch.bool)
    scores = torch.zeros(R, dtype=torch.float64)
    for i, k in enumerate(meta.keys):
        m = rows[k]["response_mask"].bool()
        full_mask[i, : m.shape[0]] = m
        scores[i] = float(rows[k]["rm_scores"].sum())
    if estimator == "oma_grpo":
        adv = core.outcome_advantages(scores, ids.group_index, ids.traj_index)
    else:  # anchors: the rows' prompt token ids; step reward: the terminal one
        from oma.integrations.verl.batch import prompt_anchor_ids
        from oma.integrations.verl.estimators import terminal_step_rewards

        anchor = prompt_anchor_ids([rows[k]["prompts"] for k in meta.keys])
        step_rewards = terminal_step_rewards(scores, ids.traj_index, ids.step_index)
        adv = core.gigpo_advantages(scores, step_rewards, anchor, ids.group_index, ids.traj_index, ids.step_index)
    weights = 4 * core.token_weights(full_mask, ids.group_index, ids.traj_index)  # the whole step, × 4 mini-batches
    got = fields["advantages"].to_padded_tensor(0.0)
    torch.testing.assert_close(got, (adv.unsqueeze(-1) * weights).float()[:, : got.shape[1]])
    torch.testing.assert_close(fields["returns"].to_padded_tensor(0.0), (adv.unsqueeze(-1) * full_mask).float()[:, : got.shape[1]])
    assert metrics["oma/optimizer_steps"] == 4.0 and metrics["oma/trajectories"] == 7.0
    assert metrics["oma/padding_copies"] == 2.0  # verl's is_padding rows
    # each trajectory 4/7 of the step's objective, wherever its rows lie (shuffled over the 4 mini-batches)
    traj_mass = core.segment_sum(weights.sum(-1), ids.traj_index, int(ids.traj_index.max()) + 1)
    real = [t for t in range(traj_mass.shape[0]) if not meta.keys[int((ids.traj_index == t).nonzero()[0])].startswith("pad")]
    torch.testing.assert_close(traj_mass[real], torch.full((7,), 4 / 7, dtype=torch.float64))
    assert sum(float(weights[idx].sum()) for idx in minibatch_rows(R, 2, 8)) == pytest.approx(4.0)


def test_mixin_refuses_unsupported_config_before_building_anything():
    with pytest.raises(UnsupportedConfigError, match="token-sum"):
        _trainer(trainer_config(loss_agg_mode="seq-mean-token-mean"), _TQ({}))


def test_mixin_refuses_another_verl_in_one_line(monkeypatch):
    import importlib.metadata

    from oma.hosts import HostConfigError

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.10.0" if name == "verl" else real(name))
    with pytest.raises(HostConfigError) as e:
        _trainer(trainer_config(loss_agg_mode="token-mean"), _TQ({}))  # refused for the version, before the config
    assert str(e.value) == ("oma's verl integration supports verl 0.9.x (tested on 0.9.1); the installed verl is 0.10.0: "
                            "pip install 'verl==0.9.1'")


def _step_rows(keys):
    """Rows of 2 or 3 tokens (TransferQueue nests uneven rows), session 0 of each group wins."""
    rows = {}
    for k in keys:
        n = 2 + int(k[-1]) % 2
        scores = torch.zeros(n)
        scores[-1] = 1.0 if k.split("_")[1] == "0" else 0.0
        rows[k] = {"uid": k.rsplit("_", 2)[0], "response_mask": torch.ones(n, dtype=torch.long), "rm_scores": scores,
                   "old_log_probs": torch.zeros(n)}
    return rows


@pytest.mark.parametrize(("sync", "trigger", "iteration"), [(1, 0, 3), (2, 1, 6)])
def test_mixin_dumps_each_training_batch_under_its_step(tmp_path, sync, trigger, iteration):
    keys = _session_keys([[2, 3], [1, 2]])
    tq = _TQ(_step_rows(keys))
    cfg = trainer_config(ppo_mini_batch_size=1)
    cfg.algorithm.oma.dump_dir = str(tmp_path)
    trainer = _trainer(cfg, tq, dp=1)
    trainer.global_steps, trainer.parameter_sync_step, trainer.local_trigger_step = 3, sync, trigger
    metrics = {}
    trainer._compute_advantage(_Meta(keys, [{}] * len(keys)), metrics)
    from oma.diagnostics import read_batch

    b = read_batch(tmp_path / "batches" / f"iter_{iteration:06d}.parquet")
    assert b.traj_index.tolist() == [0, 0, 1, 1, 1, 2, 3, 3] and b.step_index.tolist() == [0, 1, 0, 1, 2, 0, 0, 1]
    assert b.scores.tolist() == [1, 1, 0, 0, 0, 1, 0, 0] and metrics["oma/trajectories"] == 4


def test_example_alfworld_config_composes_and_passes_checks(monkeypatch):
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config_dir = Path(__file__).resolve().parents[1] / "configs" / "verl"
    first = (config_dir / "alfworld_oma_gigpo.yaml").read_text().splitlines()[0]
    assert first.startswith("# ") and "python -m verl.trainer.main_ppo" in first and "--config-name=alfworld_oma_gigpo" in first
    for var in ("ALFWORLD_TRAIN", "ALFWORLD_VAL", "ALFWORLD_AGENT_LOOPS"):
        monkeypatch.setenv(var, f"/data/{var.lower()}")
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(config_name="alfworld_oma_gigpo")
    OmegaConf.resolve(cfg)
    opts = check_trainer_config(cfg)
    assert (cfg.algorithm.adv_estimator, cfg.trainer.v1.trainer_mode, opts.accounting, opts.mass) == (
        "oma_gigpo", "oma_sync", "trajectory", "uniform",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # verl: "Disabled critic as algorithm.adv_estimator != gae"
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def test_trainer_side_gigpo_anchors_on_prompts_and_equals_oma_core():
    from oma.integrations.verl.batch import prompt_anchor_ids
    from oma.integrations.verl.estimators import terminal_step_rewards

    keys, rewards, mask, g, t, s = session_batch([[3, 2, 4], [2, 3]], [[1, 0, 1], [0, 1]], seed=5)
    prompts = [torch.tensor([7, 7, int(step) % 2]) for step in s]  # two distinct contexts per group
    anchor = prompt_anchor_ids(prompts)
    assert anchor.unique().numel() == 2 and torch.equal(anchor, prompt_anchor_ids([p.tolist() for p in prompts]))
    cfg = trainer_config().algorithm
    cfg.adv_estimator = "oma_gigpo"
    cfg.oma.gamma = 0.9
    out = compute_oma_batch(rewards, mask, keys, cfg, anchor=anchor)
    scores = rewards.sum(-1).double()
    expected = core.gigpo_advantages(scores, terminal_step_rewards(scores, t, s), anchor, g, t, s, gamma=0.9)
    torch.testing.assert_close(out.advantages, (expected.unsqueeze(-1) * mask).float())
    with pytest.raises(ValueError, match="anchor"):
        compute_oma_batch(rewards, mask, keys, cfg)


def test_entropy_metric_is_per_token():
    rows = {f"g0_{t}_0": {"uid": "g0", "response_mask": torch.ones(n, dtype=torch.long)} for t, n in enumerate([5, 8, 10])}
    tq = _TQ(rows)
    metrics = {}
    _trainer(trainer_config(), tq)._compute_old_log_prob(_Meta(list(rows), [{}] * 3), metrics)
    assert metrics["actor/entropy"] == pytest.approx(2.0)


def test_separate_async_reads_verls_own_keys():
    """verl's PPOTrainer reads ``trainer.v1.<trainer_mode>.parameter_sync_step``; on oma's trainer that is the
    base mode's node (``separate_async``), where verl's config keeps it, not ``oma_separate_async``."""
    import oma.integrations.verl.trainer as trainer_mod  # verl's v1 trainer stack: oma[verl] installs it
    obj = object.__new__(trainer_mod.OMATrainerSeparateAsync)
    cfg = OmegaConf.create({"trainer": {"v1": {"trainer_mode": "oma_separate_async",
                                               "separate_async": {"parameter_sync_step": 4}}}})
    obj.trainer_mode = cfg.trainer.v1.trainer_mode  # as PPOTrainer.__init__ does
    assert obj.trainer_mode == "separate_async" and obj._oma_trainer_name == "oma_separate_async"
    assert cfg.trainer.v1.get(obj.trainer_mode, {}).get("parameter_sync_step", 1) == 4  # PPOTrainer.__init__'s read
