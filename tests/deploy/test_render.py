"""What the role writes and runs per group and install mode, rendered on the controller without hosts.

``tests/deploy/render.yml`` applies the role's inventory checks, renders its templates and writes the
commands its install tasks would run (the role's own ``vars/main.yml``), for every host of
``deploy/inventory.example.ini`` with the playbook's group variables (``deploy/group_vars``). The
converge (test_deploy.py) runs wheelhouse mode on real hosts; this covers the Raspberry Pi and Jetson
groups, the ``checkout`` and ``index`` modes and the settings the converge leaves at their defaults.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.conftest import REPO_ROOT, ansible_env, ansible_tool

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

pytestmark = [pytest.mark.deploy]

WHEEL = "/controller/build/deploy/dist/edge_node-0.1.0-py3-none-any.whl"
PIP = ["/opt/edge-node/venv/bin/pip", "install", "--disable-pip-version-check", "--no-input"]
# What the install task's probe of a host would report (used by wheelhouse mode only).
TARGET = {"machine": "aarch64", "glibc": "2.36", "python": "3.11"}


def _inventory(tmp_path: Path, host_vars: dict[str, dict] | None = None) -> Path:
    """The example inventory as shipped, beside the playbook's group_vars, plus per-host overrides."""
    inventory = tmp_path / "inventory.ini"
    inventory.write_text((REPO_ROOT / "deploy" / "inventory.example.ini").read_text())
    (tmp_path / "group_vars").symlink_to(REPO_ROOT / "deploy" / "group_vars")
    (tmp_path / "host_vars").mkdir()
    for host, values in (host_vars or {}).items():
        (tmp_path / "host_vars" / f"{host}.yml").write_text(json.dumps(values))  # JSON is YAML
    return inventory


def _render(inventory: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    overrides = {
        "edge_node_render_dir": str(out),
        "edge_node_wheel": WHEEL,  # what the controller's build task would have set
        "edge_node_target": TARGET,
        "ansible_become": False,
        "ansible_python_interpreter": sys.executable,
    }
    cmd = [ansible_tool("ansible-playbook"), "tests/deploy/render.yml", "-i", str(inventory)]
    cmd += ["-e", json.dumps(overrides), *extra]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=ansible_env(), capture_output=True, text=True, timeout=180)


def _rendered(out: Path, host: str) -> tuple[dict, str, dict]:
    config = tomllib.loads((out / host / "config.toml").read_text())
    unit = (out / host / "edge-node.service").read_text()
    install = json.loads((out / host / "install.json").read_text())
    return config, unit, install


def _daemon_reads(config_file: Path) -> dict:
    """The daemon's own reading of a rendered file (what the role's validate step runs before writing it)."""
    cmd = [str(Path(sys.executable).parent / "edge-node"), "start", "--config", str(config_file), "--print-config"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{config_file}: {result.stdout}{result.stderr}"
    return tomllib.loads(result.stdout)


def test_example_inventory_renders_each_group_and_install_mode(tmp_path: Path) -> None:
    """rpi and jetson group variables, and the checkout (pi-kitchen), index (pi-garage), wheelhouse (orin-lab) modes."""
    host_vars = {
        "pi-garage": {
            "edge_node_install_from": "index",
            "edge_node_version": "0.1.0",
            "edge_node_pip_args": "--index-url https://pypi.example.org/simple",
            "edge_node_neighbours": 5,
        },
        "orin-lab": {
            "edge_node_install_from": "wheelhouse",
            "edge_node_tls": True,
            "edge_node_environment": {"OMP_NUM_THREADS": 2, "EDGE_NODE_NOTE": 'a b "c" 50% \\d'},
            "edge_node_start_timeout_s": 600,
        },
    }
    out = tmp_path / "out"
    run = _render(_inventory(tmp_path, host_vars), out)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]

    kitchen, kitchen_unit, kitchen_install = _rendered(out, "pi-kitchen")
    garage, _, garage_install = _rendered(out, "pi-garage")
    orin, orin_unit, orin_install = _rendered(out, "orin-lab")

    # Group variables: Raspberry Pi 5 and Jetson differ in meter, packages, groups and torch's origin.
    assert (kitchen["energy_backend"], orin["energy_backend"]) == ("rpi5", "jetson")
    assert "raspi-utils" in kitchen_install["system_packages"]
    assert "raspi-utils" not in orin_install["system_packages"]
    assert kitchen_install["extra_groups"] == orin_install["extra_groups"] == ["video"]
    assert kitchen_install["venv"] == ["/usr/bin/python3", "-m", "venv", "/opt/edge-node/venv"]
    assert orin_install["venv"] == ["/usr/bin/python3", "-m", "venv", "--system-site-packages", "/opt/edge-node/venv"]
    # Inventory values: the fleet from [edge_node:vars], the capacity on pi-garage's line, node ids.
    assert {c["fleet"] for c in (kitchen, garage, orin)} == {"home-lab"}
    assert (kitchen["node_id"], garage["node_id"], orin["node_id"]) == ("pi-kitchen", "pi-garage", "orin-lab")
    assert (kitchen["capacity"], garage["capacity"]) == ("auto", 0.4)
    assert (kitchen["neighbours"], garage["neighbours"]) == (3, 5)

    # Install modes: the pip command each host would run.
    # A Pi asks for PyPI's last aarch64 CPU torch (2.10; from 2.11 the aarch64 wheels are CUDA builds).
    pi_torch = "torch>=2.3,<2.11"
    assert garage_install["pip"] == [
        *PIP,
        "--index-url",
        "https://pypi.example.org/simple",
        "edge-node==0.1.0",
        pi_torch,
    ]
    wheel_on_host = "/opt/edge-node/wheels/edge_node-0.1.0-py3-none-any.whl"
    assert kitchen_install["pip"] == [*PIP, wheel_on_host, pi_torch]
    assert orin_install["pip"] == [*PIP, "--no-index", "--find-links", "/opt/edge-node/wheels", wheel_on_host]
    # A Jetson's wheelhouse leaves PyPI's torch out (the vendor's comes from the system) and is its own.
    assert orin_install["wheelhouse"].endswith("/wheelhouse/cp311-aarch64-glibc2.36-without-torch")
    assert kitchen_install["wheelhouse"] is None

    # TLS on orin-lab only: the three files under /etc/edge-node/tls; the others say insecure.
    assert (orin["tls_ca"], orin["tls_cert"], orin["tls_key"]) == tuple(
        f"/etc/edge-node/tls/{name}" for name in ("ca.pem", "node.pem", "node.key")
    )
    assert "insecure" not in orin and kitchen["insecure"] is True

    for unit in (kitchen_unit, orin_unit):
        assert "ExecStart=/opt/edge-node/venv/bin/edge-node start --config /etc/edge-node/config.toml" in unit
        assert "Type=notify" in unit and "ReadWritePaths=/var/lib/edge-node" in unit and "User=edge-node" in unit
    # Each extra variable is one quoted assignment, escaped as systemd unquotes it (the converge checks
    # what systemd then gives the daemon); the start timeout is the role's default unless set.
    assert [line for line in orin_unit.splitlines() if line.startswith("Environment=")] == [
        "Environment=PYTHONUNBUFFERED=1",
        'Environment="EDGE_NODE_NOTE=a b \\"c\\" 50%% \\\\d"',
        'Environment="OMP_NUM_THREADS=2"',
    ]
    assert "TimeoutStartSec=300" in kitchen_unit.splitlines() and "TimeoutStartSec=600" in orin_unit.splitlines()
    assert "LimitNOFILE=4096" in kitchen_unit.splitlines()  # fits server_max_connections (512) + the rest

    # The daemon reads every rendered file as written (the role's own check before it replaces one).
    for host, config in (("pi-kitchen", kitchen), ("pi-garage", garage), ("orin-lab", orin)):
        effective = _daemon_reads(out / host / "config.toml")
        for key in ("fleet", "node_id", "energy_backend", "neighbours", "capacity"):
            assert effective[key] == config[key], (host, key, effective[key], config[key])


def test_batch_mixing_install_modes_and_tls_origins_builds_for_every_host_that_needs_it(tmp_path: Path) -> None:
    """The batch's first host installs from the index and brings its own TLS files; the others still get theirs.

    The wheel build and the fleet CA run once per batch (run_once), which takes its condition from the
    first host alone unless the condition asks the whole batch: then the checkout and wheelhouse hosts
    would find no wheel, and the TLS host without files of its own no CA to be issued from.
    """
    controller = tmp_path / "controller"
    own = {f"edge_node_tls_{kind}_file": f"/operator/pki/{kind}.pem" for kind in ("ca", "cert", "key")}
    host_vars = {
        "pi-kitchen": {"edge_node_install_from": "index", "edge_node_tls": True, **own},  # the batch's first
        "pi-garage": {"edge_node_install_from": "checkout", "edge_node_tls": True},
        "orin-lab": {"edge_node_install_from": "wheelhouse"},
    }
    out = tmp_path / "out"
    out.mkdir()
    overrides = {
        "edge_node_render_dir": str(out),
        "edge_node_controller_dir": str(controller),
        "edge_node_source_dir": str(REPO_ROOT),  # the default is relative to the playbook, tests/deploy here
        "ansible_become": False,
        "ansible_python_interpreter": sys.executable,
    }
    cmd = [ansible_tool("ansible-playbook"), "tests/deploy/controller.yml", "-i", str(_inventory(tmp_path, host_vars))]
    run = subprocess.run(
        [*cmd, "-e", json.dumps(overrides)],
        cwd=REPO_ROOT,
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]

    got = {host: json.loads((out / f"{host}.json").read_text()) for host in host_vars}
    assert got["pi-kitchen"]["wheel"] is None
    wheel = got["pi-garage"]["wheel"]
    assert wheel is not None and got["orin-lab"]["wheel"] == wheel
    assert Path(wheel).parent == controller / "dist" and Path(wheel).name.startswith("edge_node-")
    assert Path(wheel).is_file()
    assert run.stdout.count("TASK [edge_node : Build the package's wheel from the checkout on the controller]") == 1
    # The CA exists once, and issued pi-garage's certificate; pi-kitchen's are its own, none issued.
    assert (controller / "tls" / "ca.pem").is_file() and (controller / "tls" / "ca.key").is_file()
    assert got["pi-garage"]["certificate"] == str(controller / "tls" / "nodes" / "pi-garage.pem")
    assert Path(got["pi-garage"]["certificate"]).is_file()
    assert got["pi-kitchen"]["certificate"] is None and not (controller / "tls" / "nodes" / "pi-kitchen.pem").exists()


def test_fleet_id_written_as_a_number_in_the_ini_inventory_is_taken_as_its_digits(tmp_path: Path) -> None:
    """``edge_node_fleet=123`` in INI is the number 123 to Ansible; the daemon gets the fleet id "123"."""
    inventory = _inventory(tmp_path)
    text = inventory.read_text()
    assert "edge_node_fleet=home-lab" in text
    inventory.write_text(text.replace("edge_node_fleet=home-lab", "edge_node_fleet=123"))
    out = tmp_path / "out"
    run = _render(inventory, out)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    config, _, _ = _rendered(out, "pi-garage")
    assert config["fleet"] == "123"
    assert _daemon_reads(out / "pi-garage" / "config.toml")["fleet"] == "123"


PLUGIN_WHEEL = "/controller/build/deploy/plugins/digits_tabular/edge_node_digits_tabular-0.1.0-py3-none-any.whl"


def test_a_users_package_is_installed_next_to_edge_node_and_the_config_names_its_factories(tmp_path: Path) -> None:
    """edge_node_plugin_packages: its wheel goes into the same pip command; model and dataset name its factories."""
    plugin = {
        "edge_node_plugin_packages": ["/controller/src/examples/digits_tabular"],
        "edge_node_model": "digits_tabular:mlp",
        "edge_node_dataset": "digits_tabular:digits",
        "edge_node_partition": "dir:0.3",
        "edge_node_client_index": 1,
        "edge_node_num_clients": 3,
    }
    host_vars = {"pi-kitchen": plugin, "orin-lab": {**plugin, "edge_node_install_from": "wheelhouse"}}
    out = tmp_path / "out"
    run = _render(_inventory(tmp_path, host_vars), out, "-e", json.dumps({"edge_node_plugin_wheels": [PLUGIN_WHEEL]}))
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    kitchen, _, kitchen_install = _rendered(out, "pi-kitchen")
    _, _, orin_install = _rendered(out, "orin-lab")
    wheel_on_host = "/opt/edge-node/wheels/edge_node-0.1.0-py3-none-any.whl"
    plugin_on_host = "/opt/edge-node/wheels/edge_node_digits_tabular-0.1.0-py3-none-any.whl"
    assert kitchen_install["pip"] == [*PIP, wheel_on_host, plugin_on_host, "torch>=2.3,<2.11"]
    assert orin_install["pip"] == [*PIP, "--no-index", "--find-links", "/opt/edge-node/wheels", wheel_on_host,
                                   plugin_on_host]  # fmt: skip
    # a wheel rebuilt under the same version is reinstalled by the handler, the user's with edge-node's
    assert kitchen_install["reinstall"][-2:] == [wheel_on_host, plugin_on_host]
    assert (kitchen["model"], kitchen["dataset"], kitchen["num_clients"]) == (
        "digits_tabular:mlp",
        "digits_tabular:digits",
        3,
    )
    effective = _daemon_reads(out / "pi-kitchen" / "config.toml")  # the daemon takes the factory names as written
    assert (effective["model"], effective["dataset"]) == ("digits_tabular:mlp", "digits_tabular:digits")


BAD_VALUES = {
    "model-factory-without-its-package": (
        {"edge_node_model": "mypkg.nets:mlp"},
        'pi-garage: edge_node_model="mypkg.nets:mlp" is not one of cnn, resnet18, vgg11',
    ),
    "data-factory-without-its-package": (
        {"edge_node_dataset": "mypkg.data:load"},
        'pi-garage: edge_node_dataset="mypkg.data:load" names a data factory',
    ),
    "plugin-packages-as-string": (
        {"edge_node_plugin_packages": "/controller/mypkg"},
        'pi-garage: edge_node_plugin_packages="/controller/mypkg" must be a list',
    ),
    "fleet-a-float": ({"edge_node_fleet": 1.5}, "pi-garage: edge_node_fleet=1.5 must be a fleet id"),
    "fleet-a-boolean": ({"edge_node_fleet": True}, "pi-garage: edge_node_fleet=true must be a fleet id"),
    "fleet-with-a-dot": ({"edge_node_fleet": "lab.1"}, 'pi-garage: edge_node_fleet="lab.1" must be a fleet id'),
    "environment-name": (
        {"edge_node_environment": {"BAD NAME": "1"}},
        'pi-garage: edge_node_environment={"BAD NAME": "1"} must be a mapping of variable names',
    ),
    "environment-line-break": (
        {"edge_node_environment": {"A": "1\nExecStartPre=/bin/false"}},
        "pi-garage: edge_node_environment=",
    ),
    "neighbours-zero": ({"edge_node_neighbours": 0}, "pi-garage: edge_node_neighbours=0 must be a whole number >= 1"),
    "neighbours-in-extra-config": (
        {"edge_node_extra_config": {"neighbours": 4}},
        'pi-garage: edge_node_extra_config={"neighbours": 4} must be a mapping without the keys the role writes',
    ),
    "exclude-as-string": (
        {"edge_node_install_from": "wheelhouse", "edge_node_wheelhouse_exclude": "torch"},
        'pi-garage: edge_node_install_from="wheelhouse"',
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_value_fails_the_checks_naming_host_and_variable(case: str, tmp_path: Path) -> None:
    values, message = BAD_VALUES[case]
    out = tmp_path / "out"
    run = _render(_inventory(tmp_path, {"pi-garage": values}), out)
    assert run.returncode != 0, run.stdout[-3000:]
    assert message in run.stdout, run.stdout[-3000:]
    assert not out.exists(), "files were rendered despite a failed check"


def test_the_role_turns_on_metrics_and_json_logs(tmp_path: Path) -> None:
    """edge_node_metrics_listen writes metrics_listen (which the daemon reads back); edge_node_log_format reaches
    the unit's command line; neither is set by default."""
    inventory = _inventory(tmp_path, {"pi-kitchen": {"edge_node_metrics_listen": "127.0.0.1:9478",
                                                     "edge_node_log_format": "json"}})  # fmt: skip
    result = _render(inventory, tmp_path / "out")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    kitchen, kitchen_unit, _ = _rendered(tmp_path / "out", "pi-kitchen")
    garage, garage_unit, _ = _rendered(tmp_path / "out", "pi-garage")
    assert kitchen["metrics_listen"] == "127.0.0.1:9478" and "metrics_listen" not in garage
    assert _daemon_reads(tmp_path / "out" / "pi-kitchen" / "config.toml")["metrics_listen"] == "127.0.0.1:9478"
    assert "config.toml --log-format json\n" in kitchen_unit and "config.toml --log-format text\n" in garage_unit
