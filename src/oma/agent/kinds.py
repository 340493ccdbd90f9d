"""The policy kinds behind one interface: what the training loop and its warm start ask of a policy.

* :class:`TokenLM` — an LM that writes its action a token at a time, free text or under constrained
  decoding (``policy.constrained``; ``policy.normalise=token``, the default).
* :class:`ActionLM` — the action-level LM (``policy.normalise=action``, GLAM): a softmax over the
  admissible actions of the LM's whole-string log-likelihood (studies/action-level-policy/journal.md#an-action-level-policy-glam).
* :class:`Table` — a softmax table over (``env.anchor()`` state, admissible action) logits
  (``policy.model=tabular``, docs/experiments.md#the-tabular-lane).

:func:`policy_kind` picks the kind from the config, the one place that does; rows remember which kind
made them (:attr:`oma.agent.rollout.Rows.kind`), and :func:`rows_kind` gives it back to score them. The
loop (``oma.train.loop``) and the warm start (``oma.train.warmstart``) only call the interface.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from rich.progress import Progress
from safetensors import SafetensorError
from torch import Tensor

from oma.agent.imitation import DEMO_SEED_OFFSET, demonstrations, sft
from oma.agent.policy import (model_folder_error, action_response_logprobs, allowed_rows, load_model, load_tokenizer, response_logprobs,
                              tiny_model, train_tokenizer)
from oma.agent.rollout import Rollout, Rows, rollout
from oma.agent.tabular import TabularPolicy, imitate, tabular_rollout
from oma.errors import ConfigError
from oma.files import follow_umask, sha256_file, user_path

if TYPE_CHECKING:
    from oma.train.config import TrainConfig

MakeEnv = Callable[[], object]


class PolicyKind(ABC):
    """One kind of policy, as the loop and the warm start use it; its model is a ``torch.nn.Module`` the
    optimizer, the checkpoints and the average of the weights treat alike whatever the kind."""

    name: ClassVar[str]
    """What rows made by this kind record as :attr:`~oma.agent.rollout.Rows.kind`."""

    @abstractmethod
    def warm_start(self, cfg: TrainConfig, make_env: MakeEnv, cache_folder: Callable[[], Path],
                   progress: Progress | None = None) -> tuple[torch.nn.Module, Any, dict]:
        """``(model, tokenizer or None, info)``: the policy before RL, learnt from noisy-expert demonstrations
        (``warm_start.*``). A kind that caches it keeps it in ``cache_folder()``, the folder of this config's
        warm start (``oma.train.cache_key``), and loads it from there when it is done. ``info`` is
        the ``warm_start`` record of metrics.jsonl."""

    @abstractmethod
    def rollout(self, cfg: TrainConfig, make_env: MakeEnv, model, tokenizer, seeds: Sequence[int], *, group_size: int,
                temperature: float, generator: torch.Generator | None, max_steps: int | None = None) -> Rollout:
        """``len(seeds)`` tasks × ``group_size`` episodes, one row per step, each ended after ``max_steps`` steps
        if the environment has not ended it (``None``: the environment's cap)."""

    @abstractmethod
    def logprobs(self, model, rows: Rows, idx: Tensor, pad_id: int, *, temperature: float,
                 with_entropy: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(logp [r, L], response_mask [r, L], entropy [r, L] or None)`` of rows ``idx`` under ``model`` at
        ``temperature``: per response token, the log-prob (and entropy) of the distribution it was drawn from."""

    @abstractmethod
    def pad_id(self, tokenizer) -> int:
        """The token id that pads a forward pass's rows."""

    def choice_mask(self, rows: Rows, mask: Tensor) -> Tensor:
        """bool [R, L]: the response tokens drawn among two or more options, within ``mask``.

        Unconstrained (``rows.allowed`` is None), every token is drawn from the whole vocabulary. A
        choice drawn among one option is forced: probability 1, entropy and gradient 0.
        """
        if rows.allowed is None:
            return mask.clone()
        if not rows.allowed:  # an empty batch
            return torch.zeros_like(mask)
        return self._choices(rows.allowed, mask)

    @abstractmethod
    def _choices(self, allowed: list[Tensor], mask: Tensor) -> Tensor:
        """:meth:`choice_mask` of a non-empty constrained batch, from what each row was drawn among."""


def _per_row(allowed: list[Tensor], mask: Tensor) -> Tensor:
    """One choice per row, recorded on every token of it: a row's tokens are choices when it had two or
    more admissible actions."""
    return mask & (torch.tensor([len(a) for a in allowed]) > 1).unsqueeze(-1)


class TokenLM(PolicyKind):
    """An LM writing its action a token at a time; ``allowed`` holds each row's (position, token) pairs."""

    name = "token"
    action_level = False
    """What the LM rollout and SFT normalise over: tokens here, whole actions in :class:`ActionLM`."""

    def warm_start(self, cfg, make_env, cache_folder, progress=None):
        """SFT on the demonstrations (:func:`oma.agent.imitation.sft`), normalised as the policy samples; the
        tiny policy is built first, its tokenizer trained on the demonstrations' text. Cached: loaded
        from ``cache_folder()`` when it holds the result and every file has the SHA-256 it was saved with,
        else trained and saved there (a damaged entry is named in a warning and replaced)."""
        ws = cfg.warm_start
        cache = cache_folder()
        info = {"cache": str(cache), "cached": False}
        kept = _cached(cache, progress)
        if kept is not None:
            info.update(kept, cached=True)
            return load_model(cache / "model"), load_tokenizer(cache / "tokenizer"), info
        t0 = time.perf_counter()
        tiny = cfg.policy.model == "tiny"
        if not tiny:  # fail on a bad path before spending time on demonstrations
            folder = user_path(cfg.policy.model)
            model, tokenizer = load_model(folder), _user_tokenizer(str(folder))
        need_demos = ws.enabled or tiny  # the tiny policy's tokenizer is trained on demonstration text
        demos = demonstrations(make_env, max(ws.episodes, 1), ws.noise, cfg.env.history_length, cfg.env.show_actions) if need_demos else []
        if tiny:
            tokenizer = train_tokenizer((t for d in demos for t in (d.prompt, d.action)), cfg.policy.vocab_size)
            p = cfg.policy
            model = tiny_model(len(tokenizer), hidden=p.hidden, layers=p.layers, heads=p.heads,
                               max_positions=max(512, p.max_prompt_tokens + p.max_new_tokens), seed=cfg.seed)
        t_demos = time.perf_counter() - t0
        t0 = time.perf_counter()
        losses = sft(model, tokenizer, demos, epochs=ws.epochs, lr=ws.lr, batch_rows=ws.batch_rows,
                     max_prompt_tokens=cfg.policy.max_prompt_tokens, seed=cfg.seed, constrained=cfg.policy.constrained,
                     action_level=self.action_level, progress=progress) if ws.enabled else []
        info.update(demo_rows=len(demos), sft_steps=len(losses), sft_loss_first=losses[0] if losses else None,
                    sft_loss_last=losses[-1] if losses else None)
        _save(cache, model, tokenizer, {k: v for k, v in info.items() if k not in ("cache", "cached")})
        # this run's seconds, not cached: a run that loads the warm start did not spend them
        info.update(time_demos=t_demos, time_sft=time.perf_counter() - t0)
        return model, tokenizer, info

    def rollout(self, cfg, make_env, model, tokenizer, seeds, *, group_size, temperature, generator, max_steps=None):
        return rollout(make_env, model, tokenizer, seeds, group_size=group_size, history_length=cfg.env.history_length,
                       max_prompt_tokens=cfg.policy.max_prompt_tokens, max_new_tokens=cfg.policy.max_new_tokens,
                       temperature=temperature, invalid_penalty=cfg.env.invalid_penalty, generator=generator,
                       constrained=cfg.policy.constrained, action_level=self.action_level,
                       show_actions=cfg.env.show_actions, max_steps=max_steps)

    def logprobs(self, model, rows, idx, pad_id, *, temperature, with_entropy=False):
        prompts, responses, allowed = _rows_at(rows, idx)
        return response_logprobs(model, prompts, responses, pad_id, with_entropy=with_entropy, allowed=allowed,
                                 temperature=temperature)

    def pad_id(self, tokenizer) -> int:
        return tokenizer.pad_token_id

    def _choices(self, allowed, mask):
        """A token is a choice where ``allowed`` lists two or more tokens at its position."""
        # count the options at each (row, position), all rows in one bincount
        width = mask.shape[1]
        row = allowed_rows(allowed)
        position = torch.cat([a[:, 0] for a in allowed])
        inside = position < width
        counts = torch.bincount(row[inside] * width + position[inside], minlength=len(allowed) * width)
        return mask & (counts.view(len(allowed), width) > 1)


class ActionLM(TokenLM):
    """The action-level LM: ``allowed`` holds each row's admissible actions ([k, w] token ids,
    :func:`oma.agent.policy.choices_tensor`), and every token of a row carries its action's log-prob."""

    name = "action"
    action_level = True

    def logprobs(self, model, rows, idx, pad_id, *, temperature, with_entropy=False):
        prompts, responses, allowed = _rows_at(rows, idx)
        return action_response_logprobs(model, prompts, responses, allowed, pad_id, with_entropy=with_entropy,
                                        temperature=temperature)

    def _choices(self, allowed, mask):
        return _per_row(allowed, mask)


class Table(PolicyKind):
    """The softmax table (:class:`oma.agent.tabular.TabularPolicy`): no tokenizer; ``allowed`` holds each
    row's table slots of its admissible actions."""

    name = "tabular"

    def warm_start(self, cfg, make_env, cache_folder, progress=None):
        """A uniform table, or (``warm_start.enabled``) the imitation of ``warm_start.episodes`` demonstrations
        (:func:`oma.agent.tabular.imitate`). Not cached: it takes milliseconds."""
        env = make_env()
        env.reset(DEMO_SEED_OFFSET)
        try:
            env.anchor()
        except (AttributeError, NotImplementedError) as e:
            raise ConfigError(f"policy.model=tabular needs env.anchor() (the table is keyed by the state it names), and "
                              f"env.name={cfg.env.name!r} has none: {e}") from None
        policy = TabularPolicy(cfg.policy.table_size)
        if cfg.warm_start.enabled:
            demos = demonstrations(make_env, cfg.warm_start.episodes, cfg.warm_start.noise, 0, False)
            imitate(policy, [(d.anchor, d.action, d.admissible) for d in demos])
        return policy, None, {"cache": None, "cached": False}

    def rollout(self, cfg, make_env, model, tokenizer, seeds, *, group_size, temperature, generator, max_steps=None):
        return tabular_rollout(make_env, model, seeds, group_size=group_size, temperature=temperature,
                               invalid_penalty=cfg.env.invalid_penalty, generator=generator, max_steps=max_steps)

    def logprobs(self, model, rows, idx, pad_id, *, temperature, with_entropy=False):
        _, responses, allowed = _rows_at(rows, idx)
        return model.response_logprobs(responses, allowed, with_entropy=with_entropy, temperature=temperature)

    def pad_id(self, tokenizer) -> int:
        return 0  # the table reads no padded prompt

    def _choices(self, allowed, mask):
        return _per_row(allowed, mask)


LM_KINDS: dict[str, TokenLM] = {kind.name: kind for kind in (TokenLM(), ActionLM())}
"""The LM kinds by the ``policy.normalise`` that names them."""

TABLE = Table()

KINDS: dict[str, PolicyKind] = {**LM_KINDS, TABLE.name: TABLE}
"""Every kind by its name."""


def policy_kind(cfg: TrainConfig) -> PolicyKind:
    """The kind ``cfg`` trains: the table under ``policy.model=tabular``, else the LM normalised as
    ``policy.normalise`` says. ConfigError, naming the key, for a ``policy.normalise`` that names no LM kind."""
    normalise = cfg.policy.normalise
    if normalise not in LM_KINDS:
        raise ConfigError(f"policy.normalise={normalise!r} is not valid; expected one of {list(LM_KINDS)}")
    return TABLE if cfg.policy.model == "tabular" else LM_KINDS[normalise]


def rows_kind(rows: Rows) -> PolicyKind:
    """The kind whose rollout made ``rows``: what their ids and ``allowed`` encode, so how to score them."""
    return KINDS[rows.kind]


def _rows_at(rows: Rows, idx: Tensor) -> tuple[list[list[int]], list[list[int]], list[Tensor] | None]:
    """(prompt ids, response ids, allowed or None) of rows ``idx``."""
    allowed = [rows.allowed[i] for i in idx] if rows.allowed is not None else None
    return [rows.prompt_ids[i] for i in idx], [rows.response_ids[i] for i in idx], allowed


def _user_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 — as in load_model: the folder is the user's
        raise model_folder_error(path, e) from None
    if tokenizer.eos_token is None:
        raise ValueError(f"policy.model: the tokenizer in {path!r} has no eos_token; the policy needs one to end an action")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


DONE = "done.json"
"""A warm-start cache entry's record: the warm start's ``info`` and the SHA-256 of each of its files."""


def _cached(cache: Path, progress: Progress | None) -> dict | None:
    """The record of the warm start kept in ``cache`` when every file has the SHA-256 it was saved with; None
    when there is none, or when it is damaged, which is named in one warning line (the caller rebuilds it)."""
    if not (cache / DONE).is_file():
        return None
    try:
        kept = json.loads((cache / DONE).read_bytes())
    except ValueError:  # cut short, or not UTF-8
        kept = None
    digests = kept.pop("sha256", None) if isinstance(kept, dict) else None
    if not isinstance(digests, dict) or not digests:
        problem = f"{DONE} is damaged or lists no checksums (an entry written before oma kept them)"
    else:
        bad = [name for name, digest in digests.items() if not (cache / name).is_file() or sha256_file(cache / name) != digest]
        if not bad:
            return kept
        problem = f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} missing or not as saved (SHA-256)"
    message = f"warning: the cached warm start {cache} is damaged: {problem}; rebuilding it"
    if progress is not None:  # the run's console: train.log under oma compare
        progress.console.print(message, markup=False, highlight=False, soft_wrap=True)
    else:
        print(message, file=sys.stderr)
    return None


def _save(cache: Path, model, tokenizer, info: dict) -> None:
    """Write the warm-started policy to ``cache`` atomically (temporary folder, then rename), with the SHA-256 of
    each file in its record, as a checkpoint keeps them (:func:`_cached` checks them)."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache.parent, prefix=f".{cache.name}-"))
    try:
        model.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "tokenizer")  # its own folder: no model config.json beside it
        digests = {p.relative_to(tmp).as_posix(): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / DONE).write_text(json.dumps({**info, "sha256": digests}))
        follow_umask(tmp)
        if cache.exists():
            shutil.rmtree(cache)
        tmp.rename(cache)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, SafetensorError):  # how safetensors reports a failed write (a full disk), naming no file
            raise OSError(f"the warm start's cache {cache} could not be written: {e}") from None
        raise
