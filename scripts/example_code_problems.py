"""The example code problems: each a statement, a reference stdin -> stdout Python program and a maker of
test inputs; a record's expected outputs are the reference program's own, run on inputs drawn from the
seeded `random.Random` (so the same seed gives the same records). Used by scripts/make_example_data.py.
"""

from __future__ import annotations

import contextlib
import io
import random
from collections.abc import Callable
from dataclasses import dataclass


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
