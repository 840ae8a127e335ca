"""Each setting is declared once; options, config-file keys, environment lookups and validation of every
command (and of ``tinkertrace.init``) come from that declaration."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tinkertrace.builder.options import BuildSettings
from tinkertrace.cli.main import app
from tinkertrace.cli.options import cli_fields
from tinkertrace.collector.settings import CollectorSettings
from tinkertrace.engine_server.settings import EngineSettings
from tinkertrace.evaluation.settings import EvalSettings
from tinkertrace.online.settings import DemoSettings, FollowSettings
from tinkertrace.sdk.config import resolve
from tinkertrace.serving.settings import ProxySettings, ServeSettings
from tinkertrace.settings import ConfigError, load
from tinkertrace.training.config import TrainSettings
from tinkertrace.ui.settings import UiSettings

COMMANDS = [
    (["train"], TrainSettings),
    (["train"], FollowSettings),
    (["demo"], DemoSettings),
    (["eval"], EvalSettings),
    (["build-trajectories"], BuildSettings),
    (["collector"], CollectorSettings),
    (["serve"], ServeSettings),
    (["proxy"], ProxySettings),
    (["engine"], EngineSettings),
    (["ui"], UiSettings),
]


def flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


@pytest.mark.parametrize(
    ("command", "settings"), COMMANDS, ids=lambda v: v.__name__ if isinstance(v, type) else " ".join(v)
)
def test_every_declared_option_is_in_its_commands_help(command: list[str], settings: type) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for field in cli_fields(settings):
        if field.metadata["argument"]:
            assert field.name.upper() in result.output
            continue
        flag = (field.metadata["flags"] or (f"--{field.name.replace('_', '-')}",))[0].split("/")[0]
        assert flag in result.output, (command, field.name)
        if field.metadata["envvar"]:
            assert field.metadata["envvar"] in result.output
    assert "--config" in result.output


def test_precedence_defaults_file_environment_given(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "collector:\n  out: from-file\n  max_queue_mb: 100\n  token: file-token\n  roll-seconds: 5\n"
    )
    loaded = load(
        CollectorSettings,
        config,
        {"roll_seconds": 2},
        section="collector",
        environ={"TINKERTRACE_COLLECTOR_TOKEN": "env"},
    )
    assert (
        loaded.out == Path("from-file") and loaded.max_queue_bytes == 100 * 1024 * 1024
    )  # file over default
    assert loaded.token == "env"  # environment over file
    assert loaded.roll_seconds == 2.0  # given over file
    assert loaded.http_port == CollectorSettings.http_port  # default


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("out: x\nmax_queue: 3\n", "unknown config file setting 'max_queue'"),
        ("out: x\nhttp_port: lots\n", "http_port: 'lots' is not a valid int"),
        ("out: x\nzstd_level: 99\n", "zstd_level must be in"),
        ("out: x\ngrpc_workers: 2\n", "unknown config file setting 'grpc_workers'"),  # internal: code only
        ("host: x\n", "missing required setting(s): out"),
    ],
)
def test_a_bad_file_value_is_named(tmp_path: Path, text: str, problem: str) -> None:
    config = tmp_path / "c.toml" if "=" in text else tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load(CollectorSettings, config)
    assert problem in str(caught.value)


def test_a_command_reads_its_config_file_and_names_a_bad_value_by_its_option(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text('[serve]\ntool_parser = "mistral"\n')
    result = CliRunner().invoke(app, ["serve", "--config", str(config)])
    assert result.exit_code == 2
    assert "--tool-parser: 'mistral' is not one of auto, hermes, qwen, none" in flat(result.output)
    missing = CliRunner().invoke(app, ["collector"])
    assert missing.exit_code == 2 and "missing required option(s): --out" in flat(missing.output)


def test_init_reads_the_same_declarations_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKERTRACE_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("TINKERTRACE_CAPTURE_CONTENT", "off")
    monkeypatch.setenv("TINKERTRACE_PROTOCOL", "grpc")
    config = resolve(protocol="http")  # an argument wins over the environment
    assert config.endpoint == "http://127.0.0.1:9" and config.protocol == "http"
    assert config.capture_content is False and config.spans_dir is None and config.spool_dir is not None
    monkeypatch.setenv("TINKERTRACE_CAPTURE_CONTENT", "maybe")
    with pytest.raises(ValueError, match="capture_content: 'maybe' is not a valid bool"):
        resolve()
    with pytest.raises(TypeError, match=r"unknown tinkertrace\.init"):
        resolve(endpint="x")


def test_no_default_is_written_twice() -> None:
    """The collector's ingest defaults are the command's, read from the one declaration."""
    from tinkertrace.collector.ingest import IngestConfig

    defaults = {f.name: f.default for f in dataclasses.fields(IngestConfig)}
    assert defaults["max_queue_bytes"] == CollectorSettings(out=Path("x")).max_queue_bytes
    assert defaults["max_file_bytes"] == CollectorSettings(out=Path("x")).max_file_bytes


SERVERS = [ServeSettings, ProxySettings, EngineSettings, UiSettings, CollectorSettings]


@pytest.mark.parametrize("settings", SERVERS)
def test_every_server_binds_loopback_by_default_and_checks_its_ports(settings: type, tmp_path: Path) -> None:
    required = {"upstream": "http://127.0.0.1:1/v1", "out": tmp_path}
    fields = {f.name for f in dataclasses.fields(settings)}
    given = {key: value for key, value in required.items() if key in fields}
    assert load(settings, given=given).host == "127.0.0.1"
    ports = [name for name in fields if name == "port" or name.endswith("_port")]
    assert ports, settings
    with pytest.raises(ConfigError, match=r"ports must be in 0\.\.65535"):
        load(settings, given={**given, ports[0]: 70000})
