"""The example data sets themselves, one generator per set: arithmetic, code, toy and the SFT/preference sets.

Split out of scripts/make_example_data.py, which keeps the command line and the writing of files (see its
docstring for what each set is and why): every generator here is a pure function of its seeded
`random.Random`, so the same seed gives the same records.
"""

from __future__ import annotations

import contextlib
import io
import random
from collections.abc import Callable
from dataclasses import dataclass

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
    pass@8 45%), so GRPO groups carry signal and accuracy has room to rise; README's first command."""
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


# ------------------------------------------------------------------------------------------ code
@dataclass(frozen=True)
class CodeProblem:
    statement: str
    solution: str  # a stdin -> stdout Python program
    make_input: Callable[[random.Random], str]


def _ints(rng: random.Random, n: int, lo: int = -50, hi: int = 50) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _list_input(rng: random.Random, lo: int = -50, hi: int = 50) -> str:
    values = _ints(rng, rng.randint(1, 8), lo, hi)
    return f"{len(values)}\n{' '.join(map(str, values))}\n"


WORDS = ["apple", "level", "banana", "racecar", "python", "noon", "stats", "hello", "world", "kayak"]


def _word(rng: random.Random) -> str:
    return rng.choice(WORDS)


def _line(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))


LIST_FORMAT = "The first line holds n, the second line n integers separated by spaces."

CODE_PROBLEMS: list[CodeProblem] = [
    CodeProblem(
        "Read two integers a and b on one line and print their sum.",
        "a, b = map(int, input().split())\nprint(a + b)\n",
        lambda r: f"{r.randint(-1000, 1000)} {r.randint(-1000, 1000)}\n",
    ),
    CodeProblem(
        "Read two integers a and b on one line and print a - b.",
        "a, b = map(int, input().split())\nprint(a - b)\n",
        lambda r: f"{r.randint(-1000, 1000)} {r.randint(-1000, 1000)}\n",
    ),
    CodeProblem(
        "Read two integers a and b on one line and print their product.",
        "a, b = map(int, input().split())\nprint(a * b)\n",
        lambda r: f"{r.randint(-100, 100)} {r.randint(-100, 100)}\n",
    ),
    CodeProblem(
        f"Print the largest of a list of integers. {LIST_FORMAT}",
        "input()\nprint(max(map(int, input().split())))\n",
        _list_input,
    ),
    CodeProblem(
        f"Print the smallest of a list of integers. {LIST_FORMAT}",
        "input()\nprint(min(map(int, input().split())))\n",
        _list_input,
    ),
    CodeProblem(
        f"Print the sum of a list of integers. {LIST_FORMAT}",
        "input()\nprint(sum(map(int, input().split())))\n",
        _list_input,
    ),
    CodeProblem(
        "Read a word and print it reversed.",
        "print(input().strip()[::-1])\n",
        lambda r: _word(r) + "\n",
    ),
    CodeProblem(
        "Read a line of lowercase text and print how many vowels (a, e, i, o, u) it contains.",
        "print(sum(c in 'aeiou' for c in input()))\n",
        lambda r: _line(r) + "\n",
    ),
    CodeProblem(
        "Read a word and print YES if it reads the same backwards, otherwise NO.",
        "s = input().strip()\nprint('YES' if s == s[::-1] else 'NO')\n",
        lambda r: _word(r) + "\n",
    ),
    CodeProblem(
        "Read an integer n (0 <= n <= 12) and print n factorial.",
        "import math\nprint(math.factorial(int(input())))\n",
        lambda r: f"{r.randint(0, 12)}\n",
    ),
    CodeProblem(
        "Read an integer n (1 <= n <= 40) and print the n-th Fibonacci number, where F(1) = F(2) = 1.",
        "n = int(input())\na, b = 1, 1\nfor _ in range(n - 1):\n    a, b = b, a + b\nprint(a)\n",
        lambda r: f"{r.randint(1, 40)}\n",
    ),
    CodeProblem(
        "Read an integer n (1 <= n <= 10000) and print YES if it is prime, otherwise NO.",
        "n = int(input())\n"
        "print('YES' if n > 1 and all(n % d for d in range(2, int(n**0.5) + 1)) else 'NO')\n",
        lambda r: f"{r.choice([r.randint(1, 10000), r.choice([2, 3, 97, 7919, 9973, 1, 4, 91])])}\n",
    ),
    CodeProblem(
        f"Print a list of integers sorted in increasing order, separated by spaces. {LIST_FORMAT}",
        "input()\nprint(*sorted(map(int, input().split())))\n",
        _list_input,
    ),
    CodeProblem(
        "Read a line and print how many words it has (words are separated by spaces).",
        "print(len(input().split()))\n",
        lambda r: _line(r) + "\n",
    ),
    CodeProblem(
        "Read a line and print it in upper case.",
        "print(input().upper())\n",
        lambda r: _line(r) + "\n",
    ),
    CodeProblem(
        "Read two positive integers a and b on one line and print their greatest common divisor.",
        "import math\na, b = map(int, input().split())\nprint(math.gcd(a, b))\n",
        lambda r: f"{r.randint(1, 500) * r.choice([1, 2, 6])} {r.randint(1, 500) * r.choice([1, 3, 6])}\n",
    ),
    CodeProblem(
        "Read two positive integers a and b on one line and print their least common multiple.",
        "import math\na, b = map(int, input().split())\nprint(a * b // math.gcd(a, b))\n",
        lambda r: f"{r.randint(1, 60)} {r.randint(1, 60)}\n",
    ),
    CodeProblem(
        "Read a non-negative integer and print the sum of its decimal digits.",
        "print(sum(map(int, input().strip())))\n",
        lambda r: f"{r.randint(0, 10**9)}\n",
    ),
    CodeProblem(
        "Read an integer and print EVEN if it is even, otherwise ODD.",
        "print('EVEN' if int(input()) % 2 == 0 else 'ODD')\n",
        lambda r: f"{r.randint(-100, 100)}\n",
    ),
    CodeProblem(
        "Read n and print the numbers 1..n, one per line, but Fizz for multiples of 3, Buzz for "
        "multiples of 5 and FizzBuzz for multiples of both.",
        "for i in range(1, int(input()) + 1):\n"
        "    print('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else i)\n",
        lambda r: f"{r.randint(1, 20)}\n",
    ),
    CodeProblem(
        "Read n and print a triangle of n lines: line i holds i asterisks.",
        "for i in range(1, int(input()) + 1):\n    print('*' * i)\n",
        lambda r: f"{r.randint(1, 6)}\n",
    ),
    CodeProblem(
        "The first line is a word, the second a single character. Print how often the character "
        "occurs in the word.",
        "s = input().strip()\nc = input().strip()\nprint(s.count(c))\n",
        lambda r: f"{_word(r)}\n{r.choice('aelnopy')}\n",
    ),
    CodeProblem(
        f"Print the mean of a list of integers with exactly two digits after the point. {LIST_FORMAT}",
        "input()\nv = list(map(int, input().split()))\nprint(f'{sum(v) / len(v):.2f}')\n",
        _list_input,
    ),
    CodeProblem(
        f"Print the largest and the smallest of a list of integers, separated by a space. {LIST_FORMAT}",
        "input()\nv = list(map(int, input().split()))\nprint(max(v), min(v))\n",
        _list_input,
    ),
    CodeProblem(
        "Read a non-negative integer and print it in binary without leading zeros.",
        "print(bin(int(input()))[2:])\n",
        lambda r: f"{r.randint(0, 1000)}\n",
    ),
    CodeProblem(
        f"Print how many distinct values a list of integers has. {LIST_FORMAT}",
        "input()\nprint(len(set(input().split())))\n",
        lambda r: _list_input(r, 0, 5),
    ),
    CodeProblem(
        "Read a temperature in degrees Celsius (an integer) and print it in Fahrenheit with one digit "
        "after the point.",
        "c = int(input())\nprint(f'{c * 9 / 5 + 32:.1f}')\n",
        lambda r: f"{r.randint(-40, 100)}\n",
    ),
    CodeProblem(
        "Read n and print 1 + 2 + ... + n.",
        "n = int(input())\nprint(n * (n + 1) // 2)\n",
        lambda r: f"{r.randint(1, 10000)}\n",
    ),
    CodeProblem(
        f"Print how many numbers in a list of integers are strictly positive. {LIST_FORMAT}",
        "input()\nprint(sum(int(x) > 0 for x in input().split()))\n",
        _list_input,
    ),
    CodeProblem(
        "Read a line of words and print the words in reverse order, separated by single spaces.",
        "print(' '.join(input().split()[::-1]))\n",
        lambda r: _line(r) + "\n",
    ),
    CodeProblem(
        f"Print the running sums of a list of integers, separated by spaces. {LIST_FORMAT}",
        "input()\ntotal = 0\nout = []\nfor x in map(int, input().split()):\n"
        "    total += x\n    out.append(total)\nprint(*out)\n",
        _list_input,
    ),
    CodeProblem(
        "Read two words on one line and print YES if they are anagrams of each other, otherwise NO.",
        "a, b = input().split()\nprint('YES' if sorted(a) == sorted(b) else 'NO')\n",
        lambda r: r.choice(["listen silent", "apple paple", "hello world", "stats tats", "noon onno"]) + "\n",
    ),
]
CODE_EVAL_COUNT = 8
CODE_PREAMBLE = (
    "Solve the following coding problem using the programming language python. Read the input from "
    "standard input and print the answer to standard output.\n\n"
)


def run_solution(source: str, stdin: str) -> str:
    """Run a reference program in-process with `stdin` as its standard input; its stdout."""
    out = io.StringIO()
    lines = iter(stdin.splitlines())

    def fake_input(prompt: str = "") -> str:
        return next(lines)

    with contextlib.redirect_stdout(out):
        exec(compile(source, "<solution>", "exec"), {"__name__": "__main__", "input": fake_input})
    return out.getvalue()


def code_item(problem: CodeProblem, rng: random.Random) -> dict:
    target = rng.choice([2, 3, 4])
    inputs: list[str] = []
    for _ in range(200):  # distinct test inputs
        candidate = problem.make_input(rng)
        if candidate not in inputs:
            inputs.append(candidate)
        if len(inputs) == target:
            break
    assert len(inputs) >= 2, problem.statement
    outputs = [run_solution(problem.solution, stdin) for stdin in inputs]
    return {
        "messages": {"role": "user", "content": CODE_PREAMBLE + problem.statement},
        "test_cases": {"inputs": inputs, "outputs": outputs},
    }


def code(rng: random.Random) -> tuple[list[dict], list[dict]]:
    items = [code_item(problem, rng) for problem in CODE_PROBLEMS]
    rng.shuffle(items)
    return items[CODE_EVAL_COUNT:], items[:CODE_EVAL_COUNT]


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
