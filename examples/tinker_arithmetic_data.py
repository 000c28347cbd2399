"""Write addition conversations for tinker-cookbook's ``chat_sl`` recipe: a warm-up before ``math_rl env=arithmetic``.

SmolLM2-135M does not add two numbers up to 100 (``math_rl``'s arithmetic reward stays at zero correct), so a
short supervised warm-up on conversations of the recipe's own shape (its few-shot pair, then the question, then
the bare sum) gives reinforcement learning something to improve (docs/tinker.md).

.. doc-test: repo

Run it from the repository root, then pass the file as ``chat_sl.train dataset=FILE``::

    python examples/tinker_arithmetic_data.py --out runs/arithmetic.jsonl --n 4000 --seed 0
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def conversation(x: int, y: int) -> dict[str, list[dict[str, str]]]:
    """One conversation as ``math_rl``'s arithmetic env renders it: its few-shot pair, the question, the sum."""
    return {
        "messages": [
            {"role": "user", "content": "What is 4 + 5?"},
            {"role": "assistant", "content": "9"},
            {"role": "user", "content": f"What is {x} + {y}?"},
            {"role": "assistant", "content": str(x + y)},
        ]
    }


def write(out: Path, n: int, seed: int) -> None:
    """Write ``n`` conversations with operands drawn uniformly from 0..100 (the recipe's range)."""
    rng = random.Random(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for _ in range(n):
            f.write(json.dumps(conversation(rng.randint(0, 100), rng.randint(0, 100))) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    parser.add_argument("--n", type=int, default=4000, help="how many conversations")
    parser.add_argument("--seed", type=int, default=0, help="the operands' random seed")
    args = parser.parse_args()
    write(args.out, args.n, args.seed)


if __name__ == "__main__":
    main()
