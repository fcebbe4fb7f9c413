"""A device's reply is bounded and parsed strictly (issue 26, item 4's host side): a compromised or
broken agent cannot make the host use gigabytes, recurse without end, or store numbers that are
not numbers. Each of these is an AgentError/TransportError (exit 4), never exit 1."""

from __future__ import annotations

import json
import sys

import pytest

from edgekit.agent import MAX_SAMPLES
from edgekit.agentclient import parse_agent_output
from edgekit.errors import EXIT_DEVICE, AgentError, TransportError
from edgekit.jsonable import strict_loads
from edgekit.transport.agentzip import ask_server
from edgekit.transport.base import MAX_ANSWER_BYTES, CommandResult
from edgekit.transport.local import LocalTransport
from tests.builders import bench_doc


def _result(stdout: bytes, code: int = 0) -> CommandResult:
    return CommandResult(("python3", "agent.pyz", "bench"), code, stdout, b"", 0.1)


def _doc_text(**overrides) -> str:
    return json.dumps(bench_doc(**overrides))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (_doc_text().replace('"samples_ns": [3000000', '"samples_ns": [1e400'), "number 1e400 is out of range"),
        (_doc_text().replace('"load_ns": 123400000', '"load_ns": 1e400'), "number 1e400 is out of range"),
        (_doc_text().replace('"load_ns": 123400000', '"load_ns": -1e999'), "out of range"),
        (_doc_text().replace('"load_ns": 123400000', '"load_ns": NaN'), "NaN is not a JSON number"),
        (_doc_text().replace('"load_ns": 123400000', '"load_ns": Infinity'), "Infinity is not a JSON number"),
        (_doc_text().replace('"layers": null', '"layers": ' + "[" * 100_000 + "]" * 100_000), "nested more than 64 levels deep"),
        (_doc_text().replace('"layers": null', '"layers": ' + "[" * 70 + "]" * 70), "nested more than 64 levels deep"),
    ],
)
def test_strict_parsing_of_a_reply(text, needle):
    with pytest.raises(AgentError) as err:
        parse_agent_output(_result(text.encode()))
    assert needle in err.value.message and err.value.hint and err.value.exit_code == EXIT_DEVICE


def test_a_sample_that_is_no_int64_is_refused():
    with pytest.raises(AgentError, match="samples_ns"):
        parse_agent_output(_result(_doc_text(samples=[5, 2**70]).encode()))


def test_more_samples_than_an_agent_sends_are_refused():
    text = _doc_text(samples=[1000] * (MAX_SAMPLES + 1))
    with pytest.raises(AgentError) as err:
        parse_agent_output(_result(text.encode()))
    assert f"has {MAX_SAMPLES + 1} samples; an agent sends at most {MAX_SAMPLES}" in err.value.message
    assert parse_agent_output(_result(_doc_text(samples=[1000] * 1000).encode()))["samples_ns"][0] == 1000


def test_a_reply_over_the_byte_cap_is_refused_before_it_is_parsed():
    text = _doc_text().replace('"layers": null', '"layers": "' + "x" * MAX_ANSWER_BYTES + '"')
    with pytest.raises(AgentError) as err:
        parse_agent_output(_result(text.encode()))
    assert "edgekit reads at most 64 MiB" in err.value.message


def test_strict_loads_keeps_what_json_allows():
    assert strict_loads('{"a": [1, 2.5, -3e300, "1e400"], "b": {"c": null}}') == {"a": [1, 2.5, -3e300, "1e400"], "b": {"c": None}}
    assert strict_loads("[" * 64 + "]" * 64) is not None
    with pytest.raises(ValueError, match="nested more than 64"):
        strict_loads("[" * 65 + "]" * 65)


def test_an_endless_answer_line_is_cut_off_and_its_process_ended(tmp_path):
    """The agent server's reply is read as a line: one that never ends stops at the cap."""
    transport = LocalTransport(tmp_path)
    flood = "import sys\nsys.stdin.readline()\nblock = b'x' * (1 << 20)\nwhile True:\n    sys.stdout.buffer.write(block)\n"
    conv = transport.converse([sys.executable, "-c", flood])
    assert conv is not None
    try:
        with pytest.raises(TransportError) as err:
            conv.ask(b"go", timeout=120)
        assert "the device's answer passed 64 MiB without ending" in err.value.message
        assert conv.returncode is not None  # the flooding process was ended, not left running
    finally:
        conv.close()
        transport.close()


def test_a_server_reply_with_1e400_is_no_document(tmp_path):
    transport = LocalTransport(tmp_path)
    reply = json.dumps({"status": 0, "document": bench_doc()}).replace('"load_ns": 123400000', '"load_ns": 1e400')
    echo = f"import sys\nsys.stdin.readline()\nsys.stdout.write({reply!r} + '\\n')\nsys.stdout.flush()\nsys.stdin.readline()\n"
    conv = transport.converse([sys.executable, "-c", echo])
    assert conv is not None
    try:
        result = ask_server(transport, conv, ["bench"], timeout=60)
        assert result is not None and result.returncode == 1 and b"not a reply" in result.stderr
        with pytest.raises(AgentError):
            parse_agent_output(result)
    finally:
        conv.close()
        transport.close()
