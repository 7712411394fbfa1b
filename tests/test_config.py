"""Settings: --no-auth only where the bind is loopback (judged by address after resolving a name,
never by the text of the host), and limits that must agree with each other."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from radixchat.core.config import DISK_AUTO, Settings, is_loopback, settings_error_line


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("192.168.1.4", False),
        ("10.0.0.1", False),
        ("127.0.0.1.nip.io", False),  # a name: it binds whatever it resolves to (nothing here)
    ],
)
def test_loopback_is_judged_by_address(host, loopback):
    assert is_loopback(host) is loopback


def fake_dns(monkeypatch, table: dict[str, list[str]]):
    real = socket.getaddrinfo

    def lookup(host, *a, **kw):
        if host in table:
            return [
                (socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, 0))
                for ip in table[host]
            ]
        return real(host, *a, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)


def test_a_name_that_looks_loopback_but_resolves_to_the_lan_is_refused(monkeypatch):
    fake_dns(
        monkeypatch,
        {
            "127.0.0.1.evil.example": ["192.168.1.20"],
            "both.example": ["127.0.0.1", "192.168.1.20"],
            "mine.example": ["127.0.0.1", "::1"],
        },
    )
    assert not is_loopback("127.0.0.1.evil.example")
    assert not is_loopback("both.example")  # one LAN address is enough to open it up
    assert is_loopback("mine.example")
    with pytest.raises(ValidationError, match="allow-open-lan"):
        Settings(no_auth=True, host="127.0.0.1.evil.example")
    assert Settings(no_auth=True, host="127.0.0.1.evil.example", allow_open_lan=True).no_auth
    assert Settings(no_auth=True, host="mine.example").no_auth


def test_the_prefill_batchs_default_follows_a_smaller_batch_but_a_given_one_is_checked():
    assert Settings(max_batch=8).max_prefill_batch == 8
    assert Settings().max_prefill_batch == 32 and Settings(max_batch=64).max_prefill_batch == 32
    assert Settings(max_batch=8, max_prefill_batch=3).max_prefill_batch == 3
    with pytest.raises(ValidationError, match="max_prefill_batch must not exceed max_batch"):
        Settings(max_batch=8, max_prefill_batch=16)


def test_speculation_is_refused_where_it_could_not_run():
    assert Settings(speculate=3).speculate == 3
    for off in ({"kv_slots": False}, {"step_tokens": 0}):
        with pytest.raises(ValidationError, match="speculate needs kv_slots on and step_tokens above 0"):
            Settings(speculate=2, **off)


SIZE_FIELDS = [name for name in Settings.model_fields if name.endswith("_bytes")]


@pytest.mark.parametrize(
    "text, size",
    [
        ("4096", 4096),
        ("2e9", 2_000_000_000),
        ("4E9", 4_000_000_000),
        ("2G", 2_000_000_000),
        ("2gb", 2_000_000_000),
        ("2 GB", 2_000_000_000),
        ("2GiB", 2 << 30),
        ("2gi", 2 << 30),
        ("1.5 GiB", 3 << 29),
        ("512M", 512_000_000),
        ("512MiB", 512 << 20),
        ("64K", 64_000),
        ("64kib", 64 << 10),
        (2e9, 2_000_000_000),  # what TOML reads 2e9 as
    ],
)
def test_every_byte_setting_takes_human_sizes(text, size):
    assert SIZE_FIELDS and {"cache_disk_bytes", "memory_bytes", "cache_bytes", "max_body_bytes"} <= set(SIZE_FIELDS)
    settings = Settings(**{name: text for name in SIZE_FIELDS})
    assert {name: getattr(settings, name) for name in SIZE_FIELDS} == {name: size for name in SIZE_FIELDS}


def test_sizes_come_from_the_environment_too(monkeypatch):
    monkeypatch.setenv("RADIXCHAT_CACHE_DISK_BYTES", "2e9")
    monkeypatch.setenv("RADIXCHAT_MEMORY_BYTES", "4GiB")
    settings = Settings()
    assert (settings.cache_disk_bytes, settings.memory_bytes) == (2_000_000_000, 4 << 30)


@pytest.mark.parametrize(
    "text, why",
    [
        ("-2G", "negative"),
        ("2X", "2GiB"),
        ("nonsense", "2GiB"),
        ("", "2GiB"),
        ("1.5", "whole number"),
        ("1.0001K", "whole number"),
        (2.5e3 + 0.5, "whole number"),
        (float("inf"), "2GiB"),
        (True, "2GiB"),
    ],
)
@pytest.mark.parametrize("name", SIZE_FIELDS)
def test_a_bad_size_is_refused_naming_its_setting(name, text, why):
    with pytest.raises(ValidationError) as err:
        Settings(**{name: text})
    line = settings_error_line(err.value)
    assert f"{name}: " in line and why in line, line


def test_the_disk_tiers_auto_still_stands_beside_sizes():
    assert Settings(cache_disk_bytes="auto").cache_disk_bytes == DISK_AUTO
    assert Settings(cache_disk_bytes="0").cache_disk_bytes == 0


def test_the_service_key_comes_from_a_file_and_never_from_two_places(tmp_path, capsys):
    """`--service-key` shows in `ps`; a file (or RADIXCHAT_SERVICE_KEY) keeps it out of sight."""
    key = tmp_path / "key"
    key.write_text("a-long-enough-service-key\n")
    assert Settings(service_key_file=key).service_key.get_secret_value() == "a-long-enough-service-key"
    with pytest.raises(ValidationError, match="not both"):
        Settings(service_key_file=key, service_key="another-long-service-key")
    short = tmp_path / "short"
    short.write_text("short\n")
    with pytest.raises(ValidationError, match="at least 16 characters"):
        Settings(service_key_file=short)
    with pytest.raises(ValidationError, match="cannot read"):
        Settings(service_key_file=tmp_path / "missing")

    from radixchat.webui.cli.main import _parser, load_settings

    load_settings(_parser().parse_args(["worker", "--service-key", "a-long-enough-service-key"]))
    assert "shows in every process list" in capsys.readouterr().err
    load_settings(_parser().parse_args(["worker", "--service-key-file", str(key)]))
    assert capsys.readouterr().err == ""


def test_the_settings_page_has_one_row_for_each_flag_and_its_variable():
    """docs/SETTINGS.md's table names every flag `serve` takes (the flags come from Settings'
    fields: webui.cli.main), each with its environment variable, and no flag that is not
    one: a setting added, renamed or removed fails here until the page says so."""
    import argparse
    import re

    from radixchat.webui.cli.main import _add_settings_flags

    parser = argparse.ArgumentParser()
    _add_settings_flags(parser)
    flags = {a.option_strings[0]: a.dest for a in parser._actions if a.option_strings and a.option_strings[0] != "-h"}
    page = (Path(__file__).resolve().parents[1] / "docs" / "SETTINGS.md").read_text()
    rows = dict(re.findall(r"^\| `(--[a-z0-9-]+)`[^|]*\| `(RADIXCHAT_[A-Z0-9_]+)`", page, re.M))
    assert set(rows) == set(flags), (set(flags) - set(rows), set(rows) - set(flags))
    for flag, dest in flags.items():
        assert rows[flag] == "RADIXCHAT_" + dest.upper(), flag
