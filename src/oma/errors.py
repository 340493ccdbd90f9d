"""Errors that more than one layer of oma raises.

:class:`ConfigError` lives here, below :mod:`oma.train`, because :mod:`oma.agent.kinds` refuses a config
too (the policy kind it names, an environment the table cannot key); :mod:`oma.train.config` re-exports it.
"""


class ConfigError(ValueError):
    """A configuration problem, with the offending key in the message."""


BAD_PATH_ERRNOS = frozenset({"ENAMETOOLONG", "EROFS", "EEXIST", "ENOTDIR", "EISDIR", "EACCES", "EPERM", "ELOOP",
                             "ENOENT"})
"""``errno`` names of an OSError that says the path a user gave cannot be used (too long, read-only, a file where a
folder must be, …): bad input, exit status 2. Any other (a full disk, an I/O error) is a failure while running, 1."""


def os_error_status(err: OSError) -> int:
    """The exit status of ``err`` (docs/guarantees.md): 2 when it blames the path the user gave, else 1."""
    import errno

    return 2 if errno.errorcode.get(err.errno or 0) in BAD_PATH_ERRNOS else 1


def os_error_line(err: OSError) -> str:
    """``err`` as one line naming the file, without Python's ``[Errno N]``."""
    where = f"{err.filename}: " if err.filename is not None else ""
    return f"{where}{err.strerror or err}"
