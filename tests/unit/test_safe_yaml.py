"""The one YAML loader: each limit refuses its attack before paying for it, and names itself."""

from __future__ import annotations

import io

import pytest
import yaml

from decentralized_verl.orchestration.membership import WorkersFileError, rollout_members
from decentralized_verl.spec import safe_yaml
from decentralized_verl.spec.safe_yaml import DuplicateKey, YamlLimitExceeded, YamlLimits
from dverl_operator.reconcile.refusal import applied_spec
from tests.support.hostile_yaml import billion_laughs


def test_billion_laughs_is_refused_by_its_expanded_size() -> None:
    text = billion_laughs()
    assert len(text) < 1024
    with pytest.raises(YamlLimitExceeded, match="maxNodes") as caught:
        safe_yaml.load(text)
    assert caught.value.limit == "maxNodes"


def test_many_aliases_are_refused_even_when_small() -> None:
    text = "a: &a 1\nb: [" + ",".join(["*a"] * 300) + "]\n"
    with pytest.raises(YamlLimitExceeded, match="maxAliases"):
        safe_yaml.load(text)
    assert safe_yaml.load("a: &a 1\nb: [*a, *a]\n") == {"a": 1, "b": [1, 1]}


def test_an_alias_inside_itself_is_refused() -> None:
    with pytest.raises(YamlLimitExceeded, match="contains it"):
        safe_yaml.load("a: &a [1, *a]\n")


@pytest.mark.parametrize(
    "text", ["[" * 100_000 + "]" * 100_000, "a:\n" + "".join(" " * i + "- \n" for i in range(200))]
)
def test_deep_nesting_is_a_limit_not_a_recursion_error(text: str) -> None:
    with pytest.raises(YamlLimitExceeded, match="maxDepth"):
        safe_yaml.load(text)


def test_nesting_up_to_the_limit_loads() -> None:
    limits = YamlLimits(max_depth=10)
    assert safe_yaml.load("[" * 10 + "]" * 10, limits) == [[[[[[[[[[]]]]]]]]]]
    with pytest.raises(YamlLimitExceeded):
        safe_yaml.load("[" * 11 + "]" * 11, limits)


@pytest.mark.parametrize("number", ["9" * 200_000, "1." + "5" * 5000, "0x" + "f" * 500])
def test_long_numbers_are_refused_before_conversion(number: str) -> None:
    with pytest.raises(YamlLimitExceeded, match="maxNumberChars"):
        safe_yaml.load(f"steps: {number}\n")
    assert safe_yaml.load("steps: 1000000\nlr: 1.0e-6\n") == {"steps": 1_000_000, "lr": 1e-6}


def test_a_long_quoted_string_is_not_a_number() -> None:
    assert safe_yaml.load(f'x: "{"9" * 1000}"\n') == {"x": "9" * 1000}


def test_size_is_checked_before_parsing_and_reading_stops_at_the_limit(tmp_path) -> None:
    limits = YamlLimits(max_bytes=1000)
    with pytest.raises(YamlLimitExceeded, match="maxBytes"):
        safe_yaml.load("a: " + "x" * 2000, limits)
    stream = io.BytesIO(b"a: " + b"x" * 10_000_000)
    with pytest.raises(YamlLimitExceeded, match="maxBytes"):
        safe_yaml.read_limited_stream(stream, limits)
    assert stream.tell() == 1001
    path = tmp_path / "small.yaml"
    path.write_text("a: 1\n")
    assert safe_yaml.read_limited(path, limits) == "a: 1\n"


def test_duplicate_keys_and_several_documents_are_refused() -> None:
    with pytest.raises(DuplicateKey, match="'a' at line 2"):
        safe_yaml.load("a: 1\na: 2\n")
    with pytest.raises(yaml.YAMLError, match="exactly one"):
        safe_yaml.load("a: 1\n---\nb: 2\n")
    assert safe_yaml.load_documents("a: 1\n---\nb: 2\n") == [{"a": 1}, {"b": 2}]


def test_arbitrary_python_tags_stay_refused() -> None:
    with pytest.raises(yaml.YAMLError):
        safe_yaml.load("!!python/object/apply:os.system ['true']\n")


def test_json_or_yaml_holds_the_same_limits() -> None:
    assert safe_yaml.load_json_or_yaml('{"a": [1, 2.5]}') == {"a": [1, 2.5]}
    with pytest.raises(YamlLimitExceeded, match="maxDepth"):
        safe_yaml.load_json_or_yaml("[" * 50_000 + "]" * 50_000)
    with pytest.raises(YamlLimitExceeded, match="maxDepth"):
        safe_yaml.load_json_or_yaml("[" * 100 + "]" * 100)
    with pytest.raises(YamlLimitExceeded, match="maxNumberChars"):
        safe_yaml.load_json_or_yaml('{"a": ' + "1" * 200_000 + "}")
    with pytest.raises(YamlLimitExceeded, match="maxNodes"):
        safe_yaml.load_json_or_yaml(billion_laughs())


def test_the_limit_error_is_a_dverl_error_the_cli_prints() -> None:
    from decentralized_verl.errors import DverlError

    assert issubclass(YamlLimitExceeded, DverlError) and issubclass(YamlLimitExceeded, yaml.YAMLError)


def test_the_operator_and_the_workers_file_use_the_limited_loader() -> None:
    assert applied_spec({"data": {"job.yaml": billion_laughs()}}) is None
    with pytest.raises(WorkersFileError, match="maxNodes"):
        rollout_members(billion_laughs())
