"""TOML config files: defaults < file < flags, unknown keys and wrong types named, round trip."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from edge_node.errors import ConfigError
from edge_node.tomlconf import build, merge, read_toml, to_toml


@dataclass(frozen=True)
class _Conf:
    name: str = "a"
    count: int = 1
    rate: float = 0.5
    flag: bool = False
    where: Path | None = None
    peers: tuple[str, ...] = ()
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ConfigError(f"count={self.count} must be >= 0")


def test_file_then_flags(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('name = "from-file"\ncount = 3\nrate = 2\npeers = ["x@h:1", "y@h:2"]\nwhere = "~/data"\n')
    conf = build(_Conf, merge(read_toml(path), {"count": 7}), str(path))
    assert conf == _Conf("from-file", 7, 2.0, False, Path("~/data").expanduser(), ("x@h:1", "y@h:2"), None)


def test_unknown_key_and_wrong_type_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'cont' in f.toml; known keys: name, count"):
        build(_Conf, {"cont": 1}, "f.toml")
    with pytest.raises(ConfigError, match=r"count = '3' in f.toml must be int"):
        build(_Conf, {"count": "3"}, "f.toml")
    with pytest.raises(ConfigError, match=r"flag = 1 in f.toml must be bool"):
        build(_Conf, {"flag": 1}, "f.toml")
    with pytest.raises(ConfigError, match=r"count=-1 must be >= 0"):
        build(_Conf, {"count": -1}, "f.toml")


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        read_toml(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        read_toml(bad)


def test_print_reads_back(tmp_path):
    conf = _Conf("n", 2, 0.25, True, Path("/x"), ("a", "b"), None)
    text = to_toml(conf, header="# effective config")
    assert text.startswith("# effective config\n")
    assert "\n# limit = (unset)\n" in text  # every key is shown; TOML has no null, so an unset one as a comment
    path = tmp_path / "out.toml"
    path.write_text(text)
    assert build(_Conf, read_toml(path), str(path)) == conf
