"""`jaxscale verify`: print the equivalence matrix (every strategy x mesh vs the reference)."""

from __future__ import annotations

import argparse

from jaxscale.cliutil import fail


def add_parser(sub) -> None:
    p = sub.add_parser(
        "verify",
        description="Run every case of the lab's case list against the single-device "
        "reference: first-step loss, every gradient leaf, and a 10-step trajectory.",
        epilog="examples:\n  jaxscale verify\n  jaxscale verify --only zero3 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="check every strategy (auto and manual) on every mesh against the "
        "single-device reference: loss, gradients, 10-step trajectory (losses, gradient "
        "norms, parameters)",
    )
    p.add_argument("--only", default="", help="run only cases whose label or mesh contains this")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per case, each as it finishes (JSON lines)",
    )
    p.add_argument("--dry-run", action="store_true", help="list the cases, run nothing")
    p.set_defaults(func=main)


def main(args) -> int:
    import json

    from jaxscale import verify
    from jaxscale.progress import Progress

    cases = [c for c in verify.CASES if args.only in f"{c.label} {c.mesh}"]
    if not cases:
        return fail("verify", f"--only {args.only!r} matches no case")
    if args.dry_run:
        print("\n".join(f"{c.label:<40} {c.mesh}" for c in cases))
        return 0
    if not args.json:
        print("\n".join(verify.matrix_header()), flush=True)

    def show(result) -> None:  # each row as its case finishes
        line = json.dumps(verify.as_json([result])[0]) if args.json else verify.matrix_row(result)
        bar.write(line)

    bar = Progress(len(cases), desc="verify", enabled=not args.json)
    results = verify.run_cases(cases, progress=bar, on_result=show)
    bar.close()
    if not args.json:
        print("\n".join(verify.matrix_footer(results)))
    return 0 if all(r.passed for r in results) else 1
