"""The ``verl.plugins`` entry point: discovered by ``import verl`` (fresh process, Ray task), light, and lazy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

from oma.integrations.verl import _hooks

PROBE = textwrap.dedent(
    """
    import json, sys
    import verl
    out = {"plugin": "oma.integrations.verl.plugin" in sys.modules,
           "core_algos_after_import_verl": "verl.trainer.ppo.core_algos" in sys.modules,
           "oma_core_after_import_verl": "oma.core" in sys.modules}
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    try:
        fn = get_adv_estimator_fn("oma_grpo")
        out["oma_grpo"] = fn.__module__ + "." + fn.__name__
    except ValueError as exc:
        out["oma_grpo"] = "missing: " + str(exc)
    if out["plugin"]:
        from oma.integrations.verl import _hooks
        from oma.integrations.verl.__main__ import main
        out["pending"] = sorted(_hooks.pending())
        out["errors"] = _hooks.errors()
        out["cli_rc"] = main([])  # python -m oma.integrations.verl
    print("PROBE" + json.dumps(out))
    """
)


def _probe(policy: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_PLUGINS"}
    if policy is not None:
        env["VERL_USE_EXTERNAL_PLUGINS"] = policy
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE"))
    return json.loads(line[len("PROBE"):])


def test_entry_point_is_declared():
    eps = [ep for ep in entry_points(group="verl.plugins") if ep.name == "oma"]
    assert [ep.value for ep in eps] == ["oma.integrations.verl.plugin"]


def test_import_verl_discovers_the_plugin_in_a_fresh_process():
    out = _probe(None)  # verl's default policy: VERL_USE_EXTERNAL_PLUGINS=auto
    assert out["plugin"] is True
    assert out["oma_grpo"] == "oma.integrations.verl.estimators.compute_oma_grpo_advantage"
    # lazy: the plugin itself pulls in neither verl's core_algos nor oma.core
    assert out["core_algos_after_import_verl"] is False and out["oma_core_after_import_verl"] is False
    assert out["pending"] == ["verl.trainer.ppo.v1"]  # the trainer registers when verl's v1 package loads
    assert out["errors"] == {} and out["cli_rc"] == 0


def test_plugins_off_means_no_oma_names():
    out = _probe("none")
    assert out["plugin"] is False and out["oma_grpo"].startswith("missing")


def test_plugin_is_discovered_inside_a_ray_task():
    import ray  # a dependency of verl, so always present with oma[verl]

    @ray.remote
    def probe():
        import sys as _sys

        import verl  # noqa: F401
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn

        return "oma.integrations.verl.plugin" in _sys.modules, get_adv_estimator_fn("oma_rloo").__name__

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        loaded, name = ray.get(probe.remote(), timeout=240)
    finally:
        ray.shutdown()
    assert loaded is True and name == "compute_oma_rloo_advantage"


def test_post_import_hook_runs_after_the_module_and_survives_errors(tmp_path, monkeypatch):
    pkg = tmp_path / "omahookpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text("VALUE = 41\n")
    (pkg / "broken.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    _hooks.when_imported("omahookpkg.target", lambda m: seen.append(m.VALUE + 1))

    def boom(_module):
        raise RuntimeError("hook failure")

    _hooks.when_imported("omahookpkg.broken", boom)
    assert seen == [] and "omahookpkg.target" in _hooks.pending()
    import omahookpkg.broken  # noqa: F401  (a failing hook must not break the import)
    import omahookpkg.target

    assert seen == [42] and omahookpkg.target.VALUE == 41
    assert "hook failure" in _hooks.errors()["omahookpkg.broken"]
    _hooks.when_imported("omahookpkg.target", lambda m: seen.append(0))  # already imported: runs now
    assert seen == [42, 0] and "omahookpkg.target" not in _hooks.pending()
    for name in ("omahookpkg.target", "omahookpkg.broken", "omahookpkg"):
        sys.modules.pop(name, None)
    _hooks._errors.pop("omahookpkg.broken", None)
