"""The RLHF lab's task: finish a line of Python, judged by a score that can be computed.

A prompt is the first `prompt_len` bytes of a line of the standard library (leading indentation
stripped), taken only from lines that parse on their own, so every prompt has a good ending. The
policy writes bytes until a newline (the end-of-sequence token) or its budget runs out.

The true score of a completion (what the reward model is trained to predict from comparisons, and
what the lab reports as the fact of improvement), in [0, 1]:

    0.25  the completion ends: a newline within the budget
    0.25  brackets balance: every ( [ { closed in order, none left open (prompt + completion)
    0.50  the line parses with `ast` (a block opener "...:" gets " pass")

and 0 for a completion with fewer than `min_new` bytes before its newline: without that floor,
stopping at the first identifier boundary would already parse and balance.

No jax here: the score is plain Python over bytes (the reward model is what runs on the mesh).
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass

import numpy as np

EOS = ord("\n")  # a completion ends at its newline
_OPEN, _CLOSE = b"([{", b")]}"


@dataclass(frozen=True)
class TaskConfig:
    prompt_len: int = 16  # bytes of each prompt (all prompts have this length)
    max_new: int = 24  # the completion's budget in bytes, its newline included
    min_new: int = 4  # bytes before the newline for the parse credit
    max_lines: int = 20_000  # distinct prompt lines read from the corpus

    def __post_init__(self):
        if self.prompt_len < 1 or self.max_new < 2 or self.min_new < 0:
            raise ValueError("prompt_len >= 1, max_new >= 2 and min_new >= 0 are required")


@dataclass(frozen=True)
class Score:
    total: float
    ends: bool
    balanced: bool
    parses: bool


def _parses(line: str) -> bool:
    text = line.strip()
    if text.endswith(":"):
        text += " pass"
    try:
        with warnings.catch_warnings():  # invalid escapes in a generated string literal
            warnings.simplefilter("ignore")
            ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return True


def _balanced(data: bytes) -> bool:
    stack = []
    for b in data:
        if b in _OPEN:
            stack.append(_CLOSE[_OPEN.index(b)])
        elif b in _CLOSE and (not stack or stack.pop() != b):
            return False
    return not stack


def true_score(prompt: bytes, completion: bytes, task: TaskConfig) -> Score:
    """The score of `completion` (bytes as generated: its newline, if any, is the last byte)."""
    ends = completion.endswith(b"\n")
    body = completion[:-1] if ends else completion
    line = prompt + body
    balanced = _balanced(line)
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    parses = ends and text is not None and _parses(text)
    if len(body) < task.min_new:  # too short to be a completion: no credit at all
        return Score(0.0, ends, balanced, False)
    return Score(0.25 * ends + 0.25 * balanced + 0.5 * parses, ends, balanced, parses)


def score_parts(
    prompts_BP: np.ndarray, tokens_BN: np.ndarray, valid_BN: np.ndarray, task: TaskConfig
) -> dict[str, np.ndarray]:
    """float32 [B] each: the true score of every row of a rollout batch, and its three parts."""
    rows = []
    for b in range(len(prompts_BP)):
        completion = bytes(int(t) for t in tokens_BN[b][valid_BN[b]])
        rows.append(true_score(bytes(int(t) for t in prompts_BP[b]), completion, task))
    return {
        k: np.asarray([getattr(r, k) for r in rows], np.float32)
        for k in ("total", "ends", "balanced", "parses")
    }


def scores(prompts_BP, tokens_BN, valid_BN, task: TaskConfig) -> np.ndarray:
    """float32 [B]: the true score of every row of a rollout batch."""
    return score_parts(prompts_BP, tokens_BN, valid_BN, task)["total"]


def prompt_lines(corpus: bytes, task: TaskConfig) -> np.ndarray:
    """uint8 [N, prompt_len]: distinct prompts, in corpus order, from lines that parse alone and
    are at least min_new + 2 bytes longer than the prompt (so a good completion exists)."""
    seen, rows = set(), []
    for raw in corpus.split(b"\n"):
        line = raw.strip()
        if len(line) < task.prompt_len + task.min_new + 2 or line.startswith(b"#"):
            continue
        if len(line) - task.prompt_len > task.max_new - 1 or not _balanced(line):
            continue  # a good ending would not fit the budget
        prefix = line[: task.prompt_len]
        if prefix in seen or not prefix.isascii():
            continue
        try:
            ok = _parses(line.decode("utf-8"))
        except UnicodeDecodeError:
            ok = False
        if ok:
            seen.add(prefix)
            rows.append(np.frombuffer(prefix, np.uint8))
            if len(rows) >= task.max_lines:
                break
    if not rows:
        raise ValueError("no prompt lines in the corpus for this task")
    return np.stack(rows).astype(np.int32)


def split(prompts: np.ndarray, held_out: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) prompts: a fixed shuffle, so reward-model accuracy and RLHF's
    evaluation use prompts the training never saw."""
    order = np.random.default_rng(0).permutation(len(prompts))
    cut = max(1, int(len(prompts) * held_out))
    return prompts[order[cut:]], prompts[order[:cut]]


def load_prompts(task: TaskConfig) -> tuple[np.ndarray, np.ndarray]:
    from jaxscale.train.data import load_stdlib_corpus

    return split(prompt_lines(load_stdlib_corpus(), task))
