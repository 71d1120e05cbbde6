"""Prefix sharing against seed 002 ch9 prefix_sharing_demo.py ([R] = printed by the
seed's code when run) and brute-force counts."""

import subprocess
import sys

import pytest

from jaxscale.calc import prefix as px

KV_70B = 327_680  # the demo's 70B figure
PCT_TOL = 0.05  # percentage points: the seed prints one decimal
GB_TOL = 0.005  # the seed prints GB with two decimals


def test_radix_demo_counts():
    # [R] tokens 11/11/10/9/9/7 = 57; 26 unique KV entries; 31 shared; savings 54.4%
    demo = px.radix_demo()
    assert demo.tokens_per_request == (11, 11, 10, 9, 9, 7)
    assert (demo.total_tokens, demo.unique_kv_entries, demo.shared_accesses) == (57, 26, 31)
    assert demo.savings * 100 == pytest.approx(54.4, abs=PCT_TOL)
    assert demo.savings == pytest.approx(demo.shared_accesses / demo.total_tokens)


def test_trie_entries_equal_distinct_prefixes_brute_force():
    # A per-token trie has exactly one node per distinct token prefix.
    requests = px.SEED_REQUESTS + ("You are a pirate.", "Tell me a joke.")
    words = [r.lower().split() for r in requests]
    prefixes = {tuple(w[: i + 1]) for w in words for i in range(len(w))}
    demo = px.radix_demo(requests)
    assert demo.unique_kv_entries == len(prefixes)
    assert demo.shared_accesses == sum(map(len, words)) - len(prefixes)


def test_trie_reuses_slots_of_a_shared_prefix():
    tokenizer, trie = px.WordTokenizer(), px.TokenTrie()
    first = trie.insert(tokenizer.encode("a b c"))
    second = trie.insert(tokenizer.encode("a b d"))
    assert first == [0, 1, 2] and second == [0, 1, 3]
    assert trie.root.children[0].ref_count == 2


def test_tree_shape_matches_seed():
    # [R] root -> 3 shared tokens (refs 6) -> branches with refs 4 and 2, 5 levels drawn
    tree = px.radix_demo().tree
    assert tree[:4] == (
        "└── [root]",
        "    └── [you] (refs: 6)",
        "        └── [are] (refs: 6)",
        "            └── [a] (refs: 6)",
    )
    assert "├── [helpful] (refs: 4)" in tree[4] and "└── [coding] (refs: 2)" in tree[6]
    assert len(tree) == 8  # depth 0..5 only


def test_radix_demo_does_not_depend_on_hash_seed():
    # the seed's hash()-based ids change with PYTHONHASHSEED; ours must not
    code = "from jaxscale.calc.prefix import radix_demo; print(radix_demo())"
    outs = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        for seed in ("1", "2")
    ]
    assert outs[0] == outs[1] and "unique_kv_entries=26" in outs[0]


def test_system_prompt_sharing():
    # [R] 100 x (500 + 100): 19.66 -> 3.44 GB, saved 16.22 GB (82.5%); shared 163.84 MB;
    # user prompts 3.28 GB
    s = px.shared_prefix_savings(100, 500, 100, KV_70B)
    assert s.bytes_without_sharing / 1e9 == pytest.approx(19.66, abs=GB_TOL)
    assert s.bytes_with_sharing / 1e9 == pytest.approx(3.44, abs=GB_TOL)
    assert s.saved_bytes / 1e9 == pytest.approx(16.22, abs=GB_TOL)
    assert s.saved_fraction * 100 == pytest.approx(82.5, abs=PCT_TOL)
    assert s.shared_bytes / 1e6 == pytest.approx(163.84, abs=GB_TOL)
    assert s.unique_bytes / 1e9 == pytest.approx(3.28, abs=GB_TOL)


def test_closed_form_savings():
    # seed 002 ch9 Exercise 2: savings = 1 - (S + n*U) / (n*(S + U))
    for n, shared, own in ((100, 500, 100), (7, 30, 11), (1, 5, 5)):
        s = px.shared_prefix_savings(n, shared, own, 2)
        assert s.saved_fraction == pytest.approx(1 - (shared + n * own) / (n * (shared + own)))


def test_few_shot_sharing():
    # [R] 100 x (5 x 200 + 50): 34.41 -> 1.97 GB, saved 32.44 GB (94.3%)
    shared = px.FEW_SHOT_EXAMPLES * px.FEW_SHOT_EXAMPLE_LEN
    s = px.shared_prefix_savings(100, shared, px.FEW_SHOT_QUERY_LEN, KV_70B)
    assert s.bytes_without_sharing / 1e9 == pytest.approx(34.41, abs=GB_TOL)
    assert s.bytes_with_sharing / 1e9 == pytest.approx(1.97, abs=GB_TOL)
    assert s.saved_bytes / 1e9 == pytest.approx(32.44, abs=GB_TOL)
    assert s.saved_fraction * 100 == pytest.approx(94.3, abs=PCT_TOL)


def test_prose_example_three_prompts():
    # its "Run It" page: 100/120/90 tokens x 320 KB = 99.2 MB; 7 shared -> 94.72 MB; savings 4.5%
    s = px.prompt_savings([100, 120, 90], 7, 320_000)
    assert s.bytes_without_sharing / 1e6 == pytest.approx(99.2)
    assert s.bytes_with_sharing / 1e6 == pytest.approx(94.72)
    assert s.saved_fraction * 100 == pytest.approx(4.5, abs=PCT_TOL)


@pytest.mark.parametrize(
    "call",
    [
        lambda: px.shared_prefix_savings(0, 500, 100, KV_70B),
        lambda: px.shared_prefix_savings(100, -1, 100, KV_70B),
        lambda: px.shared_prefix_savings(100, 0, 0, KV_70B),
        lambda: px.prompt_savings([5, 3], 4, KV_70B),
        lambda: px.prompt_savings([], 0, KV_70B),
        lambda: px.radix_demo(("ok", "   ")),
    ],
)
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()
