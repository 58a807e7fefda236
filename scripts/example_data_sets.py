"""The example data sets themselves, one generator per set: arithmetic, toy, the multi-turn games and the
SFT/preference sets (the code problems, with their reference programs, are example_code_problems.py).

Split out of scripts/make_example_data.py, which keeps the command line and the writing of files (see its
docstring for what each set is and why): every generator here is a pure function of its seeded
`random.Random`, so the same seed gives the same records.
"""

from __future__ import annotations

import random

# ------------------------------------------------------------------------------------ arithmetic
ARITHMETIC_SPLITS = {
    # level: (train count, eval count)
    "add2": (2400, 240),  # 2-digit addition
    "add20": (110, 30),  # a + b, 1..20, at least one operand below 10
    "mul": (100, 30),  # a * b, 2..12 x 2..20
}


def _problems(level: str) -> list[tuple[str, int, int]]:
    """Every problem of a level, one per unordered operand pair (so a swap never leaks into eval)."""
    if level == "add2":
        pairs = {tuple(sorted((a, b))) for a in range(10, 100) for b in range(10, 100)}
        op = "+"
    elif level == "add20":  # pairs with both operands >= 10 belong to add2
        pairs = {tuple(sorted((a, b))) for a in range(1, 21) for b in range(1, 21) if min(a, b) < 10}
        op = "+"
    else:
        pairs = {tuple(sorted((a, b))) for a in range(2, 13) for b in range(2, 21)}
        op = "*"
    return [(op, a, b) for a, b in sorted(pairs)]


def is_small_sum(item: dict) -> bool:
    """`a + b` with both operands in 1..20: the level where SmolLM2-135M has RL headroom on a CPU budget
    (one-shot greedy ~0.66, T=1 ~0.46 per sample: most GRPO groups hold both right and wrong answers)."""
    parts = item["messages"]["content"].removeprefix("What is ").removesuffix("?").split(" ")
    return len(parts) == 3 and parts[1] == "+" and all(int(x) <= 20 for x in (parts[0], parts[2]))


def is_two_digit_sum(item: dict) -> bool:
    """`a + b` with two-digit operands: one-shot SmolLM2-135M starts near 26% greedy (11% per sample at T=1,
    pass@8 45%), so GRPO groups carry signal and accuracy has room to rise; README's SmolLM2 example."""
    parts = item["messages"]["content"].removeprefix("What is ").removesuffix("?").split(" ")
    return len(parts) == 3 and parts[1] == "+" and all(10 <= int(x) <= 99 for x in (parts[0], parts[2]))


def arithmetic(rng: random.Random) -> tuple[list[dict], list[dict]]:
    train: list[dict] = []
    evals: list[dict] = []
    for level, (n_train, n_eval) in ARITHMETIC_SPLITS.items():
        pool = _problems(level)
        chosen = rng.sample(pool, n_train + n_eval)
        for i, (op, a, b) in enumerate(chosen):
            if rng.random() < 0.5:  # unordered pairs above; show them in either order
                a, b = b, a
            answer = a + b if op == "+" else a * b
            item = {
                "messages": {"role": "user", "content": f"What is {a} {op} {b}?"},
                "gt_answer": str(answer),
            }
            (evals if i < n_eval else train).append(item)
    rng.shuffle(train)
    rng.shuffle(evals)
    return train, evals


# ------------------------------------------------------------------------------------------- toy
def toy() -> tuple[list[dict], list[dict], list[dict]]:
    problems = [(a, b) for a in range(10) for b in range(10) if a + b < 10]
    items = [
        {"messages": {"role": "user", "content": f"{a}+{b}="}, "gt_answer": str(a + b)} for a, b in problems
    ]
    sft = [{"prompt": f"{a}+{b}=", "completion": f"\\boxed{{{a + b}}}"} for a, b in problems]
    return items, list(items), sft


def guessing(rng: random.Random, top: int = 4) -> tuple[list[dict], list[dict]]:
    """Games of the `guessing_game` environment: the hidden number is the record's answer. Every game looks
    the same to the model (the number is hidden), so only the feedback of earlier turns can help it."""

    def games(n: int) -> list[dict]:
        return [{"prompt": "Guess the number.", "answer": str(rng.randint(1, top))} for _ in range(n)]

    return games(64), games(16)


def verifiers_guessing(train: int = 64, evals: int = 16, top: int = 4) -> tuple[list[dict], list[dict]]:
    """Games of the verifiers taskset `decentralized_verl.environments.verifiers_guessing` (its first
    `train + evals` tasks): each record names its task, which holds the hidden number, so the same
    file works for whoever plays the taskset. `python -m decentralized_verl.environments.verifiers_env`
    writes the same records from the taskset itself (a test checks)."""

    def games(first: int, n: int) -> list[dict]:
        return [
            {
                "messages": [
                    {"role": "system", "content": f"Guess 1-{top}."},
                    {"role": "user", "content": "Guess the number."},
                ],
                "gt_answer": f"guess-{i}",
            }
            for i in range(first, first + n)
        ]

    return games(0, train), games(train, evals)


def calculator(rng: random.Random) -> tuple[list[dict], list[dict]]:
    """Products a model may hand to the `calculator` environment (`<calc>37*46</calc>`) before answering."""

    def problems(n: int) -> list[dict]:
        out = []
        for _ in range(n):
            a, b = rng.randint(12, 99), rng.randint(12, 99)
            out.append(
                {"messages": {"role": "user", "content": f"What is {a} * {b}?"}, "gt_answer": str(a * b)}
            )
        return out

    return problems(200), problems(50)


# ------------------------------------------------------------------------------------------- sft
def _parts(item: dict) -> tuple[str, str]:
    return item["messages"]["content"], item["gt_answer"]


def _worked(question: str, answer: str) -> str:
    expression = question.removeprefix("What is ").removesuffix("?")
    return f"{expression} = {answer}. The answer is \\boxed{{{answer}}}."


def _near_miss(answer: str, rng: random.Random) -> str:
    wrong = int(answer) + rng.choice([-10, -2, -1, 1, 2, 10])
    return str(wrong)


def sft_sets(train: list[dict], evals: list[dict], rng: random.Random) -> dict[str, list[dict]]:
    def sft(items: list[dict]) -> list[dict]:
        return [{"prompt": q, "completion": _worked(q, a)} for q, a in map(_parts, items)]

    def preference(items: list[dict]) -> list[dict]:
        pairs = []
        for q, a in map(_parts, items):
            pairs.append({"prompt": q, "chosen": _worked(q, a), "rejected": _worked(q, _near_miss(a, rng))})
        return pairs

    return {
        "sft_train.json": sft(train[:400]),
        "sft_eval.json": sft(evals[:50]),
        "preference_train.json": preference(train[400:800]),
        "preference_eval.json": preference(evals[50:100]),
        "prompts.json": [{"prompt": q, "answer": a} for q, a in map(_parts, train[800:1000])],
    }
