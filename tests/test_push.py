"""Content-addressed, resumable push over SSH to a real sshd: what is sent, what is skipped,
what is current, and what survives dropped, cut, stalled and throttled links."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import pytest

from edgekit.agent import digest as agent_digest
from edgekit.bundle import TensorSpec, Variant, write_bundle
from edgekit.errors import DeviceError, LinkError, TransportError
from edgekit.fsutil import sha256_file
from edgekit.transport import sftp as sftp_mod
from edgekit.transport.local import LocalTransport
from edgekit.transport.push import PushProgress, _hash_of, _store, describe, push_bundle, rollback
from edgekit.transport.ssh import SshTransport
from tests.conftest import wait_until
from tests.lab import sshd as sshd_mod
from tests.lab.proxy import TcpProxy

pytestmark = pytest.mark.ssh
MB = 1 << 20


def _bundle(tmp_path: Path, name: str, files: dict[str, bytes]):
    src = tmp_path / f"src-{name}"
    src.mkdir()
    paths = {}
    for rel, data in files.items():
        p = src / rel.replace("/", "_")
        p.write_bytes(data)
        paths[rel] = p
    model = next(iter(files))
    variant = Variant("fp32", "onnxruntime", "fp32", model, (TensorSpec("x", (1, 4), "float32"),), ())
    return write_bundle(
        tmp_path / f"bundle-{name}", files=paths, model_name=name, model_sha256="0" * 64, profile="local",
        backend="onnxruntime", precision="fp32", variants=[variant], plan={},
    )  # fmt: skip


def _device_root(server: sshd_mod.Sshd) -> Path:
    return server.home / ".edgekit"


def _assert_whole(root: Path, bundle) -> None:
    d = root / "bundles" / bundle.manifest.bundle_hash
    for f in bundle.manifest.files:
        assert sha256_file(d / f.path) == f.sha256, f.path
    assert (d / "manifest.json").read_bytes() == (bundle.root / "manifest.json").read_bytes()


def _current(root: Path) -> str | None:
    try:
        return os.readlink(root / "current")
    except FileNotFoundError:
        return None


def current_bundle(transport) -> str | None:
    """The bundle hash ``current`` points at on the device (None: nothing pushed yet)."""
    return _hash_of(_store(transport, "status", {}).get("current"))


def _check_current_is_whole(root: Path) -> None:
    """Whatever `current` points at is a complete bundle: every file matches its manifest."""
    import json

    target = _current(root)
    if target is None:
        return
    d = root / target
    manifest = json.loads((d / "manifest.json").read_text())
    for f in manifest["files"]:
        assert sha256_file(d / f["path"]) == f["sha256"], f"current has a half-written {f['path']}"
    assert not [p for p in d.rglob("*") if p.name.endswith((".part", ".tmp"))]


def test_push_is_content_addressed_across_bundles_with_current_and_rollback(ssh_device, sshd_server, tmp_path):
    shared = os.urandom(300_000)
    a = _bundle(tmp_path, "a", {"fp32/model.onnx": os.urandom(200_000), "fp32/inputs.npz": shared})
    b = _bundle(tmp_path, "b", {"fp32/model.onnx": os.urandom(250_000), "fp32/inputs.npz": shared})
    root = _device_root(sshd_server)

    first = push_bundle(ssh_device, a)
    assert (first.files_sent, first.files_skipped, first.retries, first.resumed) == (3, 0, 0, 0)
    assert first.current == a.manifest.bundle_hash and first.previous is None
    _assert_whole(root, a)
    assert _current(root) == f"bundles/{a.manifest.bundle_hash}"
    # materialized as hard links into the object store
    obj = root / "objects" / a.manifest.files[0].sha256
    assert os.path.samefile(root / "bundles" / a.manifest.bundle_hash / a.manifest.files[0].path, obj)

    again = push_bundle(ssh_device, a)
    assert (again.bytes_sent, again.files_sent, again.files_skipped) == (0, 0, 3)
    assert again.duration_s < 1.0

    second = push_bundle(ssh_device, b)  # shares inputs.npz with a: not sent again
    assert second.files_sent == 2 and second.files_skipped == 1
    assert second.bytes_sent == b.path("fp32/model.onnx").stat().st_size + (b.root / "manifest.json").stat().st_size
    assert (second.current, second.previous) == (b.manifest.bundle_hash, a.manifest.bundle_hash)
    assert current_bundle(ssh_device) == b.manifest.bundle_hash
    _assert_whole(root, b)

    assert rollback(ssh_device) == (a.manifest.bundle_hash, b.manifest.bundle_hash)
    assert _current(root) == f"bundles/{a.manifest.bundle_hash}"
    _assert_whole(root, a)

    inactive = push_bundle(ssh_device, b, activate=False)
    assert inactive.current == a.manifest.bundle_hash and inactive.bytes_sent == 0


def test_damaged_files_on_the_device_are_repaired(ssh_device, sshd_server, tmp_path):
    a = _bundle(tmp_path, "a", {"fp32/model.onnx": os.urandom(100_000), "fp32/inputs.npz": os.urandom(5000)})
    first = push_bundle(ssh_device, a)
    d = _device_root(sshd_server) / "bundles" / a.manifest.bundle_hash
    (d / "fp32" / "model.onnx").write_bytes(b"half a fi")  # through the hard link: the object too
    (d / "fp32" / "inputs.npz").unlink()
    fixed = push_bundle(ssh_device, a)
    assert fixed.files_sent == 1 and fixed.bytes_sent == 100_000
    _assert_whole(_device_root(sshd_server), a)
    assert first.remote_dir == fixed.remote_dir


def test_local_and_ssh_push_lay_out_the_device_the_same(ssh_device, sshd_server, tmp_path):
    a = _bundle(tmp_path, "a", {"m.onnx": os.urandom(1000), "x/y.npz": os.urandom(10)})
    local = LocalTransport(tmp_path / "local-device")
    r_local, r_ssh = push_bundle(local, a), push_bundle(ssh_device, a)
    assert r_local.to_dict().keys() == r_ssh.to_dict().keys()
    assert (r_local.files_sent, r_local.bytes_sent, r_local.current) == (r_ssh.files_sent, r_ssh.bytes_sent, r_ssh.current)

    def tree(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name != ".verified.json")

    assert tree(tmp_path / "local-device") == tree(_device_root(sshd_server))


def test_uploads_fill_whole_ssh_packets_with_large_writes(ssh_device, sshd_server, tmp_path):
    """Each write request is as large as the server takes and ends exactly on a channel packet:
    a 20 MB upload costs about one SSH packet per 32 KB (SFTPFile.write's 32 KiB requests took two)."""
    size = 20 * MB
    a = _bundle(tmp_path, "a", {"m.onnx": os.urandom(size)})
    ssh_device.mkdir(ssh_device.root)  # connect, so the packets counted below are the upload's
    files = ssh_device.files
    sftp = files._sftp_client()
    packetizer = ssh_device._transport.packetizer
    counter = "_Packetizer__sent_packets"  # paramiko's rekey counter (reset on rekey: every 1 GB)
    if not hasattr(packetizer, counter):
        pytest.skip("this paramiko has no packet counter to check")
    before = getattr(packetizer, counter)
    push_bundle(ssh_device, a)
    packets = getattr(packetizer, counter) - before
    payload = sftp.get_channel().out_max_packet_size - 64  # what one channel packet carries
    assert ssh_device._transport.local_cipher == "aes128-gcm@openssh.com"  # paramiko's cheapest; OpenSSH has it
    assert files._max_write > sftp_mod.MIN_WRITE  # OpenSSH answers limits@openssh.com (255 KiB)
    chunk = files._write_size(sftp, 4)  # OpenSSH's handles are 4 bytes
    assert (chunk + 29) % payload == 0 and sftp_mod.MIN_WRITE < chunk <= files._max_write
    assert size / payload <= packets < size / payload * 1.1 + 200  # + the store's commands and answers
    _assert_whole(_device_root(sshd_server), a)


@pytest.mark.parametrize("size", [100_000, 5 * MB], ids=["read-back", "follower"])
def test_an_upload_that_does_not_hash_right_is_refused(ssh_device, sshd_server, tmp_path, size):
    """Both device-side checks (small files read back over SFTP, big ones hashed by the follower
    as they arrive) refuse bytes whose sha256 is not the promised one, and leave nothing behind."""
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(size))
    ssh_device.mkdir("up")
    with pytest.raises(TransportError, match="arrived corrupted"):
        ssh_device.put(src, "up/f.bin", sha256="0" * 64)
    assert not list((_device_root(sshd_server) / "up").iterdir())
    stats = ssh_device.put(src, "up/f.bin", sha256=sha256_file(src))
    assert stats.bytes_sent == size
    assert sha256_file(_device_root(sshd_server) / "up" / "f.bin") == sha256_file(src)


def test_a_small_upload_is_checked_without_a_device_command(ssh_device, sshd_server, tmp_path):
    """Up to READBACK_MAX the check is a read-back over SFTP: no hasher process on the device."""
    src = tmp_path / "small.bin"
    src.write_bytes(os.urandom(sftp_mod.READBACK_MAX))
    ssh_device.mkdir("up")
    commands: list[tuple] = []
    real_exec = ssh_device._exec

    def counting_exec(argv, *args, **kwargs):
        commands.append(tuple(argv))
        return real_exec(argv, *args, **kwargs)

    ssh_device._exec = counting_exec
    ssh_device.put(src, "up/small.bin", sha256=sha256_file(src))
    assert commands == []
    assert sha256_file(_device_root(sshd_server) / "up" / "small.bin") == sha256_file(src)
    bigger = tmp_path / "bigger.bin"
    bigger.write_bytes(os.urandom(sftp_mod.READBACK_MAX + 1))
    ssh_device.put(bigger, "up/bigger.bin", sha256=sha256_file(bigger))
    assert len(commands) == 1 and "sh" in commands[0]  # above it: the device's hasher


def test_a_server_without_aes_gcm_gets_ctr_with_encrypt_then_mac(tmp_path):
    """Without AES-GCM on the server, the fallback is AES-CTR with an encrypt-then-MAC digest
    (paramiko alone would pick MAC-then-encrypt hmac-sha2-256), and uploads still verify."""
    from paramiko import SSHConfig

    extra = ("Ciphers aes128-ctr,aes256-ctr", "MACs hmac-sha2-256,hmac-sha2-256-etm@openssh.com")
    with sshd_mod.Sshd(tmp_path / "ctr-sshd", extra=extra) as server:
        known = tmp_path / "known_hosts"
        known.write_text(server.known_hosts_line())
        config = SSHConfig.from_text(server.ssh_config("ctr") + f"    UserKnownHostsFile {known}\n")
        dev = SshTransport("ctr", workdir=str(server.home / "dev"), ssh_config=config)
        try:
            a = _bundle(tmp_path, "a", {"m.onnx": os.urandom(300_000)})
            push_bundle(dev, a)
            assert (dev._transport.local_cipher, dev._transport.local_mac) == ("aes128-ctr", "hmac-sha2-256-etm@openssh.com")
        finally:
            dev.close()
        _assert_whole(server.home / "dev", a)


def test_the_follower_hashes_a_growing_file_and_flushes_it(tmp_path):
    """The device's follower (digest.py) hashes a file while another writer appends to it, and
    its periodic fsync (here every 100 KB) leaves the digest exact."""
    path = tmp_path / "growing.part"
    data = os.urandom(1 * MB + 123)
    path.write_bytes(b"")
    result: dict[str, object] = {}

    def follow() -> None:
        try:
            result["digest"] = agent_digest.sha256_file(str(path), len(data), 10.0, 100_000)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            result["error"] = exc

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    with open(path, "ab") as fh:
        for i in range(0, len(data), 64 * 1024):
            fh.write(data[i : i + 64 * 1024])
            fh.flush()
    follower.join(timeout=30)
    assert not follower.is_alive() and "error" not in result
    assert result["digest"] == sha256_file(path)


@pytest.mark.slow
def test_killing_the_connection_mid_file_20_times(ssh_home, sshd_server, tmp_path):
    """Kill the sshd serving the push 20 times mid-file: every retry resumes, `current` is
    never a half-written bundle, and the final bundle is byte-exact."""
    ssh_home.trust()
    dev = SshTransport("lab", idle_timeout=10)
    root = _device_root(sshd_server)
    old = _bundle(tmp_path, "old", {"fp32/model.onnx": os.urandom(50_000)})
    push_bundle(dev, old)
    # big enough that 20 kills fit even when progress comes in steps of a whole write request
    # (up to ~255 KiB each: a kill lands one to three requests after the step)
    size = 20 * MB
    new = _bundle(tmp_path, "new", {"fp32/model.onnx": os.urandom(size), "fp32/inputs.npz": os.urandom(1000)})
    step = 500_000
    kills: list[int] = []
    checked = [0]

    def on_progress(p: PushProgress) -> None:
        if len(kills) < 20 and p.file and p.bytes_done >= (kills[-1] if kills else 0) + step:
            _check_current_is_whole(root)
            assert _current(root) == f"bundles/{old.manifest.bundle_hash}"
            checked[0] += 1
            kills.append(p.bytes_done)
            assert sshd_server.kill_connections() > 0

    result = push_bundle(dev, new, progress=on_progress, retries=3, backoff_s=0.0)
    dev.close()
    assert len(kills) == 20 and checked[0] == 20
    assert result.retries == 20
    assert result.resumed >= 12  # most kills left a partial temp file to continue from
    # ... so each kill cost what was in flight (up to the 2 MB SSH window and socket buffers),
    # not the file from the start again (which would add up to ~200 MB here)
    assert size < result.bytes_sent < size + MB + 20 * 3 * MB
    _assert_whole(root, new)
    assert _current(root) == f"bundles/{new.manifest.bundle_hash}"
    assert os.readlink(root / "previous") == f"bundles/{old.manifest.bundle_hash}"
    assert not list((root / "objects").glob(".*.part"))  # no temp files left behind


def _proxied(ssh_home, server: sshd_mod.Sshd, proxy: TcpProxy, alias: str = "viaproxy") -> None:
    """An alias reaching ``server`` through ``proxy``, with the server's known host key."""
    ssh_home.trust()
    with open(ssh_home.config, "a") as fh:
        fh.write(
            f"\nHost {alias}\n    HostName 127.0.0.1\n    Port {proxy.port}\n    User {server.user}\n"
            f"    IdentityFile {server.client_key}\n    IdentitiesOnly yes\n    HostKeyAlias {server.known_hosts_name}\n"
        )


def test_connections_cut_by_the_network_resume(ssh_home, sshd_server, tmp_path):
    with TcpProxy("127.0.0.1", sshd_server.port) as proxy:
        _proxied(ssh_home, sshd_server, proxy)
        # the sender may be a whole SSH window (2 MB) ahead of what the device has written when
        # the link drops: cut later than that, so every cut leaves a part to resume from. 16 MB:
        # even when the device kept all 5 + 4 MB of the first two links, the third has 7 MB to
        # send and is cut too (at 12 MB it sometimes finished first: 2 cuts, not 3)
        proxy.cut_after(5 * MB)
        proxy.cut_after(4 * MB, count=2)
        dev = SshTransport("viaproxy", idle_timeout=10)
        b = _bundle(tmp_path, "b", {"fp32/model.onnx": os.urandom(16 * MB)})
        result = push_bundle(dev, b, backoff_s=0.0)
        dev.close()
        assert proxy.cuts == 3 and result.retries == 3 and result.resumed >= 2
    _assert_whole(_device_root(sshd_server), b)


def test_a_stalled_link_times_out_and_the_push_resumes(ssh_home, sshd_server, tmp_path):
    with TcpProxy("127.0.0.1", sshd_server.port) as proxy:
        _proxied(ssh_home, sshd_server, proxy)
        proxy.freeze_after(2 * MB)  # the first connection goes silent: no error, no close
        dev = SshTransport("viaproxy", idle_timeout=2)
        b = _bundle(tmp_path, "b", {"fp32/model.onnx": os.urandom(8 * MB)})
        start = time.monotonic()
        result = push_bundle(dev, b, backoff_s=0.0)
        dev.close()
        assert proxy.frozen.is_set() and result.retries == 1 and result.resumed == 1
        assert time.monotonic() - start < 60
    _assert_whole(_device_root(sshd_server), b)


def test_retries_are_bounded_with_exponential_back_off(ssh_home, sshd_server, tmp_path):
    ssh_home.trust()
    dev = SshTransport("lab", connect_timeout=5, idle_timeout=5)
    b = _bundle(tmp_path, "b", {"fp32/model.onnx": os.urandom(4 * MB)})
    waits: list[float] = []

    def on_progress(p: PushProgress) -> None:
        if p.bytes_done > MB and sshd_server.proc is not None:
            sshd_server.stop()  # the device goes away for good

    with pytest.raises(TransportError) as err:
        push_bundle(dev, b, progress=on_progress, retries=5, backoff_s=0.01, max_backoff_s=0.05, sleep=waits.append)
    assert waits == [0.01, 0.02, 0.04, 0.05, 0.05]
    # data moved before the device went away: say how far the push got, not only the last failure
    assert not isinstance(err.value, LinkError) and err.value.exit_code == 4
    assert re.fullmatch(r"push interrupted after \d+ of \d+ bytes \(.*connection refused.*\); run again to resume", err.value.message)
    done, total = map(int, re.findall(r"\d+", err.value.message)[:2])
    assert MB < done < total == 4 * MB + (b.root / "manifest.json").stat().st_size
    dev.close()


def test_progress_reports_bytes_and_rate(ssh_device, tmp_path):
    b = _bundle(tmp_path, "b", {"fp32/model.onnx": os.urandom(3 * MB), "fp32/inputs.npz": os.urandom(1000)})
    seen: list[PushProgress] = []
    push_bundle(ssh_device, b, progress=seen.append)
    total = 3 * MB + 1000 + (b.root / "manifest.json").stat().st_size
    assert seen and seen[-1].bytes_done == seen[-1].bytes_total == total
    assert seen[-1].files_done == seen[-1].files_total == 3
    assert [p.bytes_done for p in seen] == sorted(p.bytes_done for p in seen)
    assert all(p.rate_bps > 0 for p in seen)
    assert describe(seen[-1]).startswith(f"pushing {total / 1e6:.1f} / {total / 1e6:.1f} MB")


@pytest.fixture
def tiny_disk(tmpfs):
    return tmpfs("2m")


def test_full_device_refuses_the_push_before_sending(ssh_home, tiny_disk, tmp_path):
    ssh_home.trust()
    dev = SshTransport("lab", workdir=str(tiny_disk / "edgekit"))
    b = _bundle(tmp_path, "b", {"fp32/model.onnx": os.urandom(3 * MB)})
    with pytest.raises(DeviceError) as err:
        push_bundle(dev, b)
    assert err.value.message.startswith("not enough space on the device: the push needs 3.1 MB")
    # only the agent (it runs the device's side of the push) and the verified-objects cache
    left = {p.relative_to(tiny_disk / "edgekit").parts[0] for p in (tiny_disk / "edgekit").rglob("*") if p.is_file()}
    assert left == {"agent", "objects"} and not [p for p in (tiny_disk / "edgekit" / "objects").iterdir() if p.name != ".verified.json"]
    dev.close()


# -- separate hosts (network namespaces, root) ------------------------------------------------------


@pytest.fixture
def ns_device(netns, ssh_home, tmp_path):
    ns = netns()
    server = sshd_mod.Sshd(tmp_path / "nsd", host=ns.addr, port=22, prefix=ns.prefix)
    server.start()
    ssh_home.add_host("board", server)
    ssh_home.trust(server)
    yield ns, server
    server.stop()


@pytest.mark.netns
@pytest.mark.slow
def test_bandwidth_cap_shows_in_the_reported_rate(ns_device, tmp_path):
    ns, server = ns_device
    ns.tbf("16mbit")  # 2 MB/s
    dev = SshTransport("board")
    b = _bundle(tmp_path, "b", {"fp32/model.onnx": os.urandom(3 * MB)})
    seen: list[PushProgress] = []
    result = push_bundle(dev, b, progress=seen.append)
    dev.close()
    assert result.bytes_sent / result.duration_s < 2.6e6  # no faster than the link allows
    assert seen[-1].rate_bps < 2.6e6  # the reported rate, once the data is on the device
    _assert_whole(_device_root(server), b)


@pytest.mark.netns
def test_random_loss_still_delivers_exact_bytes(ns_device, tmp_path):
    ns, server = ns_device
    ns.loss(10)
    dev = SshTransport("board", idle_timeout=30)
    b = _bundle(tmp_path, "b", {"fp32/model.onnx": os.urandom(MB)})
    push_bundle(dev, b, backoff_s=0.0)
    dev.close()
    _assert_whole(_device_root(server), b)


@pytest.mark.netns
@pytest.mark.slow
def test_pulled_cable_mid_push_then_plugged_back(ns_device, tmp_path):
    ns, server = ns_device
    dev = SshTransport("board", connect_timeout=3, idle_timeout=3)
    b = _bundle(tmp_path, "b", {"fp32/model.onnx": os.urandom(16 * MB)})
    pulled = []

    def on_progress(p: PushProgress) -> None:
        if not pulled and p.bytes_done > 2 * MB:
            ns.drop_all()  # every packet dropped: paramiko sees nothing, not even an error
            pulled.append(time.monotonic())

    start = time.monotonic()
    result = push_bundle(dev, b, progress=on_progress, sleep=lambda s: ns.restore())  # plugged back in
    dev.close()
    assert pulled and result.retries >= 1 and result.resumed >= 1
    assert time.monotonic() - start < 90
    _assert_whole(_device_root(server), b)


def _parts(root: Path) -> list[Path]:
    return sorted((root / "objects").glob(".*.part"))


def test_a_push_cut_for_good_says_how_far_it_got_and_the_next_push_resumes(ssh_home, sshd_server, tmp_path):
    # A small model (under the old 4 MB batch bound), the link cut mid-file and not back in
    # time: the push reports how far it got (exit 4), the device keeps the part, and the next
    # push continues from it instead of sending the whole file again.
    b = _bundle(tmp_path, "b", {"fp32/model.onnx": os.urandom(3 * MB)})
    size = 3 * MB
    root = _device_root(sshd_server)
    with TcpProxy("127.0.0.1", sshd_server.port) as proxy:
        _proxied(ssh_home, sshd_server, proxy)
        proxy.cut_after(2 * MB + 512 * 1024)
        dev = SshTransport("viaproxy", idle_timeout=10)
        with pytest.raises(TransportError) as err:  # after the cut the device stays away
            push_bundle(dev, b, retries=1, backoff_s=0.0, sleep=lambda s: proxy.stop())
        dev.close()
        assert proxy.cuts == 1
    assert err.value.exit_code == 4 and "push interrupted after" in err.value.message
    assert err.value.message.endswith("; run again to resume")
    # the cut connection's sftp-server may still be writing what it had buffered: wait until it is gone
    assert wait_until(lambda: not sshd_server.connection_pids(), timeout=30)
    (part,) = _parts(root)
    kept = part.stat().st_size
    assert 0 < kept < size
    ssh_home.trust()
    dev = SshTransport("lab")
    result = push_bundle(dev, b)
    dev.close()
    assert result.resumed == 1
    assert result.bytes_sent == size - kept + (b.root / "manifest.json").stat().st_size
    _assert_whole(root, b)
    assert not _parts(root)


def test_a_part_that_does_not_match_the_file_is_sent_again_from_the_start(ssh_device, sshd_server, tmp_path):
    data = os.urandom(MB)
    b = _bundle(tmp_path, "b", {"fp32/model.onnx": data})
    root = _device_root(sshd_server)
    sha = b.manifest.files[0].sha256
    (root / "objects").mkdir(parents=True)
    (root / "objects" / f".{sha}.{sha[:16]}.part").write_bytes(b"not the start" + data[13:400_000])
    result = push_bundle(ssh_device, b)
    assert result.resumed == 0 and result.bytes_sent == MB + (b.root / "manifest.json").stat().st_size
    _assert_whole(root, b)


def test_the_store_drops_parts_no_push_will_continue(ssh_device, sshd_server, tmp_path):
    a = _bundle(tmp_path, "a", {"fp32/model.onnx": os.urandom(1000)})
    push_bundle(ssh_device, a)
    objects = _device_root(sshd_server) / "objects"
    present = a.manifest.files[0].sha256
    done = objects / f".{present}.{present[:16]}.part"  # its object arrived meanwhile
    stale = objects / f".{'1' * 64}.{'1' * 16}.part"  # a push given up on long ago
    fresh = objects / f".{'2' * 64}.{'2' * 16}.part"  # may still be continued
    for p in (done, stale, fresh):
        p.write_bytes(b"x" * 100)
    os.utime(stale, (time.time() - 25 * 3600,) * 2)
    push_bundle(ssh_device, a)
    assert _parts(_device_root(sshd_server)) == [fresh]


def test_bundles_of_the_same_files_for_two_boards_keep_their_own_manifests(ssh_device, sshd_server, tmp_path):
    # rpi4 and rpi5 bundles of one model: the same files, different manifests (profile, options)
    src = tmp_path / "model.onnx"
    src.write_bytes(os.urandom(50_000))
    bundles = {}
    for board, threads in (("rpi4", 4), ("rpi5", 8)):
        variant = Variant("int8", "native", "int8", "int8/model.onnx", (TensorSpec("x", (1, 4), "float32"),), (), {"threads": threads})
        bundles[board] = write_bundle(
            tmp_path / board, files={"int8/model.onnx": src}, model_name="m", model_sha256="0" * 64, profile=board,
            backend="native", precision="int8", variants=[variant], plan={},
        )  # fmt: skip
    assert bundles["rpi4"].manifest.bundle_hash != bundles["rpi5"].manifest.bundle_hash
    root = _device_root(sshd_server)
    for board in ("rpi4", "rpi5", "rpi4"):
        result = push_bundle(ssh_device, bundles[board])
        assert result.current == bundles[board].manifest.bundle_hash
        assert (root / "current" / "manifest.json").read_bytes() == (bundles[board].root / "manifest.json").read_bytes()
    assert result.bytes_sent == 0  # the model went once; each manifest once
    assert os.readlink(root / "previous") == f"bundles/{bundles['rpi5'].manifest.bundle_hash}"
    # staging the other board's bundle must not touch what `current` names (one shared id did)
    push_bundle(ssh_device, bundles["rpi5"], activate=False)
    assert (root / "current" / "manifest.json").read_bytes() == (bundles["rpi4"].root / "manifest.json").read_bytes()


@pytest.mark.ssh
def test_uploads_work_on_paramikos_own_write_path(ssh_device, sshd_server, tmp_path, monkeypatch):
    # A paramiko whose SFTP internals differ from the ones the fast path drives: its own writes.
    import edgekit.transport.sftp as sftp_mod

    monkeypatch.setattr(sftp_mod, "_pipelines", lambda sftp: False)
    small, big = os.urandom(1000), os.urandom(5 * MB + 3)
    a = _bundle(tmp_path, "a", {"m.onnx": big, "s.bin": small})
    result = push_bundle(ssh_device, a)
    assert result.files_sent >= 2 and result.bytes_sent >= len(big) + len(small)
    _assert_whole(_device_root(sshd_server), a)
