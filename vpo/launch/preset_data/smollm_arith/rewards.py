"""Reward functions of the smollm-arith preset: three components of one reward vector.

Each has TRL's shape, fn(prompts, completions, **columns) -> list of floats in [0, 1]:

    correct   1 iff the last integer in the completion is the answer
    format    1 iff the completion is the number alone (an optional trailing period)
    brevity   1 - len(completion) / 80, floored at 0 (a working-out costs length)

They conflict on purpose: writing out the sum ("17 + 25 = 42") helps a small model get it right
but costs format and brevity.
"""

import re

_INT = re.compile(r"-?\d+")
_ALONE = re.compile(r"\s*-?\d+\.?\s*")


def correct(prompts, completions, answer, **columns):
    out = []
    for text, want in zip(completions, answer, strict=True):
        found = _INT.findall(text)
        out.append(1.0 if found and int(found[-1]) == int(want) else 0.0)
    return out


def format(prompts, completions, **columns):  # noqa: A001  (the component's name)
    return [1.0 if _ALONE.fullmatch(text) else 0.0 for text in completions]


def brevity(prompts, completions, **columns):
    return [max(0.0, 1.0 - len(text) / 80) for text in completions]
