"""Stable ids for environment states (GiGPO anchor states)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from torch import Tensor


def anchor_ids(states: Sequence[str]) -> Tensor:
    """Hash each state text to a stable int64 id (GiGPO's anchor-state key), int64 [R].

    Uses the first 8 bytes of BLAKE2b of the UTF-8 text, read as a signed integer, so ids are
    identical across processes, machines and runs (Python's ``hash`` is salted per process).
    Equal texts give equal ids; distinct texts collide with probability ~R²/2⁶⁴.
    """
    if isinstance(states, str) or not isinstance(states, Sequence):
        raise TypeError(f"states must be a sequence of str, got {type(states).__name__}")
    ids = []
    for k, text in enumerate(states):
        if not isinstance(text, str):
            raise TypeError(f"states[{k}] must be str, got {type(text).__name__}")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate, as a bad decode with errors="surrogateescape" leaves
            raise ValueError(f"states[{k}] is not encodable as UTF-8 ({e.reason} at character {e.start})") from None
        digest = hashlib.blake2b(data, digest_size=8).digest()
        ids.append(int.from_bytes(digest, "little", signed=True))
    return torch.tensor(ids, dtype=torch.int64)
