"""Prefix sharing (RadixCache): how much KV memory shared prompt prefixes save.

Port of seed 002 ch9 `prefix_sharing_demo.py` (ML Systems Infrastructure Tutorial): a per-token trie
demo over six requests, and closed-form savings for a shared system prompt and shared few-shot
examples: savings = 1 - (S + n*U) / (n*(S + U)) for n requests sharing S tokens, each with U own
tokens.

The seed tokenizes with `hash(word) % 1000` (in demo_prefix_sharing). Python salts str hashes per
process, so its token ids change from run to run (the statistics do not, barring collisions). We
give words ids in first-seen order instead: deterministic and collision-free, with the same trie
statistics.
"""

from dataclasses import dataclass, field

# The demo's six requests (demo_prefix_sharing).
SEED_REQUESTS = (
    "You are a helpful assistant. What is the capital of France?",
    "You are a helpful assistant. What is the capital of Germany?",
    "You are a helpful assistant. What is the largest planet?",
    "You are a helpful assistant. Tell me a joke.",
    "You are a coding assistant. Write a Python function.",
    "You are a coding assistant. Explain recursion.",
)
SEED_TREE_DEPTH = 5  # levels below the root the seed draws (visualize_tree)
FEW_SHOT_EXAMPLES = 5  # few-shot analysis: 5 examples x 200 tokens, 50-token queries (its main)
FEW_SHOT_EXAMPLE_LEN = 200
FEW_SHOT_QUERY_LEN = 50


class WordTokenizer:
    """Lower-cased whitespace words -> ids in first-seen order (the seed's split)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.words: list[str] = []

    def encode(self, text: str) -> list[int]:
        tokens = []
        for word in text.lower().split():
            if word not in self.ids:
                self.ids[word] = len(self.words)
                self.words.append(word)
            tokens.append(self.ids[word])
        return tokens


@dataclass
class TrieNode:
    token: int | None = None
    kv_index: int | None = None  # slot of this token's K/V in the cache
    ref_count: int = 0  # requests whose prefix passes through this node
    children: dict[int, "TrieNode"] = field(default_factory=dict)


class TokenTrie:
    """The seed's RadixTree: one node per token, no edge compression, no eviction.

    Inserting a sequence reuses the nodes of its longest cached prefix and allocates a new KV slot
    for each remaining token."""

    def __init__(self) -> None:
        self.root = TrieNode()
        self.unique_kv_entries = 0
        self.shared_accesses = 0

    def insert(self, tokens: list[int]) -> list[int]:
        """KV slot of every token of `tokens`, reusing the slots of a cached prefix."""
        node, slots = self.root, []
        for token in tokens:
            if token in node.children:
                self.shared_accesses += 1
            else:
                node.children[token] = TrieNode(token=token, kv_index=self.unique_kv_entries)
                self.unique_kv_entries += 1
            node = node.children[token]
            node.ref_count += 1
            slots.append(node.kv_index)
        return slots


def render_trie(node: TrieNode, words: list[str], max_depth: int = SEED_TREE_DEPTH) -> list[str]:
    """ASCII tree in the seed's layout (visualize_tree), with words in place of hashed ids."""
    lines: list[str] = []

    def walk(n: TrieNode, prefix: str, is_last: bool, depth: int) -> None:
        if depth > max_depth:
            return
        label = "[root]" if n.token is None else f"[{words[n.token]}]"
        refs = f" (refs: {n.ref_count})" if n.ref_count else ""
        lines.append(f"{prefix}{'└── ' if is_last else '├── '}{label}{refs}")
        children = list(n.children.values())
        for i, child in enumerate(children):
            walk(child, prefix + ("    " if is_last else "│   "), i == len(children) - 1, depth + 1)

    walk(node, "", True, 0)
    return lines


@dataclass(frozen=True)
class RadixDemo:
    tokens_per_request: tuple[int, ...]
    unique_kv_entries: int  # KV slots with sharing
    shared_accesses: int  # tokens served from a cached prefix
    tree: tuple[str, ...]  # rendered trie

    @property
    def total_tokens(self) -> int:
        """KV slots without sharing."""
        return sum(self.tokens_per_request)

    @property
    def savings(self) -> float:
        """1 - unique/total, which is also the cache hit rate shared/total."""
        return 1 - self.unique_kv_entries / self.total_tokens


def radix_demo(requests: tuple[str, ...] = SEED_REQUESTS) -> RadixDemo:
    """Insert every request into a fresh trie and count (demo_prefix_sharing)."""
    if not requests or any(not r.split() for r in requests):
        raise ValueError("every request must contain at least one word")
    tokenizer, trie = WordTokenizer(), TokenTrie()
    lengths = []
    for text in requests:
        tokens = tokenizer.encode(text)
        trie.insert(tokens)
        lengths.append(len(tokens))
    tree = render_trie(trie.root, tokenizer.words)
    return RadixDemo(tuple(lengths), trie.unique_kv_entries, trie.shared_accesses, tuple(tree))


@dataclass(frozen=True)
class PrefixSavings:
    kv_bytes_per_token: int
    shared_tokens: int  # cached once
    unique_tokens: int  # summed over all requests
    total_tokens: int  # what every request would cache on its own

    @property
    def bytes_without_sharing(self) -> int:
        return self.total_tokens * self.kv_bytes_per_token

    @property
    def bytes_with_sharing(self) -> int:
        return (self.shared_tokens + self.unique_tokens) * self.kv_bytes_per_token

    @property
    def shared_bytes(self) -> int:
        return self.shared_tokens * self.kv_bytes_per_token

    @property
    def unique_bytes(self) -> int:
        return self.unique_tokens * self.kv_bytes_per_token

    @property
    def saved_bytes(self) -> int:
        return self.bytes_without_sharing - self.bytes_with_sharing

    @property
    def saved_fraction(self) -> float:
        return self.saved_bytes / self.bytes_without_sharing


def _check_count(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def shared_prefix_savings(
    num_requests: int, shared_len: int, unique_len: int, kv_bytes_per_token: int
) -> PrefixSavings:
    """n requests of S shared + U own tokens (seed analyze_system_prompt_sharing): savings
    1 - (S + n*U) / (n*(S + U))."""
    _check_count("number of requests", num_requests, 1)
    _check_count("shared prefix length", shared_len, 0)
    _check_count("per-request length", unique_len, 0)
    _check_count("KV bytes per token", kv_bytes_per_token, 1)
    if shared_len + unique_len == 0:
        raise ValueError("requests must have at least one token")
    total = num_requests * (shared_len + unique_len)
    return PrefixSavings(kv_bytes_per_token, shared_len, num_requests * unique_len, total)


def prompt_savings(
    prompt_lengths: list[int], shared_len: int, kv_bytes_per_token: int
) -> PrefixSavings:
    """Prompts of different lengths sharing their first `shared_len` tokens (its "Run It" page)."""
    if not prompt_lengths:
        raise ValueError("need at least one prompt")
    _check_count("shared prefix length", shared_len, 0)
    _check_count("KV bytes per token", kv_bytes_per_token, 1)
    for length in prompt_lengths:
        _check_count("prompt length", length, 1)
        if length < shared_len:
            raise ValueError(f"prompt of {length} tokens is shorter than the shared prefix")
    total = sum(prompt_lengths)
    return PrefixSavings(
        kv_bytes_per_token, shared_len, total - len(prompt_lengths) * shared_len, total
    )
