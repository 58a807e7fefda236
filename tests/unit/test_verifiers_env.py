"""The `verifiers` environment: a verifiers taskset and env played by name, and a clear error without the
package. Tests that play episodes run only where verifiers is installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from decentralized_verl.environments.base import EpisodeRecord
from decentralized_verl.environments.registry import make_environment, preflight
from decentralized_verl.environments.settings import EpisodeSettings
from decentralized_verl.errors import ManifestError
from decentralized_verl.spec.manifest import load_job, parse_job
from tests.support.job_manifests import environment_job
from tests.support.paths import ROOT

GUESSING = "decentralized_verl.environments.verifiers_guessing:GuessingTaskset"
OPTIONS = {"taskset": GUESSING, "tasksetConfig": {"tasks": 80}}


def test_without_the_package_the_error_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    from decentralized_verl.environments.rollout import EpisodeRunner
    from decentralized_verl.environments.verifiers_env import VerifiersUnavailable

    monkeypatch.setitem(sys.modules, "verifiers", None)  # what an interpreter without it sees
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    with pytest.raises(
        VerifiersUnavailable, match=r"data\.environment\.name: 'verifiers' needs the verifiers"
    ):
        make_environment("verifiers", OPTIONS)
    with pytest.raises(VerifiersUnavailable, match=r"pip install 'decentralized-verl\[verifiers\]'"):
        EpisodeRunner(EpisodeSettings("verifiers", OPTIONS), tokenizer=None)  # fails before any episode
    # The spec is checked without the package: the operator validates manifests it cannot play.
    spec = parse_job(environment_job({"name": "verifiers", "options": OPTIONS})).spec
    assert spec.data.environment.name == "verifiers"


def test_the_spec_names_bad_verifiers_options() -> None:
    with pytest.raises(ManifestError) as info:
        parse_job(environment_job({"name": "verifiers"}))
    assert [p.path for p in info.value.problems] == ["spec.data.environment.options.taskset"]
    with pytest.raises(ManifestError) as info:
        parse_job(environment_job({"name": "verifiers", "options": {"taskset": "x", "tasksets": {}}}))
    assert [p.path for p in info.value.problems] == ["spec.data.environment.options.tasksets"]


def test_the_example_manifest_is_valid_and_its_data_names_tasks() -> None:
    spec = load_job(ROOT / "examples" / "verifiers-guessing.yaml").spec
    assert spec.data.environment.name == "verifiers"
    assert spec.data.environment.options["taskset"] == GUESSING


# ---------------------------------------------------------------------- with the package installed
@pytest.fixture(scope="module")
def vf():
    return pytest.importorskip("verifiers.v1")


def answer_of(name: str) -> int:
    from decentralized_verl.environments.verifiers_env import task_index
    from decentralized_verl.spec.catalogue.environments import VerifiersOptions

    return task_index(VerifiersOptions.model_validate(OPTIONS)).find(name).data.answer


def play(guesses: list[str], task: str = "guess-3"):
    env = make_environment("verifiers", OPTIONS)
    env.reset(EpisodeRecord("p", task, 0))
    return [env.step(guess) for guess in guesses]


def test_the_env_answers_each_turn_and_the_tasks_reward_scores_the_end(vf) -> None:
    answer = answer_of("guess-3")
    wrong = [str(n) for n in range(1, 5) if n != answer]
    first = play([str(answer)])
    assert first[0].done and first[0].reward == pytest.approx(1.0)
    steps = play([*wrong, str(answer)])
    assert [s.done for s in steps] == [False, False, False, True]
    for guess, step in zip(wrong, steps, strict=False):
        expected = "higher" if int(guess) < answer else "lower"
        assert step.observation == f"No, the number is {expected}." and step.role == "user"
    assert steps[-1].reward == pytest.approx(0.4)  # the fourth guess: 1 - 3 * 0.2


def test_a_record_must_name_a_task_and_the_options_must_fit(vf) -> None:
    env = make_environment("verifiers", OPTIONS)
    with pytest.raises(ValueError, match="names no task"):
        env.reset(EpisodeRecord("p", "guess-999", 0))
    with pytest.raises(ValueError, match=r"options\.tasksetConfig\.maxNumber: Extra inputs"):
        preflight("verifiers", {"taskset": GUESSING, "tasksetConfig": {"maxNumber": 4}})
    with pytest.raises(ValueError, match=r"options\.taskset: .* has no class Nope"):
        preflight("verifiers", {"taskset": "decentralized_verl.environments.verifiers_guessing:Nope"})


def test_the_shipped_data_is_what_the_taskset_exports(vf, tmp_path: Path) -> None:
    from decentralized_verl.environments.verifiers_env import main

    out = tmp_path / "tasks.jsonl"
    assert main([GUESSING, str(out), "--config", '{"tasks": 80}']) == 0
    shipped = ROOT / "examples" / "data" / "verifiers_guessing"
    assert out.read_text() == (shipped / "train.jsonl").read_text() + (shipped / "eval.jsonl").read_text()


def test_an_env_that_raises_is_a_tool_error_and_a_taskset_without_env_is_single_turn(
    vf, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_vf_tasks.py").write_text(
        "import verifiers.v1 as vf\n"
        "class Echo(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):\n"
        "    @vf.reward\n"
        "    async def said_yes(self, trace) -> float:\n"
        "        return float(trace.last_reply == 'yes')\n"
        "class Tasks(vf.Taskset[Echo, vf.TasksetConfig]):\n"
        "    def load(self):\n"
        "        yield Echo(vf.TaskData(name='a', prompt='Say yes.'), self.config.task)\n"
        "class Broken(vf.Env[vf.EnvConfig]):\n"
        "    async def run(self, task, agents):\n"
        "        async with agents.player.interaction(task) as exchange:\n"
        "            await exchange.turn()\n"
        "            raise RuntimeError('the board is on fire')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    single = {"taskset": "my_vf_tasks:Tasks"}
    for reply, reward in (("yes", 1.0), ("no", 0.0)):
        env = make_environment("verifiers", single)
        env.reset(EpisodeRecord("p", "a", 0))
        step = env.step(reply)
        assert step.done and step.reward == reward
    env = make_environment("verifiers", {**single, "env": "my_vf_tasks:Broken"})
    env.reset(EpisodeRecord("p", "a", 0))
    with pytest.raises(RuntimeError, match="the board is on fire"):
        env.step("yes")


def test_rollout_and_reward_workers_play_verifiers_episodes(vf) -> None:
    """Episodes through the real rollout worker (a tiny model), scored again by the reward worker's replay."""
    import torch

    from decentralized_verl.backends.factory import make_backend
    from decentralized_verl.core.samples import Prompt
    from decentralized_verl.core.sampling import SamplingParams
    from decentralized_verl.data.prompts import render_prompt
    from decentralized_verl.environments.replay import ENVIRONMENT_REWARD
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.serving.rollout import RolloutWorker
    from decentralized_verl.serving.scoring import RewardWorker
    from decentralized_verl.spec import ModelSpec, TinyModelSpec
    from decentralized_verl.spec.catalogue.backends import HF

    torch.set_num_threads(1)
    tiny = TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=256)
    model, tok = load_model_and_tokenizer(ModelSpec(tiny=tiny))
    settings = EpisodeSettings("verifiers", OPTIONS, max_turns=3)
    prompts = []
    for i in range(3):
        text = render_prompt("Guess the number.", tok, system_prompt="Guess 1-4.")
        ids = tuple(tok(text, add_special_tokens=False)["input_ids"])
        prompts.append(Prompt(f"p{i}", i, ids, text, f"guess-{i}", environment=True))
    worker = RolloutWorker(make_backend(HF, model, tok, max_batch_size=8), "w", environment=settings)
    items = [(p, k) for p in prompts for k in range(4)]
    samples = list(worker.generate_sync(items, SamplingParams(max_new_tokens=1, temperature=1.0, seed=3), 0))
    assert len(samples) == len(items)
    for s in samples:
        assert 1 <= len(s.turns) <= 3 and s.loss_mask is not None
        assert sum(s.loss_mask) == len(s.turns)  # one model token a turn; the env's answers are masked
        if len(s.turns) > 1 and s.end_reason != "finished":
            assert s.end_reason == "max_turns"
    scores = RewardWorker(environment=settings).score(samples, ENVIRONMENT_REWARD)
    assert [score for score, _ in scores] == pytest.approx([s.extra["episode_reward"] for s in samples])
