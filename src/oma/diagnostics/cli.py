"""``oma audit FILE|RUN_DIR``: the implicit-weighting audit on the command line (docs/audit.md).

Exit status 0 on success, 2 on unusable input or arguments, with one line on stderr saying what
is wrong. Output files (``--json``, ``--html``, ``--md``) are written to temporary names and
renamed into place only after every figure has been computed, so a failure leaves none of them
half-written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

from oma.batchfile import run_batches
from oma.diagnostics.tables import FORMATS, AuditInputError, parse_col_args, read_batch
from oma.diagnostics.roll import read_roll
from oma.diagnostics.verl_agent import VERL_AGENT_PENALTY, read_verl_agent
from oma.files import check_outputs

HELP = "audit the implicit trajectory weighting of a rollout batch (file or run dir)"
SOURCES: tuple[str, ...] = ("oma", "verl-agent", "roll")
"""Input formats of ``oma audit --from``: the audit's own columns, a verl-agent or a ROLL batch dump."""
GAMMA = 0.95
JSON_MARK = '{\n  "schema_version": 1,\n  "source": '
"""How a ``--json`` document begins (``json.dump`` with ``indent=2`` of :func:`oma.diagnostics.figures.report_dict`
or of a run folder's iterations): the mark by which the audit knows a file it may replace."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        raise AuditInputError(message)


def _number(expected: str = "a finite number", lo: float = -math.inf, hi: float = math.inf):
    """An argparse type: a finite float in [lo, hi]. ``float`` alone takes "nan" and "inf", which turn every figure
    that reads the option into n/a or 0 without a word."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and lo <= value <= hi):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


_NON_NEGATIVE = _number("a finite number ≥ 0", lo=0.0)


def _parser() -> argparse.ArgumentParser:
    from oma.core import REDUCERS

    p = _Parser(
        prog="oma audit",
        description="Reveal how much each outcome, length and group weighs in a stepwise batch under row/trajectory "
        "outcome accounting x native/aligned mass. Input: a JSONL/CSV/Parquet batch or a run directory "
        "(RUN/batches/iter_NNNNNN.parquet). See docs/audit.md.",
    )
    p.add_argument("path", help="batch file (.jsonl, .csv, .parquet) or run directory")
    p.add_argument(
        "--col",
        action="append",
        metavar="ROLE=NAME",
        default=[],
        help="read ROLE from column NAME, e.g. --col group_id=uid --col traj_id=traj_uid (repeatable); "
        "--col traj_id=@row makes every row its own trajectory",
    )
    p.add_argument("--format", choices=FORMATS, help="file format (default: from the extension)")
    p.add_argument(
        "--from",
        dest="source_format",
        choices=SOURCES,
        default="oma",
        help="input columns: oma's (default), a verl-agent batch dump (uid, traj_uid, episode_rewards, "
        "is_action_valid, anchor_obs, step_rewards; docs/audit.md#verl-agent-batches) or a ROLL one (traj_group_id, "
        "traj_id, episode_scores, sample_uuid, state_hash, step_rewards; docs/roll.md#audit-your-run)",
    )
    p.add_argument(
        "--invalid-penalty",
        type=_NON_NEGATIVE,
        default=None,
        metavar="C",
        help=f"--from verl-agent: subtract C per invalid action from the row's score, as verl-agent does "
        f"(default {VERL_AGENT_PENALTY:g}, its invalid_action_penalty_coef; 0 if the run turned it off)",
    )
    p.add_argument("--reducer", choices=REDUCERS, default="token-mean", help="native loss reducer (default token-mean)")
    p.add_argument(
        "--mass",
        choices=("uniform", "group"),
        default="uniform",
        help="Mass Alignment target of *+aligned (default uniform)",
    )
    p.add_argument(
        "--estimator", choices=("grpo", "rloo", "gigpo"), default="grpo", help="advantage estimator (default grpo)"
    )
    p.add_argument(
        "--std",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="divide advantages by the group std (default: on; --no-std is Dr. GRPO; --from verl-agent with "
        "gigpo: off, verl-agent's default algorithm.gigpo.mode=mean_norm)",
    )
    p.add_argument("--eps", type=_NON_NEGATIVE, default=1e-6, help="epsilon of the std normalisation (default 1e-6)")
    p.add_argument(
        "--gamma",
        type=_number("a number in [0, 1]", lo=0.0, hi=1.0),
        default=None,
        help=f"GiGPO step-return discount (default {GAMMA:g}; not with --from verl-agent, whose step_rewards are "
        "already discounted returns)",
    )
    p.add_argument("--step-advantage-w", type=_NON_NEGATIVE, default=1.0, help="GiGPO step-term weight (default 1)")
    p.add_argument(
        "--success-threshold",
        type=_number(),
        default=None,
        help="without a won column: success iff trajectory outcome >= T (default: outcome > 0)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--iter", type=int, default=None, metavar="N", help="run directory: audit iteration N (default: latest)"
    )
    which.add_argument("--all", action="store_true", help="run directory: audit every iteration, one row each")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    p.add_argument("--html", metavar="DIR", help="write DIR/index.html with PNG plots")
    p.add_argument("--md", metavar="DIR", help="write DIR/report.md with PNG plots")
    p.add_argument("--quiet", action="store_true", help="no terminal report")
    return p


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as done:  # --help
        return int(done.code or 0) if isinstance(done.code, int) else 0
    except AuditInputError as err:
        print(f"oma audit: error: {_one_line(err)}", file=sys.stderr)
        return 2
    import torch

    # The audit is a chain of O(R) passes and sorts: one intra-op thread is as fast on an idle
    # machine and several times faster on a busy one (no OpenMP hand-offs per small op).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(args)
    except (ValueError, OSError, TypeError) as err:  # AuditInputError, oma.core's checks, pyarrow, files
        print(f"oma audit: error: {_one_line(err)}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)


def _check_targets(args: argparse.Namespace, inputs: list[Path]) -> None:
    """Refuse, before anything is read, an output that cannot be written or that would land on an input or on a
    file the audit did not write (:func:`oma.files.check_outputs`, the rule of every oma writer)."""
    from oma.diagnostics.plots import PNGS
    from oma.diagnostics.report import HTML_MARK, MD_MARK

    if args.json:
        target = Path(args.json)
        if target.is_dir():
            raise AuditInputError(f"--json {target}: is a directory")
        if target.exists() and not target.is_file():  # the report is renamed over it: a device or FIFO would go
            raise AuditInputError(f"--json {target}: exists and is not a regular file")
        if not target.resolve().parent.is_dir():
            raise AuditInputError(f"--json {target}: directory {target.parent} does not exist")
        check_outputs(f"--json {target}", target, (JSON_MARK,), inputs=inputs)
    for flag, page in (("html", "index.html"), ("md", "report.md")):
        d = getattr(args, flag)
        if d:
            d = Path(d)
            if d.exists() and not d.is_dir():
                raise AuditInputError(f"--{flag} {d}: exists and is not a directory")
            if not d.resolve().parent.is_dir():
                raise AuditInputError(f"--{flag} {d}: parent directory {d.parent} does not exist")
            # a folder holding both pages vouches for its PNGs through either
            check_outputs(f"--{flag} {d}", d / page, (HTML_MARK, MD_MARK), beside=PNGS, inputs=inputs,
                          owners=("index.html", "report.md"))


def _check_options(args: argparse.Namespace) -> None:
    """Options that only mean something for one input format, refused where they do not."""
    if args.source_format == "roll" and args.gamma is not None and args.estimator == "gigpo":
        raise AuditInputError("--gamma does not apply with --from roll: the step term reads ROLL's step_rewards, already "
                              "discounted by its step_reward_gamma")
    if args.source_format == "verl-agent":
        if args.gamma is not None and args.estimator == "gigpo":
            raise AuditInputError(
                "--gamma does not apply with --from verl-agent: the step term reads verl-agent's step_rewards, "
                "already discounted by its algorithm.gamma"
            )
    elif args.invalid_penalty is not None:
        raise AuditInputError("--invalid-penalty applies to verl-agent dumps only; add --from verl-agent")


def _read(path: Path, args: argparse.Namespace, columns: dict[str, str]):
    if args.source_format == "verl-agent":
        penalty = VERL_AGENT_PENALTY if args.invalid_penalty is None else args.invalid_penalty
        return read_verl_agent(
            path, columns, invalid_penalty=penalty, success_threshold=args.success_threshold, fmt=args.format
        )
    if args.source_format == "roll":
        return read_roll(path, columns, success_threshold=args.success_threshold, fmt=args.format)
    return read_batch(path, columns, fmt=args.format)


def _audit_file(path: Path, args: argparse.Namespace, columns: dict[str, str]):
    from oma.diagnostics.audit import audit

    b = _read(path, args, columns)
    verl_agent = args.source_format == "verl-agent"
    # verl-agent: its GiGPO mode defaults to mean_norm (no std); its step_rewards are returns already (γ = 0 here)
    std = args.std if args.std is not None else not (verl_agent and args.estimator == "gigpo")
    return audit(
        b.scores,
        b.group_index,
        b.traj_index,
        response_tokens=b.response_tokens,
        response_length=b.response_length,
        step_index=b.step_index,
        anchor=b.anchor,
        step_rewards=b.step_rewards,
        won=b.won,
        success_rule=b.success_rule,
        padding_copy=b.padding_copy,
        dump=b.dump,
        reducer=args.reducer,
        aligned_mass=args.mass,
        estimator=args.estimator,
        norm_by_std=std,
        eps=args.eps,
        gamma=0.0 if verl_agent or args.source_format == "roll" else (GAMMA if args.gamma is None else args.gamma),
        step_advantage_w=args.step_advantage_w,
        success_threshold=args.success_threshold,
        group_labels=b.group_labels,
        traj_labels=b.traj_labels,
        source=str(path),
    )


def _audit_named(path: Path, args: argparse.Namespace, columns: dict[str, str]):
    """:func:`_audit_file` of one of a run folder's batches, its error naming the batch (``--all`` reads many)."""
    try:
        return _audit_file(path, args, columns)
    except (ValueError, TypeError) as err:
        text = _one_line(err)
        raise AuditInputError(text if str(path) in text else f"{path}: {text}") from None


def _run(args: argparse.Namespace) -> int:
    columns = parse_col_args(args.col)
    _check_options(args)
    path = Path(args.path)
    _check_targets(args, [path / "batches" if path.is_dir() else path])
    items: list[tuple[int, object]] | None = None
    if path.is_dir():
        batches = run_batches(path)
        if not batches:
            raise AuditInputError(
                f"{path} is a directory without batches/iter_NNNNNN.parquet files "
                "(a run trained with train.dump_batches=true writes them)"
            )
        if args.all:
            items = [(it, _audit_named(p, args, columns)) for it, p in batches]
            report = items[-1][1]
        else:
            chosen = batches[-1]
            if args.iter is not None:
                match = [b for b in batches if b[0] == args.iter]
                if not match:
                    its = [b[0] for b in batches]
                    raise AuditInputError(
                        f"{path} has no batch for iteration {args.iter} "
                        f"(found {len(its)} iterations, {its[0]}..{its[-1]})"
                    )
                chosen = match[0]
            report = _audit_file(chosen[1], args, columns)
    else:
        if args.all or args.iter is not None:
            raise AuditInputError(f"--iter/--all need a run directory; {path} is not a directory")
        report = _audit_file(path, args, columns)
    _write_outputs(args, report, items, path)
    if not args.quiet:
        from rich.console import Console

        from oma.diagnostics.report import iterations_section, render_terminal

        # a terminal or COLUMNS decides the width; a pipe without COLUMNS gets 120 columns rather than rich's 80
        console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120)
        render_terminal(report, console, [iterations_section(items)] if items else None)
    return 0


def _json_doc(report, items, path: Path) -> dict:
    from oma.diagnostics.figures import SCHEMA_VERSION

    if items is None:
        return report.to_dict()
    return {
        "schema_version": SCHEMA_VERSION,
        "source": str(path),
        "iterations": [{"iteration": it, **r.to_dict(per_group=False)} for it, r in items],
    }


def _stage_dir(target: Path, kind: str, report, items, path: Path) -> Path:
    """Write the whole report into a hidden temporary directory next to ``target``."""
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.resolve().parent))
    os.chmod(stage, 0o777 & ~_umask())  # mkdtemp makes 0700; the report is for colleagues and web servers too
    try:
        _fill_stage(stage, kind, report, items, path)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return stage


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fill_stage(stage: Path, kind: str, report, items, path: Path) -> None:
    from oma.diagnostics import plots
    from oma.diagnostics.report import iterations_section, render_html, render_markdown

    images = []
    extra = None
    if items:
        plots.mass_share_over_iterations(items, stage / plots.OVER_ITERATIONS)
        images.append(("Mass share of successes over iterations", plots.OVER_ITERATIONS))
        extra = [iterations_section(items)]
    images += plots.batch_plots(report, stage)
    title = f"{path} ({len(items)} iterations; tables below: the latest)" if items else None
    if kind == "html":
        (stage / "index.html").write_text(render_html(report, images, extra, title), encoding="utf-8")
    else:
        (stage / "report.md").write_text(render_markdown(report, images, extra, title), encoding="utf-8")


def _commit_dir(stage: Path, target: Path) -> None:
    if not target.exists():
        os.rename(stage, target)
        return
    for f in stage.iterdir():
        os.replace(f, target / f.name)
    stage.rmdir()


@contextlib.contextmanager
def _naming(flag: str, target: Path):
    """An OSError while writing ``target`` (a full disk, a folder we may not write) as one line naming the option
    and the file, not the temporary name it was being written under."""
    try:
        yield
    except OSError as err:
        raise AuditInputError(f"{flag} {target}: cannot write: {err.strerror or err}") from None


def _write_outputs(args: argparse.Namespace, report, items, path: Path) -> None:
    staged: list[tuple[str, Path, Path]] = []  # (flag, temporary, target)
    try:
        if args.json:
            target = Path(args.json)
            with _naming("--json", target):
                fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.resolve().parent)
                staged.append(("--json", Path(tmp), target))
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600
                    json.dump(_json_doc(report, items, path), fh, indent=2, ensure_ascii=False, allow_nan=False)
                    fh.write("\n")
        for kind in ("html", "md"):
            d = getattr(args, kind)
            if d:
                with _naming(f"--{kind}", Path(d)):
                    staged.append((f"--{kind}", _stage_dir(Path(d), kind, report, items, path), Path(d)))
    except BaseException:
        for _, tmp, _ in staged:
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        raise
    for flag, tmp, target in staged:
        with _naming(flag, target):
            if flag == "--json":
                os.replace(tmp, target)
            else:
                _commit_dir(tmp, target)
