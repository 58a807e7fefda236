"""The HF generation backend against independent references.

References: a single full forward pass per sample (no cache, no padding) for log-probs, transformers'
own ``model.generate`` for greedy decoding, hand-worked token prefixes for stop strings, and a second
model built directly from the weights that ``load_weights`` received.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from decentralized_verl.backends.base import (
    GenerationBackend,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
)
from decentralized_verl.backends.factory import ENGINES, make_backend
from decentralized_verl.backends.hf import HFBackend, filter_logits, find_stop, sample_tokens
from decentralized_verl.errors import WireError
from decentralized_verl.spec.catalogue.backends import HF, VLLM, backend_kind

torch.set_num_threads(1)

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 +=.,\n")
MULTI = ["ab", "cd", "ef", "gh", "ij", "kl", "mn", "op", "qr", "st", "uv", "wx", "yz", "12", "34"]
VOCAB = {token: i for i, token in enumerate(SPECIALS + CHARS + MULTI)}
PAD, EOS = VOCAB["<pad>"], VOCAB["<eos>"]


@pytest.fixture(scope="module")
def tokenizer():
    """A character-level tokenizer built offline; the multi-character tokens are only ever generated."""
    core = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def tiny_llama(seed: int, tied: bool = False, attn: str = "sdpa"):
    config = transformers.LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=96,
        initializer_range=0.3,  # peaky distributions: greedy argmaxes are far from ties
        tie_word_embeddings=tied,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=None,
    )
    config._attn_implementation = attn
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).float().eval()
    with torch.no_grad():  # EOS's logit is 0, so it seldom wins and responses run long unless a test says
        model.lm_head.weight[EOS] = 0.0
    return model


def tiny_gpt2(seed: int):
    """Learned absolute positions: wrong position ids for left-padded rows change its log-probs
    (Llama's rotary embeddings are blind to a constant shift, so they cannot catch that)."""
    config = transformers.GPT2Config(
        vocab_size=len(VOCAB),
        n_positions=96,
        n_embd=32,
        n_layer=2,
        n_head=4,
        initializer_range=0.3,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=EOS,
    )
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).float().eval()
    with torch.no_grad():
        model.transformer.wpe.weight.mul_(10)  # make position information matter a lot
    return model


def encode(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def reference_logprobs(model, out: GenerationOutput, temperature: float) -> list[float]:
    """Log-probs of the response recomputed by one plain forward pass over prompt + response."""
    ids = torch.tensor([list(out.prompt_token_ids) + list(out.response_token_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
    p = len(out.prompt_token_ids)
    scaled = logits[p - 1 : -1] / (temperature if temperature > 0 else 1.0)
    lp = torch.log_softmax(scaled, dim=-1)
    return lp.gather(-1, torch.tensor(out.response_token_ids)[:, None]).flatten().tolist()


def by_key(outputs) -> dict[tuple[str, int], GenerationOutput]:
    return {(o.prompt_id, o.sample_index): o for o in outputs}


PROMPTS = {"short": "1+2=", "mid": "what is 12+30=", "long": "abc def ghi jkl mnop qr st="}


@pytest.mark.parametrize("arch", ["llama-sdpa", "llama-eager", "gpt2"])
@pytest.mark.parametrize("max_batch_size", [8, 2])
def test_logprobs_match_a_plain_forward_pass(tokenizer, arch, max_batch_size):
    model = tiny_gpt2(0) if arch == "gpt2" else tiny_llama(0, attn=arch.split("-")[1])
    backend = HFBackend(model, tokenizer, max_batch_size=max_batch_size, version=7)
    params = {
        "short": SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.9, top_k=10, n=2, seed=1),
        "mid": SamplingParams(max_new_tokens=5, temperature=1.3, seed=2),
        "long": SamplingParams(max_new_tokens=9, temperature=0.0),
    }
    requests = [GenerationRequest(k, encode(tokenizer, PROMPTS[k]), params[k]) for k in PROMPTS]
    outputs = list(backend.generate(requests))
    assert sorted((o.prompt_id, o.sample_index) for o in outputs) == [
        ("long", 0),
        ("mid", 0),
        ("short", 0),
        ("short", 1),
    ]
    for out in outputs:
        p = params[out.prompt_id]
        assert out.policy_version == 7
        assert out.prompt_token_ids == encode(tokenizer, PROMPTS[out.prompt_id])
        assert 1 <= len(out.response_token_ids) <= p.max_new_tokens
        assert len(out.logprobs) == len(out.response_token_ids)
        assert all(lp <= 0 and math.isfinite(lp) for lp in out.logprobs)
        expected = reference_logprobs(model, out, p.temperature)
        assert max(abs(a - b) for a, b in zip(out.logprobs, expected, strict=True)) < 1e-4
        if out.finish_reason == "length":
            assert len(out.response_token_ids) == p.max_new_tokens
        assert out.text == tokenizer.decode(list(out.response_token_ids), skip_special_tokens=True)


def test_greedy_equals_transformers_generate(tokenizer):
    model = tiny_llama(3)
    backend = HFBackend(model, tokenizer, max_batch_size=4)
    prompts = ["1+2=", "abc", "what is 12+30=", "z", "hello world, again="]
    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    outputs = by_key(
        backend.generate(
            [GenerationRequest(str(i), encode(tokenizer, p), params) for i, p in enumerate(prompts)]
        )
    )
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([encode(tokenizer, prompt)])
        with torch.no_grad():
            reference = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=10,
                pad_token_id=PAD,
                eos_token_id=EOS,
            )[0, ids.shape[1] :].tolist()
        assert list(outputs[(str(i), 0)].response_token_ids) == reference, prompt


def sample_once(backend, tokenizer, prompt: str, **kw) -> GenerationOutput:
    (out,) = backend.generate([GenerationRequest("p", encode(tokenizer, prompt), SamplingParams(**kw))])
    return out


def test_stop_string_aligned_with_a_token_end(tokenizer):
    backend = HFBackend(tiny_llama(0), tokenizer, eos_token_ids=())  # only stop strings end a response
    free = sample_once(backend, tokenizer, "1+2=", max_new_tokens=40, temperature=1.0, seed=5)
    assert free.finish_reason == "length"
    pieces = [tokenizer.decode([t]) for t in free.response_token_ids]
    for j in range(3, len(pieces)):
        stop = pieces[j - 1] + pieces[j]
        prefix_text = "".join(pieces[: j + 1])
        if "".join(pieces).find(stop) == len(prefix_text) - len(stop):
            break
    else:
        pytest.fail("no usable stop string in the free sample")
    out = sample_once(
        backend, tokenizer, "1+2=", max_new_tokens=40, temperature=1.0, seed=5, stop=("zzzz", stop)
    )
    assert out.finish_reason == "stop"
    assert out.response_token_ids == free.response_token_ids[: j + 1]
    assert out.logprobs == free.logprobs[: j + 1]
    assert out.text == prefix_text and out.text.endswith(stop)


def test_stop_string_ending_inside_a_token_trims_text_but_keeps_the_token(tokenizer):
    backend = HFBackend(tiny_llama(0), tokenizer, eos_token_ids=())
    multi_ids = {VOCAB[m] for m in MULTI}
    for seed in range(30):
        free = sample_once(backend, tokenizer, "ab", max_new_tokens=40, temperature=1.0, seed=seed)
        pieces = [tokenizer.decode([t]) for t in free.response_token_ids]
        full = "".join(pieces)
        for j in range(2, len(pieces)):
            if free.response_token_ids[j] not in multi_ids:
                continue
            before = "".join(pieces[:j])
            stop = before[-2:] + pieces[j][0]  # ends after the first character of token j
            if full.find(stop) == len(before) - 2:
                out = sample_once(
                    backend, tokenizer, "ab", max_new_tokens=40, temperature=1.0, seed=seed, stop=(stop,)
                )
                assert out.finish_reason == "stop"
                assert out.response_token_ids == free.response_token_ids[: j + 1]
                assert out.text == before + pieces[j][0]
                assert tokenizer.decode(list(out.response_token_ids)) == before + pieces[j]
                return
    pytest.fail("no sample with a multi-character token to cut")


def test_earliest_ending_stop_string_wins():
    assert find_stop("abcdef", ["def", "bc"]) == 3
    assert find_stop("abcdef", ["cdef", "ef"]) == 6
    assert find_stop("abcdef", ["x"]) is None
    assert find_stop("abcabc", ["abc"], search_from=1) == 6


def test_eos_token_stops_and_is_kept_but_not_in_text(tokenizer):
    model = tiny_llama(0)
    backend = HFBackend(model, tokenizer)
    free = sample_once(backend, tokenizer, "1+2=", max_new_tokens=20, temperature=0.0)
    assert EOS not in free.response_token_ids
    ids = list(free.response_token_ids)
    j = next(
        i for i in range(2, len(ids)) if ids[i] not in ids[:i] and ids[i] not in encode(tokenizer, "1+2=")
    )
    # Swap the output rows of token ids[j] and EOS: greedy decoding now emits EOS exactly at step j.
    with torch.no_grad():
        head = model.lm_head.weight
        head[[ids[j], EOS]] = head[[EOS, ids[j]]].clone()
    out = sample_once(backend, tokenizer, "1+2=", max_new_tokens=20, temperature=0.0)
    assert out.finish_reason == "stop"
    assert list(out.response_token_ids) == [*ids[:j], EOS]
    assert out.text == tokenizer.decode(ids[:j])
    # An explicit end token set (e.g. a chat model's end-of-turn token) replaces the default.
    free2 = sample_once(
        HFBackend(tiny_llama(0), tokenizer, eos_token_ids=[ids[j]]),
        tokenizer,
        "1+2=",
        max_new_tokens=20,
        temperature=0.0,
    )
    assert list(free2.response_token_ids) == ids[: j + 1] and free2.finish_reason == "stop"


def test_stop_string_never_seen_runs_to_length(tokenizer):
    out = sample_once(
        HFBackend(tiny_llama(0), tokenizer),
        tokenizer,
        "1+2=",
        max_new_tokens=7,
        temperature=0.0,
        stop=("<<never>>",),
    )
    assert out.finish_reason == "length" and len(out.response_token_ids) == 7


def snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_load_weights_makes_outputs_match_a_model_built_with_them(tokenizer):
    target = tiny_llama(1)
    backend = HFBackend(tiny_llama(0), tokenizer, max_batch_size=3)
    reference = HFBackend(target, tokenizer, max_batch_size=3)
    requests = [
        GenerationRequest("a", encode(tokenizer, "1+2="), SamplingParams(max_new_tokens=8, temperature=0.0)),
        GenerationRequest(
            "b", encode(tokenizer, "abc de"), SamplingParams(max_new_tokens=8, temperature=0.9, seed=4, n=2)
        ),
    ]
    before = by_key(backend.generate(requests))
    backend.load_weights(snapshot(target), version=3)
    assert backend.version == 3
    after, expected = by_key(backend.generate(requests)), by_key(reference.generate(requests))
    assert after.keys() == expected.keys()
    assert any(before[k].response_token_ids != after[k].response_token_ids for k in after)
    for key, out in after.items():
        assert out.policy_version == 3
        assert out.response_token_ids == expected[key].response_token_ids
        assert max(abs(a - b) for a, b in zip(out.logprobs, expected[key].logprobs, strict=True)) < 1e-5


def bad_state_dicts():
    good = snapshot(tiny_llama(1))
    last = list(good)[-1]
    first = next(iter(good))

    def moved_last(sd, name):  # the bad tensor comes last: a half-applying loader would change the rest
        return {**{k: v for k, v in sd.items() if k != name}, name: sd[name]}

    missing = {k: v for k, v in good.items() if k != last}
    shape = moved_last({**good, first: torch.zeros(3, 3)}, first)
    dtype = moved_last({**good, first: good[first].to(torch.bfloat16)}, first)
    extra = {**good, "model.layers.9.oops.weight": torch.zeros(2)}
    return [
        ("missing", missing, last),
        ("shape", shape, first),
        ("dtype", dtype, first),
        ("unexpected", extra, "model.layers.9.oops.weight"),
    ]


@pytest.mark.parametrize(
    ("kind", "state_dict", "name"), bad_state_dicts(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_bad_state_dict_is_rejected_naming_the_tensor_and_changes_nothing(tokenizer, kind, state_dict, name):
    model = tiny_llama(0)
    backend = HFBackend(model, tokenizer, version=2)
    before = snapshot(model)
    with pytest.raises(WireError) as err:
        backend.load_weights(state_dict, version=9)
    assert name in str(err.value)
    assert {"missing": "missing", "shape": "shape", "dtype": "dtype", "unexpected": "not a tensor"}[
        kind
    ] in str(err.value)
    assert backend.version == 2
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_tied_weights_need_only_one_name(tokenizer):
    model, target = tiny_llama(0, tied=True), tiny_llama(1, tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    backend = HFBackend(model, tokenizer)
    sd = {k: v for k, v in snapshot(target).items() if k != "lm_head.weight"}
    backend.load_weights(sd, version=1)
    assert torch.equal(model.lm_head.weight, target.model.embed_tokens.weight)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with pytest.raises(WireError, match=r"embed_tokens.*tied alias lm_head"):
        backend.load_weights({k: v for k, v in sd.items() if k != "model.embed_tokens.weight"}, version=2)


def test_n_samples_per_prompt_are_indexed_and_reproducible_across_batching(tokenizer):
    model = tiny_llama(0)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, n=3, seed=11)
    requests = [GenerationRequest(p, encode(tokenizer, PROMPTS[p]), params) for p in PROMPTS]
    wide = by_key(HFBackend(model, tokenizer, max_batch_size=16).generate(requests))
    narrow = by_key(HFBackend(model, tokenizer, max_batch_size=1).generate(requests))
    assert sorted(wide) == sorted((p, i) for p in PROMPTS for i in range(3))
    for key, out in wide.items():
        assert out.response_token_ids == narrow[key].response_token_ids
    for p in PROMPTS:
        samples = {wide[(p, i)].response_token_ids for i in range(3)}
        assert len(samples) == 3, "samples of one prompt should differ"


def test_each_distinct_prompt_is_prefilled_once_and_its_samples_continue_from_it(tokenizer):
    model = tiny_llama(0)
    shapes: list[tuple[int, ...]] = []
    model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=4, seed=5)
    requests = [GenerationRequest(p, encode(tokenizer, PROMPTS[p]), params) for p in ("short", "long")]
    outputs = list(HFBackend(model, tokenizer, max_batch_size=16).generate(requests))
    width = max(len(encode(tokenizer, PROMPTS[p])) for p in ("short", "long"))
    assert shapes[0] == (2, width)  # two prompts, not eight rows
    assert all(rows <= 8 and length == 1 for rows, length in shapes[1:])
    for out in outputs:
        expected = reference_logprobs(model, out, 1.0)
        assert max(abs(a - b) for a, b in zip(out.logprobs, expected, strict=True)) < 1e-4


def test_unseeded_requests_follow_the_backend_seed(tokenizer):
    model = tiny_llama(0)
    req = [GenerationRequest("x", encode(tokenizer, "1+2="), SamplingParams(max_new_tokens=12, n=2))]
    a = [o.response_token_ids for o in HFBackend(model, tokenizer, seed=1).generate(req)]
    b = [o.response_token_ids for o in HFBackend(model, tokenizer, seed=1).generate(req)]
    c = [o.response_token_ids for o in HFBackend(model, tokenizer, seed=2).generate(req)]
    assert a == b and a != c


def test_filter_logits_hand_worked():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]]))
    kept = filter_logits(logits, torch.tensor([0, 2]), torch.tensor([0.7, 1.0])).isfinite().tolist()
    assert kept == [[True, True, False, False], [False, False, True, True]]
    # top-p on the distribution renormalized after top-k: {0.5, 0.3} -> {0.625, 0.375}; p=0.6 keeps one.
    kept = filter_logits(logits[:1], torch.tensor([2]), torch.tensor([0.6])).isfinite().tolist()
    assert kept == [[True, False, False, False]]
    assert torch.equal(filter_logits(logits, torch.tensor([0, 0]), torch.tensor([1.0, 1.0])), logits)


def test_sampling_frequencies_follow_the_filtered_distribution():
    rows = 4000
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1])).repeat(rows, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_tokens(
        logits, torch.full((rows,), 1.0), torch.full((rows,), 3), torch.ones(rows), [gen] * rows
    )
    counts = torch.bincount(tokens, minlength=4).double() / rows
    expected = torch.tensor([4 / 9, 3 / 9, 2 / 9, 0.0], dtype=torch.double)
    assert (counts - expected).abs().max() < 4 * math.sqrt(0.25 / rows)
    # log-probs are of the unfiltered tempered distribution, not the renormalized top-k one
    assert torch.allclose(logprobs, torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))[tokens])


def test_bad_requests_fail_before_any_work(tokenizer):
    backend = HFBackend(tiny_llama(0), tokenizer)
    too_long = GenerationRequest("big", (5,) * 90, SamplingParams(max_new_tokens=10))
    with pytest.raises(ValueError, match=r"'big'.*exceeds the model's 96 positions"):
        backend.generate([GenerationRequest("fine", (5, 6)), too_long])  # raises at the call
    with pytest.raises(ValueError, match=r"'oov'.*\[0, "):
        list(backend.generate([GenerationRequest("oov", (1, 10_000))]))
    with pytest.raises(ValueError, match="prompt_token_ids"):
        GenerationRequest("empty", ())
    for field, value in [
        ("top_p", 0.0),
        ("temperature", -1.0),
        ("top_k", -1),
        ("n", 0),
        ("max_new_tokens", 0),
        ("stop", ("",)),
    ]:
        with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
            SamplingParams(**{field: value})


def test_factory_and_protocol(tokenizer, monkeypatch):
    backend = make_backend(HF, tiny_llama(0), tokenizer, max_batch_size=2)
    assert isinstance(backend, HFBackend) and isinstance(backend, GenerationBackend)
    assert backend.version == 0 and backend.tokenizer is tokenizer
    with pytest.raises(ValueError, match=r"'nope' is unknown.*hf"):
        make_backend(backend_kind("nope"), None, tokenizer)
    monkeypatch.setitem(ENGINES, VLLM, "decentralized_verl.backends.not_installed_engine:VLLMBackend")
    with pytest.raises(ImportError, match="'vllm' is not installed"):
        make_backend(VLLM, None, tokenizer)


def test_per_row_generators_sample_the_same_distribution_and_ignore_zero_probability_tokens():
    """Seeded rows each draw from their own generator (inverse CDF); frequencies still follow p."""
    rows = 4000
    p = torch.tensor([0.5, 0.0, 0.25, 0.0, 0.25])
    logits = torch.log(p).repeat(rows, 1)
    gens = [torch.Generator().manual_seed(i) for i in range(rows)]
    tokens, _ = sample_tokens(
        logits, torch.full((rows,), 1.0), torch.zeros(rows, dtype=torch.long), torch.ones(rows), gens
    )
    counts = torch.bincount(tokens, minlength=5).double() / rows
    assert counts[1] == 0 and counts[3] == 0
    assert (counts - p.double()).abs().max() < 4 * math.sqrt(0.25 / rows)
    again, _ = sample_tokens(
        logits[:3], torch.ones(3), torch.zeros(3, dtype=torch.long), torch.ones(3),
        [torch.Generator().manual_seed(i) for i in range(3)],
    )  # fmt: skip
    assert again.tolist() == tokens[:3].tolist()  # a row's draw depends only on its own generator
