"""Multi-turn episodes on the rollout side with a real tiny model: one sample per episode whose log-probs the
learner recomputes exactly on the model's tokens, whose loss mask covers exactly those tokens, which a
re-dispatch reproduces, which the trusted side scores by replaying the environment, and which a whole
training loop (colocated rollout, learner, reward) runs on.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
import torch

from decentralized_verl.core.forward import response_logprobs
from decentralized_verl.core.samples import Prompt, collate
from decentralized_verl.environments.replay import ENVIRONMENT_REWARD, replay
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.serving.scoring import RewardWorker
from decentralized_verl.spec.manifest import parse_job
from decentralized_verl.training.advantage_step import AlgorithmSettings, attach_advantages
from decentralized_verl.training.trainer import PolicyTrainer
from tests.support.multiturn import GAME, SAMPLING, TINY, play, prompts

torch.set_num_threads(1)


def runs(mask):
    out = []
    for i, v in enumerate(mask):
        if out and out[-1][0] == v:
            out[-1][2] = i + 1
        else:
            out.append([v, i, i + 1])
    return out


def test_episode_logprobs_equal_the_learners_on_exactly_the_model_tokens(policy) -> None:
    model, tok = policy
    items = [(p, k) for p in prompts(tok) for k in range(3)]
    samples = list(play(model, tok, items).values())
    assert sorted(s.key for s in samples) == sorted((p.prompt_id, k) for p, k in items)
    assert any(len(s.turns) > 1 for s in samples)  # the tiny model rarely guesses 5 at once
    for s in samples:
        assert len(s.loss_mask) == len(s.response_ids) == len(s.logprobs)
        model_runs = [r for r in runs(s.loss_mask) if r[0] == 1]
        assert len(model_runs) == len(s.turns) and s.extra["turns"] == len(s.turns)
        # Each run of mask-1 tokens is one turn exactly as generated; everything else is the environment's.
        for (_, start, end), turn in zip(model_runs, s.turns, strict=True):
            assert tok.decode(list(s.response_ids[start:end]), skip_special_tokens=True) == turn
        assert all(lp == 0.0 for lp, m in zip(s.logprobs, s.loss_mask, strict=True) if not m)
        env_text = tok.decode([t for t, m in zip(s.response_ids, s.loss_mask, strict=True) if not m])
        if len(s.turns) > 1:
            assert "<|user|>" in env_text and "<|assistant|>" in env_text
    batch = collate(samples, tok.pad_token_id)
    trained = batch.trained_mask()
    assert int(trained.sum()) == sum(sum(s.loss_mask) for s in samples)
    for i, s in enumerate(samples):
        assert trained[i, : len(s.response_ids)].tolist() == [float(m) for m in s.loss_mask]
    with torch.no_grad():
        learner = response_logprobs(model, batch, 1.0)[0]
    gap = ((learner - batch.old_logprobs).abs() * trained).max()
    assert float(gap) < 1e-4
    env_positions = (batch.response_mask - trained).bool()
    assert float(learner[env_positions].abs().min()) > 0  # the learner does see those tokens' log-probs


def test_a_redispatched_episode_plays_out_the_same(policy) -> None:
    model, tok = policy
    ps = prompts(tok, 3)
    whole = play(model, tok, [(p, k) for p in ps for k in range(2)])
    again = play(model, tok, [(ps[1], 1), (ps[2], 0)], batch=1)  # another worker, other batch-mates
    for key, sample in again.items():
        assert sample.response_ids == whole[key].response_ids
        assert sample.loss_mask == whole[key].loss_mask and sample.turns == whole[key].turns
        assert sample.logprobs == pytest.approx(whole[key].logprobs, abs=1e-4)


def test_the_trusted_side_scores_episodes_by_replaying_them(policy) -> None:
    model, tok = policy
    items = [(p, k) for p in prompts(tok) for k in range(2)]
    samples = list(play(model, tok, items).values())
    scores = RewardWorker(environment=GAME).score(samples, ENVIRONMENT_REWARD)
    assert [score for score, _ in scores] == [s.extra["episode_reward"] for s in samples]
    # A forged transcript: a win claimed, then more turns after the game ended.
    assert replay(GAME, ["5"], prompt_id="p0", ground_truth="5").score == 1.0
    forged = replay(GAME, ["5", "5"], prompt_id="p0", ground_truth="5")
    assert forged.score == 0.0 and "after the episode ended" in forged.reason
    too_long = replay(GAME, ["1", "2", "3", "5"], prompt_id="p0", ground_truth="5")
    assert too_long.score == 0.0 and "maxTurns" in too_long.reason
    unconfigured = RewardWorker().score(samples[:1], ENVIRONMENT_REWARD)
    assert unconfigured[0][0] == 0.0 and "data.environment" in unconfigured[0][1]


JOB = {
    "apiVersion": "dverl.io/v1alpha1",
    "kind": "RLHFJob",
    "metadata": {"name": "mt"},
    "spec": {
        "model": {
            "tiny": {
                "hiddenSize": 32,
                "numLayers": 1,
                "numHeads": 2,
                "intermediateSize": 64,
                "maxPositions": 256,
            }
        },
        "algorithm": {"name": "grpo", "samplesPerPrompt": 4},
        "data": {
            "train": "train.jsonl",
            "maxNewTokens": 6,
            "environment": {"name": "guessing_game", "maxTurns": 3, "options": {"maxNumber": 9}},
        },
        "roles": {"rollout": {"replicas": 0}, "learner": {"replicas": 1}},
        "training": {"steps": 2, "batchSize": 2, "minibatchSize": 2, "learningRate": 0.01},
    },
}


def test_the_update_ignores_environment_tokens(policy) -> None:
    model, tok = policy
    spec = parse_job(JOB).spec
    items = [(p, k) for p in prompts(tok) for k in range(4)]
    samples = [s.with_(score=float(len(s.turns) == 1)) for s in play(model, tok, items).values()]

    def gradient(scramble: bool):
        batch = collate(samples, tok.pad_token_id)
        attach_advantages(batch, AlgorithmSettings.from_spec(spec))
        env = torch.zeros_like(batch.response_mask, dtype=torch.bool)
        for i, s in enumerate(samples):
            env[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask) == 0
        assert bool(env.any())
        assert float(batch.advantages[env].abs().sum()) == 0.0
        if scramble:  # whatever sits at the environment's positions must not matter
            batch.old_logprobs[env] = -3.0
            batch.advantages[env] = 5.0
        learner = copy.deepcopy(model)
        trainer = PolicyTrainer(learner, spec)
        trainer.update(batch)
        return torch.cat([p.detach().flatten() for p in learner.parameters()])

    plain, scrambled = gradient(False), gradient(True)
    assert not torch.equal(plain, torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.allclose(plain, scrambled, atol=1e-7)


def test_a_training_loop_runs_on_episodes_and_records_their_metrics(tmp_path: Path, policy) -> None:
    from decentralized_verl.orchestration.assemble import build_loop
    from decentralized_verl.orchestration.wiring import connect_roles

    train = tmp_path / "train.jsonl"
    train.write_text(
        "".join(json.dumps({"prompt": f"Guess ({i})", "answer": str(i % 9 + 1)}) + "\n" for i in range(4))
    )
    doc = copy.deepcopy(JOB)
    doc["spec"]["data"]["train"] = str(train)
    spec = parse_job(doc).spec
    model, tok = load_model_and_tokenizer(spec.model)
    trainer = PolicyTrainer(model, spec)
    history: list[dict] = []

    async def run() -> dict:
        roles = await connect_roles(
            spec,
            "mt",
            model,
            tok,
            temperature=1.0,
            publisher=None,
            addresses=lambda r: [],
            pools=lambda r: [],
        )
        loop = await build_loop(
            spec, trainer, tok, roles, job="mt", output=tmp_path / "out", on_step=history.append
        )
        try:
            return await loop.run()
        finally:
            await loop.close()

    summary = asyncio.run(run())
    assert summary["steps"] == 2 and len(history) == 2
    for record in history:
        assert record["samples"] == record["unique_samples"] == 8
        assert 1 <= record["turns_mean"] <= 3 and 0 < record["model_token_frac"] < 1
        assert record["reward_mean"] == pytest.approx(record["episode_reward_mean"])
        assert sum(v for k, v in record.items() if k.startswith("ended_")) == pytest.approx(1.0)
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert all("turns_mean" in row and "tool_errors_mean" in row for row in rows)


def test_the_wire_refuses_a_malformed_episode() -> None:
    from decentralized_verl.errors import WireError
    from decentralized_verl.proto import dverl_pb2 as pb
    from decentralized_verl.transport import messages as m

    def result(mask, turns):
        return pb.GenerateResult(
            request_id="r",
            prompt_id="p",
            sample_index=0,
            response_token_ids=[10, 11, 12, 13],
            logprobs=[-0.1] * 4,
            finish_reason=m.FINISH_REASONS["stop"],
            text="x",
            policy_version=0,
            worker_id="w",
            episode=pb.Episode(loss_mask=mask, turns=turns, reward=1.0),
        )

    ok = m.completion_from_proto(result([True, False, False, True], ["a", "b"]), limits=m.WireLimits())
    assert ok.episode.loss_mask == (1, 0, 0, 1) and ok.episode.turns == ("a", "b")
    for mask, turns, why in [
        ([True, False, True], ["a", "b"], "length"),
        ([True, False, False, True], ["a"], "one run"),
        ([False, True, True, True], ["a"], "start with"),
    ]:
        with pytest.raises(WireError, match=why):
            m.completion_from_proto(result(mask, turns), limits=m.WireLimits())


def test_only_an_episode_sends_its_reference_to_the_worker() -> None:
    from decentralized_verl.transport.rollout_stream import generate_request

    plain = Prompt("p", 0, (5, 6), "text", ground_truth="42")
    episode = Prompt("q", 1, (5, 6), "text", ground_truth="42", environment=True)
    request, _ = generate_request([(plain, 0), (episode, 0)], SAMPLING, 0)
    assert [(it.ground_truth, it.prompt_text) for it in request.items] == [("", ""), ("42", "text")]


def test_a_volunteers_episode_is_rebuilt_from_its_model_tokens(policy) -> None:
    from decentralized_verl.environments.rollout import EpisodeRunner
    from decentralized_verl.environments.verify import episode_problem
    from decentralized_verl.volunteers.verify import Verifier

    model, tok = policy
    ps = prompts(tok)
    samples = list(play(model, tok, [(p, k) for p in ps for k in range(3)]).values())
    runner = EpisodeRunner(GAME, tok, eos_token_ids=[tok.eos_token_id], context_tokens=TINY.max_positions)
    assert [episode_problem(runner, s, SAMPLING.max_new_tokens) for s in samples] == [None] * len(samples)

    long = next(s for s in samples if len(s.turns) > 1)
    env_at = long.loss_mask.index(0) + 3
    forged_feedback = list(long.response_ids)
    forged_feedback[env_at] = tok.convert_tokens_to_ids("5")  # a hint slipped into the context
    claims_a_win = long.with_(turns=("5", *long.turns[1:]))  # a turn text the tokens do not say
    one_turn_more = long.with_(
        response_ids=(*long.response_ids, 9), loss_mask=(*long.loss_mask, 1), logprobs=(*long.logprobs, -1.0)
    )
    problems = [
        episode_problem(runner, long.with_(response_ids=tuple(forged_feedback)), SAMPLING.max_new_tokens),
        episode_problem(runner, claims_a_win, SAMPLING.max_new_tokens),
        episode_problem(runner, one_turn_more, SAMPLING.max_new_tokens),
    ]
    assert "environment's tokens differ" in problems[0] and "response token" in problems[0]
    assert "turn 0's text" in problems[1]
    assert problems[2] is not None

    class Honest:  # the log-prob check passes; only the episode check can catch the forgery
        def logprobs(self, chosen, version):
            return [s.logprobs for s in chosen]

    verifier = Verifier(
        Honest(), fraction=1.0, episodes=lambda s: episode_problem(runner, s, SAMPLING.max_new_tokens)
    )
    assert verifier.check(samples, 0).ok
    caught = verifier.check([*samples, long.with_(response_ids=tuple(forged_feedback))], 0)
    assert not caught.ok and "episode" in str(caught.mismatches[0])


def test_an_episodes_deadline_allows_every_turn_and_step() -> None:
    from decentralized_verl.orchestration.dispatch import DEADLINE_FACTOR, DEADLINE_FLOOR_S, Dispatcher

    class Worker:
        worker_id = "w"

    dispatcher = Dispatcher([Worker()])
    dispatcher.stats["w"].observe(1000, 1.0)  # 1,000 tokens/s measured
    single = dispatcher.deadline("w", 10, SAMPLING)
    dispatcher.turns_per_item, dispatcher.step_timeout_s = 4, 30.0
    episode = dispatcher.deadline("w", 10, SAMPLING)
    assert single == pytest.approx(DEADLINE_FLOOR_S + DEADLINE_FACTOR * 10 * 6 / 1000)
    assert episode == pytest.approx(DEADLINE_FLOOR_S + DEADLINE_FACTOR * 4 * 10 * 6 / 1000 + 4 * 30.0)


def test_prompts_of_an_environment_job_carry_its_instructions_and_record(tmp_path: Path) -> None:
    from decentralized_verl.models.tokenizer import build_char_tokenizer
    from decentralized_verl.orchestration.prompts import prepare_prompts

    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"prompt": "Guess.", "answer": "3"}) + "\n")
    doc = copy.deepcopy(JOB)
    doc["spec"]["data"]["train"] = str(train)
    (prompt,) = prepare_prompts(parse_job(doc).spec, build_char_tokenizer(), str(train), None)
    assert prompt.environment and prompt.ground_truth == "3"
    assert "higher or lower" in prompt.text  # the game's own instructions, as no systemPrompt is set
    doc["spec"]["data"]["systemPrompt"] = "Play."
    (own,) = prepare_prompts(parse_job(doc).spec, build_char_tokenizer(), str(train), None)
    assert "Play." in own.text and "higher or lower" not in own.text


def _trusted(model, tok, runner, draw_tol):
    """A verifier over `model` as the coordinator builds one: episode rebuild, log-probs, seeded draws."""
    import threading

    from decentralized_verl.environments.verify import episode_problem
    from decentralized_verl.volunteers.verify import PublishedPolicy, Verifier

    class Policy(PublishedPolicy):  # the published version is `model` itself
        def __init__(self) -> None:
            self.model, self.version, self.temperature = model, 0, SAMPLING.temperature
            self.pad_token_id = tok.pad_token_id
            self._lock = threading.Lock()

    return Verifier(
        Policy(),
        fraction=1.0,
        episodes=lambda s: episode_problem(runner, s, SAMPLING.max_new_tokens),
        draw_tol=draw_tol,
    )


def test_every_model_turn_of_an_episode_replays_its_seeded_draws(policy, monkeypatch) -> None:
    """Honest episodes from the real hf backend replay turn by turn with each turn's seed; a volunteer that
    draws its second turn with a seed of its own (honest log-probs, honest environment) is caught there, and
    a forged observation is the episode check's finding, not the sampler's."""
    from decentralized_verl.environments.rollout import EpisodeRunner
    from decentralized_verl.serving import rollout
    from decentralized_verl.volunteers.sampling_check import DEFAULT_TOL

    model, tok = policy
    items = [(p, k) for p in prompts(tok) for k in range(3)]
    honest = play(model, tok, items)
    assert any(len(s.turns) > 2 for s in honest.values())
    runner = EpisodeRunner(GAME, tok, eos_token_ids=[tok.eos_token_id], context_tokens=TINY.max_positions)
    replaying = _trusted(model, tok, runner, DEFAULT_TOL["float32"])
    assert replaying.check(list(honest.values()), 0, SAMPLING).ok

    assigned = rollout.turn_seed
    monkeypatch.setattr(
        rollout, "turn_seed", lambda seed, *a: assigned(seed + 1 if a[-1] == 1 else seed, *a)
    )  # the volunteer's own seed for turn 1 only: turn 0 and turn 2 are drawn as assigned
    chosen = list(play(model, tok, items).values())
    monkeypatch.undo()
    assert _trusted(model, tok, runner, None).check(chosen, 0, SAMPLING).ok  # log-probs and episode pass
    caught = {m.key: m.what for m in replaying.check(chosen, 0, SAMPLING).mismatches}
    several = {s.key for s in chosen if len(s.turns) > 1}
    assert several and set(caught) == several
    for s in chosen:
        if s.key in caught:
            assert caught[s.key].startswith("model turn 1 (response tokens ")
            assert "not sampled from the policy with its seed" in caught[s.key]
        else:  # one turn only: the assigned draws, as the honest run made them
            assert s.response_ids == honest[s.key].response_ids

    long = next(s for s in honest.values() if len(s.turns) > 1)
    env_at = long.loss_mask.index(0) + 3
    forged = list(long.response_ids)
    forged[env_at] = tok.convert_tokens_to_ids("5")
    (mismatch,) = replaying.check([long.with_(response_ids=tuple(forged))], 0, SAMPLING).mismatches
    assert mismatch.what.startswith("episode: the environment's tokens differ")


def test_a_loss_mask_that_does_not_cover_the_response_is_refused_before_any_replay() -> None:
    from decentralized_verl.core.samples import Sample
    from decentralized_verl.volunteers.sampling_check import sample_problem

    episode = Prompt("p0", 0, (3, 4), "")
    bad = Sample(
        prompt=episode,
        sample_index=0,
        response_ids=(5, 6, 7),
        logprobs=(0.0,) * 3,
        finish_reason="stop",
        text="",
        policy_version=0,
        loss_mask=(1, 0),
    )
    logits = torch.zeros(3, 64)
    assert sample_problem(logits, bad, SAMPLING, 1e-3) == "2 loss-mask entries for 3 tokens"
