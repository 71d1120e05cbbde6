"""`jaxscale calc prefix`: prefix sharing (RadixCache), system-prompt and few-shot savings.

Port of seed 002 ch9 `prefix_sharing_demo.py`. Nothing here imports jax.
"""

from jaxscale.calc import kv
from jaxscale.calc import prefix as px
from jaxscale.calc.commands.common import record
from jaxscale.cliutil import add_command, add_output_flags, guarded, positive_int
from jaxscale.render import Report, grid


def add_parser(calc_sub) -> None:
    p = add_command(
        calc_sub,
        "prefix",
        help="prefix sharing (RadixCache): trie demo, system-prompt and few-shot savings",
        description="The seed's prefix-sharing demo: savings = 1 - (S + n*U) / (n*(S + U)).",
        example="jaxscale calc prefix --num-requests 100 --system-prompt-len 500",
    )
    p.add_argument(
        "--num-requests",
        "-n",
        type=positive_int,
        default=100,
        help="requests sharing the prefix (n)",
    )
    p.add_argument(
        "--system-prompt-len",
        type=positive_int,
        default=500,
        help="tokens of the shared system prompt (S)",
    )
    p.add_argument(
        "--user-prompt-len",
        type=positive_int,
        default=100,
        help="tokens of each request's own prompt (U)",
    )
    p.add_argument(
        "--model",
        default="llama-70b",
        choices=list(kv.MODELS),
        help="whose KV bytes per token (llama-70b: 327,680 B, as the seed)",
    )
    add_output_flags(p)
    p.set_defaults(func=guarded(run))


def _savings(s: px.PrefixSavings, num_requests: int) -> dict:
    props = ("bytes_without_sharing", "bytes_with_sharing", "saved_bytes", "saved_fraction")
    return record(s, *props, "shared_bytes", "unique_bytes", num_requests=num_requests)


def _savings_table(s: dict) -> str:
    return grid(
        ["", "Memory"],
        [
            ["Without sharing", f"{s['bytes_without_sharing'] / 1e9:.2f} GB"],
            ["With sharing", f"{s['bytes_with_sharing'] / 1e9:.2f} GB"],
            ["Saved", f"{s['saved_bytes'] / 1e9:.2f} GB ({s['saved_fraction'] * 100:.1f}%)"],
            ["Shared prefix (cached once)", f"{s['shared_bytes'] / 1e6:.2f} MB"],
            ["Own tokens (all requests)", f"{s['unique_bytes'] / 1e9:.2f} GB"],
        ],
    )


def run(args) -> int:
    n, demo = args.num_requests, px.radix_demo()
    per_token = kv.model_kv_bytes_per_token(kv.get_model(args.model))
    system = _savings(
        px.shared_prefix_savings(n, args.system_prompt_len, args.user_prompt_len, per_token), n
    )
    few_shot_len = px.FEW_SHOT_EXAMPLES * px.FEW_SHOT_EXAMPLE_LEN
    few = _savings(px.shared_prefix_savings(n, few_shot_len, px.FEW_SHOT_QUERY_LEN, per_token), n)
    lengths = zip(px.SEED_REQUESTS, demo.tokens_per_request, strict=True)
    requests = [[f"{i + 1}. {text}", tokens] for i, (text, tokens) in enumerate(lengths)]
    r = Report(
        "prefix",
        radix_demo=record(demo, "total_tokens", "savings"),
        kv_bytes_per_token=per_token,
        system_prompt=system,
        few_shot=few,
    )
    r.say(
        "Prefix sharing (seed 002 ch9 prefix_sharing_demo.py); words get ids in "
        "first-seen order (the seed's salted hash() ids change per run)",
        "",
        grid(["Request", "Tokens"], requests),
        f"KV entries without sharing {demo.total_tokens}, with a token trie "
        f"{demo.unique_kv_entries}; {demo.shared_accesses} tokens reuse a cached prefix; "
        f"saved {demo.savings * 100:.1f}%",
        "",
        *demo.tree,
        "",
        f"System prompt: {n} requests x ({args.system_prompt_len} shared + "
        f"{args.user_prompt_len} own) tokens, {per_token:,} B/token",
        _savings_table(system),
        "",
        f"Few-shot: {n} requests x ({px.FEW_SHOT_EXAMPLES} x {px.FEW_SHOT_EXAMPLE_LEN} shared + "
        f"{px.FEW_SHOT_QUERY_LEN} query) tokens",
        _savings_table(few),
    )
    r.emit(args)
    return 0
