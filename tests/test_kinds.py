"""oma.agent.kinds: every policy kind behind the one interface the loop and the warm start use, and the
factory that picks it from the config."""

import pytest
import torch

from oma.agent.kinds import KINDS, ActionLM, PolicyKind, Table, TokenLM, policy_kind, rows_kind
from oma.train import ConfigError, load_config, make_env

LM = ["policy.hidden=32", "policy.layers=1", "policy.heads=2", "policy.vocab_size=300", "warm_start.episodes=2",
      "warm_start.epochs=1", "policy.max_new_tokens=6", "threads=1"]
CONFIGS = {
    "token": LM,
    "action": [*LM, "policy.normalise=action"],
    "tabular": ["policy.model=tabular", "env.name=chain", "warm_start.enabled=true", "warm_start.episodes=3"],
}
CACHED = {"token": True, "action": True, "tabular": False}
"""Which kinds keep their warm start in the cache (the table's takes milliseconds)."""


def test_every_kind_implements_the_interface():
    assert set(KINDS) == set(CONFIGS)
    for name, kind in KINDS.items():
        assert isinstance(kind, PolicyKind) and kind.name == name
        assert not type(kind).__abstractmethods__


def test_the_factory_picks_the_kind_from_the_config():
    assert type(policy_kind(load_config(None, []))) is TokenLM
    assert type(policy_kind(load_config(None, ["policy.normalise=action"]))) is ActionLM
    assert type(policy_kind(load_config(None, ["policy.model=tabular", "env.name=chain"]))) is Table


@pytest.mark.parametrize("model", ["tiny", "tabular"])
def test_the_factory_refuses_a_normalisation_that_names_no_kind_in_one_line(model):
    cfg = load_config(None, [])
    cfg.policy.model, cfg.policy.normalise = model, "sequence"  # changed after validation, as a script may
    with pytest.raises(ConfigError) as e:
        policy_kind(cfg)
    assert str(e.value) == "policy.normalise='sequence' is not valid; expected one of ['token', 'action']"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_kind_warm_starts_rolls_out_and_scores_its_own_rows(name, tmp_path):
    cfg = load_config(None, CONFIGS[name])
    kind = policy_kind(cfg)
    assert kind is KINDS[name]
    new_env = make_env(cfg)
    asked = []

    def cache_folder():
        asked.append(True)
        return tmp_path / "warm-start"

    model, tokenizer, info = kind.warm_start(cfg, new_env, cache_folder)
    assert info["cached"] is False and bool(asked) == CACHED[name]
    if CACHED[name]:  # a second warm start loads the first
        again, _, info = kind.warm_start(cfg, new_env, cache_folder)
        assert info["cached"] is True and info["cache"] == str(tmp_path / "warm-start")
        for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
            assert torch.equal(a, b)

    ro = kind.rollout(cfg, new_env, model, tokenizer, [0, 1], group_size=2, temperature=1.0,
                      generator=torch.Generator().manual_seed(0), max_steps=3)
    rows = ro.rows
    assert rows_kind(rows) is kind and len(rows) >= 4 and max(rows.step_index.tolist()) <= 2
    model.eval()
    logp, mask, entropy = kind.logprobs(model, rows, torch.arange(len(rows)), kind.pad_id(tokenizer), temperature=1.0,
                                        with_entropy=True)
    # scored as sampled: every token's log-prob and entropy are the ones recorded while sampling
    for r, response in enumerate(rows.response_ids):
        n = len(response)
        assert int(mask[r].sum()) == n
        torch.testing.assert_close(logp[r, :n], torch.tensor(rows.logp[r]), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(entropy[r, :n], torch.tensor(rows.entropy[r]), rtol=1e-4, atol=1e-5)
    choices = kind.choice_mask(rows, mask)
    assert choices.shape == mask.shape and not bool((choices & ~mask).any())
