"""ARCHITECTURE.md's "Adding a provider", followed for a throwaway cloud: a package (tests/data/acme, put
at providers/acme/) and one line in the registry, nothing else of the fleet changed. The cloud's section
validates a job file (its own keys, its reserved env names), its settings are read as the others', its
GPU names reach a `cloud:` section's offers, and it launches and terminates against a stub of its API.

It runs in a process of its own: the registry there is providers/registry.py's text with the one line
added, so the fleet's own registry and the other tests never see the throwaway cloud."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REGISTRY_LINE = "        VastAIProvider,\n"
ADDED = '        __import__("providers.acme.provider", fromlist=["AcmeProvider"]).AcmeProvider,\n'

SCRIPT = r"""
import json, sys, types
from pathlib import Path

tmp = Path(sys.argv[1])
import providers

providers.__path__.append(str(tmp / "providers"))  # providers/acme/, as the package would be
source = Path("providers/registry.py").read_text()
assert source.count(sys.argv[2]) == 1
registry = types.ModuleType("providers.registry")
registry.__file__ = "providers/registry.py"
sys.modules["providers.registry"] = registry
added = source.replace(sys.argv[2], sys.argv[2] + sys.argv[3])
exec(compile(added, registry.__file__, "exec"), registry.__dict__)

from core.errors import ConfigError
from jobs.spec import load_job
from providers.anycloud import providers_of, rank
from providers.base import LaunchRequest
from providers.world import World
from providers.acme import provider as acme

HEAD = "base_model: trainfleet/tiny-llama\ndatasets:\n  - path: tatsu-lab/alpaca\n"
env = {
    "FLEET_SETTINGS_FILE": "/dev/null", "FLEET_HOME": str(tmp / "home"),
    "FLEET_SECRETS_FILE": str(tmp / "none"), "FLEET_PROVIDERS": "local,acme",
    "ACME_URL": "http://acme.test", "ACME_API_KEY": acme.KEY,
}
world = World.load(env)
out = {"runs": list(world.runs), "url": world.provider("acme").api_url}

def job(text):
    path = tmp / "job.yml"
    path.write_text(HEAD + text)
    return load_job(path)

def problems(text):
    try:
        job(text)
    except ConfigError as exc:
        return [(p.path, p.message) for p in exc.problems]
    return []

spec = job("acme:\n  rack: r7\n  max_bid_per_gpu: 2.5\n").spec
out["validated"] = [spec.provider, type(spec.section).__name__, spec.section.rack]
out["misspelled"] = problems("acme:\n  rakc: r7\n")
out["reserved"] = problems("acme:\n  env:\n    ACME_INSTANCE: other\n")
out["offers"] = [o.offer_id for o in world.provider("acme").list_offers(spec.section)]
cloud = job("cloud:\n  gpu: A100-80GB\n  clouds: [acme]\n  max_bid_per_gpu: 3.0\n").spec.section
ranked = rank(cloud, providers_of(world.provider), world.runs)
out["cloud_fits"] = [(o.key, o.vendor_gpu) for o in ranked.fits]
avoided = job("cloud:\n  gpu: A100-80GB\n  clouds: [acme]\n  avoid: [CN]\n").spec.section
out["avoid"] = [list(u) for u in rank(avoided, providers_of(world.provider), world.runs).unasked]
made = world.provider("acme").launch(LaunchRequest("tf-r1-1", "r1", spec.section))
out["launched"] = [made.name, made.provider, sorted(r["name"] for r in acme.API.values())]
world.provider("acme").terminate("tf-r1-1")
out["after_terminate"] = list(acme.API)
print(json.dumps(out))
"""


def test_a_throwaway_cloud_from_its_package_and_one_registry_line(tmp_path: Path) -> None:
    shutil.copytree(REPO / "tests" / "data" / "acme", tmp_path / "providers" / "acme")
    assert (REPO / "providers" / "registry.py").read_text().count(REGISTRY_LINE) == 1
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), REGISTRY_LINE, ADDED],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["runs"] == ["local", "acme"] and out["url"] == "http://acme.test"  # its settings, as others'
    assert out["validated"] == ["acme", "AcmeSection", "r7"]
    assert [path for path, _ in out["misspelled"]] == ["acme.rakc"]
    ((where, why),) = out["reserved"]
    assert where == "acme.env.ACME_INSTANCE" and "the cloud sets this name on its nodes" in why
    assert out["offers"] == ["a1"]  # its own section's GPU (acme-a100-80), priced by the fleet's rules
    assert out["cloud_fits"] == [["acme:a1", "acme-a100-80"]]  # its GPU names reach a cloud: section
    assert out["avoid"] == [["acme", "Acme does not say where an offer is"]]
    assert out["launched"] == ["tf-r1-1", "acme", ["tf-r1-1"]] and out["after_terminate"] == []
