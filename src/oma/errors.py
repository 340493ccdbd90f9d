"""Errors that more than one layer of oma raises.

:class:`ConfigError` lives here, below :mod:`oma.train`, because :mod:`oma.agent.kinds` refuses a config
too (the policy kind it names, an environment the table cannot key); :mod:`oma.train.config` re-exports it.
"""


class ConfigError(ValueError):
    """A configuration problem, with the offending key in the message."""
