"""Inventories: devices.toml, Ansible INI and YAML, name resolution, and `edgekit devices list`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from edgekit.devices.inventory import expand_hosts, format_address, load_inventory, resolve_devices
from edgekit.errors import InputError, UsageError
from tests.conftest import REPO, assert_one_line_error

TOML = """\
[devices.pi1]
ssh = "pi@10.0.0.7:2222"
profile = "rpi5"
tags = ["lab", "arm"]

[devices.orin]
ssh = "orin-alias"
profile = "jetson-orin-nano"
workdir = "/data/edgekit"
python = "/usr/bin/python3.10"

[devices.here]
ssh = "local"
"""

INI = """\
# Ansible inventory, as embedded teams keep them
edge-gw ansible_host=192.168.1.5

[pis]
pi[01:03]
pi-special ansible_host=10.0.0.9 ansible_port=2200 edgekit_profile=rpi5  # a comment

[pis:vars]
edgekit_profile=rpi4
ansible_user=pi
ansible_python_interpreter=/usr/bin/python3

[jetsons]
orin1 ansible_ssh_host=10.0.1.1 ansible_ssh_user=nvidia edgekit_profile="jetson-orin-nano"

[lab:children]
pis
jetsons

[lab:vars]
edgekit_profile=linux-cpu
edgekit_workdir=/srv/edgekit

[local]
ci-runner ansible_connection=local
"""

YAML = """\
all:
  vars:
    ansible_user: pi
  hosts:
    edge-gw:
      ansible_host: 192.168.1.5
  children:
    lab:
      vars:
        edgekit_profile: linux-cpu
        edgekit_workdir: /srv/edgekit
      children:
        pis:
          vars:
            edgekit_profile: rpi4
          hosts:
            pi[01:03]:
            pi-special:
              ansible_host: 10.0.0.9
              ansible_port: 2200
              edgekit_profile: rpi5
        jetsons:
          hosts:
            orin1:
              ansible_host: 10.0.1.1
              ansible_user: nvidia
              edgekit_profile: jetson-orin-nano
"""


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# -- devices.toml -------------------------------------------------------------------------------


def test_toml_inventory_reads_every_field_in_order(tmp_path):
    inv = load_inventory(_write(tmp_path, "devices.toml", TOML))
    assert list(inv.devices) == ["pi1", "orin", "here"]
    pi1 = inv.get("pi1")
    assert (pi1.address, pi1.profile, pi1.tags, pi1.workdir) == ("pi@10.0.0.7:2222", "rpi5", ("lab", "arm"), None)
    orin = inv.get("orin")
    assert (orin.address, orin.workdir, orin.python) == ("orin-alias", "/data/edgekit", "/usr/bin/python3.10")
    assert inv.get("here").is_local and not pi1.is_local
    assert pi1.source == str(tmp_path / "devices.toml")


def test_missing_inventory_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="inventory file not found"):
        load_inventory(tmp_path / "nope.toml")


# -- Ansible ------------------------------------------------------------------------------------


def _check_ansible(inv):
    assert set(inv.devices) - {"ci-runner"} == {"edge-gw", "pi01", "pi02", "pi03", "pi-special", "orin1"}
    # a group's vars reach its hosts; the deeper group wins over its parent; host vars win over all
    pi02 = inv.get("pi02")
    assert (pi02.address, pi02.profile, pi02.tags, pi02.workdir) == ("pi@pi02", "rpi4", ("lab", "pis"), "/srv/edgekit")
    special = inv.get("pi-special")
    assert (special.address, special.profile, special.tags) == ("pi@10.0.0.9:2200", "rpi5", ("lab", "pis"))
    orin = inv.get("orin1")
    assert (orin.address, orin.profile, orin.workdir, orin.tags) == ("nvidia@10.0.1.1", "jetson-orin-nano", "/srv/edgekit", ("jetsons", "lab"))
    gw = inv.get("edge-gw")
    assert gw.profile is None and gw.workdir is None
    return gw


def test_ansible_ini_inventory(tmp_path):
    inv = load_inventory(_write(tmp_path, "hosts", INI))
    gw = _check_ansible(inv)
    assert gw.address == "192.168.1.5" and gw.tags == ()
    assert inv.get("pi01").python == "/usr/bin/python3"
    assert inv.get("ci-runner").is_local and inv.get("ci-runner").tags == ("local",)
    assert list(inv.devices)[:2] == ["edge-gw", "pi01"]  # file order


def test_ansible_yaml_inventory(tmp_path):
    pytest.importorskip("yaml", reason="PyYAML is optional; the missing-PyYAML error is tested below")
    inv = load_inventory(_write(tmp_path, "hosts.yml", YAML))
    gw = _check_ansible(inv)
    assert gw.address == "pi@192.168.1.5"  # all: vars: ansible_user reaches every host


def test_yaml_inventory_without_pyyaml_says_how_to_fix_it(tmp_path):
    # A Python without PyYAML: the module is made unimportable in a fresh interpreter.
    path = _write(tmp_path, "hosts.yaml", YAML)
    code = "import sys; sys.modules['yaml'] = None; from edgekit.cli import main; main(sys.argv[1:])"
    proc = subprocess.run(
        [sys.executable, "-c", code, "devices", "list", "--inventory", str(path)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert_one_line_error(proc, 3, "needs PyYAML, which is not installed")
    assert "pip install pyyaml" in proc.stderr


@pytest.mark.parametrize(
    "name, text, needle",
    [
        ("devices.toml", '[devices.pi]\nssh = "pi@h"\nport = 22\n', "devices.pi: unknown key 'port'"),
        ("devices.toml", '[devices.pi]\nssh = "pi@h"\ntags = "lab"\n', "devices.pi.tags must be an array of strings"),
        ("devices.toml", '[devices.pi]\nssh = ""\n', "devices.pi.ssh must be a non-empty string"),
        ("devices.toml", '[devices.pi]\nprofile = 5\n', "devices.pi.profile must be a non-empty string"),
        ("devices.toml", '[hosts.pi]\nssh = "x"\n', "unknown top-level key 'hosts'"),
        ("devices.toml", '[devices."pi 1"]\nssh = "x"\n', "has characters edgekit does not allow"),
        ("devices.toml", '[devices.pi\nssh = "x"\n', "invalid TOML"),
        ("hosts.ini", "[pis:hostvars]\npi1\n", "unknown section kind ':hostvars'"),
        ("hosts.ini", "[pis]\nansible_host=1.2.3.4\n", "starts with the host's name"),
        ("hosts.ini", "[pis]\npi1 ansible_port=ssh\n", "ansible_port must be a number"),
        ("hosts.ini", "[pis]\npi1 ansible_host\n", "expected key=value after the host name"),
        ("hosts.ini", "[pis:vars]\nnovalue\n", "expected key=value in [pis:vars]"),
        ("hosts.ini", "[a:children]\nb\n[b:children]\na\n[a]\nh1\n", "is its own ancestor"),
        ("hosts.ini", "[pis]\npi[3:1]\n", "empty host range"),
    ],
)
def test_inventory_errors_name_the_file_and_the_key_or_line(tmp_path, name, text, needle):
    path = _write(tmp_path, name, text)
    with pytest.raises(InputError) as err:
        load_inventory(path)
    assert needle in err.value.message and str(path) in err.value.message
    assert err.value.hint


def test_host_ranges_and_addresses():
    assert expand_hosts("pi[01:03]") == ["pi01", "pi02", "pi03"]
    assert expand_hosts("db-[a:c].lan") == ["db-a.lan", "db-b.lan", "db-c.lan"]
    assert expand_hosts("n[0:10:5]") == ["n0", "n5", "n10"]
    assert expand_hosts("r[1:2]c[1:2]") == ["r1c1", "r1c2", "r2c1", "r2c2"]
    assert format_address("fe80::1", "pi", 22) == "pi@[fe80::1]:22"
    assert format_address("10.0.0.7") == "10.0.0.7"


# -- resolving --device names -------------------------------------------------------------------


def test_resolve_names_groups_and_addresses(tmp_path):
    path = _write(tmp_path, "devices.toml", TOML)
    assert [d.name for d in resolve_devices([], path)] == ["pi1", "orin", "here"]  # --inventory alone: all
    got = resolve_devices(["orin", "@arm", "pi1", "root@10.9.9.9:22", "local"], path)
    assert [d.name for d in got] == ["orin", "pi1", "root@10.9.9.9:22", "local"]  # no duplicates
    direct = got[2]
    assert (direct.address, direct.profile, direct.source) == ("root@10.9.9.9:22", None, "--device")
    with pytest.raises(UsageError) as err:
        resolve_devices(["orni"], path)
    assert "no device 'orni' in inventory" in err.value.message and "did you mean 'orin'" in err.value.hint
    with pytest.raises(UsageError, match="in group 'nope'"):
        resolve_devices(["@nope"], path)
    for bad in ("pi@@127.0.0.1", "pi@", "a b@host", "x;y"):  # refused before any connection is tried
        with pytest.raises(UsageError, match="--device"):
            resolve_devices([bad])


def test_default_inventory_is_found_in_cwd_then_config_dir(tmp_path, monkeypatch, edgekit_home):
    monkeypatch.chdir(tmp_path)
    assert resolve_devices(["pi1"])[0].address == "pi1"  # no inventory: an SSH alias
    assert resolve_devices([]) == []
    (edgekit_home / "config" / "devices.toml").write_text('[devices.pi1]\nssh = "pi@config-dir"\n')
    assert resolve_devices(["pi1"])[0].address == "pi@config-dir"
    (tmp_path / "devices.toml").write_text('[devices.pi1]\nssh = "pi@cwd"\n')
    assert resolve_devices(["pi1"])[0].address == "pi@cwd"
    # names not in the default inventory still reach SSH (it is not an explicit --inventory)
    assert resolve_devices(["other-alias"])[0].address == "other-alias"


# -- the CLI ------------------------------------------------------------------------------------


def test_cli_devices_list(cli, tmp_path):
    path = _write(tmp_path, "hosts.ini", INI)
    r = cli("devices", "list", "--inventory", path, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["inventory"] == str(path)
    names = [d["name"] for d in doc["devices"]]
    assert names[0] == "edge-gw" and "pi-special" in names
    human = cli("devices", "list", "--inventory", path)
    assert human.returncode == 0 and "pi@10.0.0.9:2200" in human.stdout and "7 device(s)" in human.stdout


def test_cli_devices_list_bad_input(cli, tmp_path):
    assert_one_line_error(cli("devices", "list"), 2, "no inventory")
    bad = _write(tmp_path, "devices.toml", '[devices.pi]\nssh = "x"\nport = 1\n')
    assert_one_line_error(cli("devices", "list", "--inventory", bad), 3, "unknown key 'port'")
    assert_one_line_error(cli("devices", "list", "--inventory", tmp_path / "missing.toml"), 3, "inventory file not found")
