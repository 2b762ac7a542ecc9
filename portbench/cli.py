"""The ``portbench`` command line.

    portbench windows list|describe|add|import-lssp   the frozen workload windows
    portbench calibrate                               per-window λ_ref (FIFO knee) and the check
                                                      against the study's values
    portbench campaign                                simulate every (window, region, policy) cell
    portbench policies                                the registered scheduling policies

Every sub-command has its own ``--help``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _windows_list(args) -> int:
    from . import store
    manifest = store.list_windows(args.data_dir, args.source, every_source=True)
    cols = ["source", "window_id", "n_requests", "paper_lambda_ref"]
    with _pandas_display():
        print(manifest[cols].to_string(index=False))
    counts = manifest.groupby("source")["window_id"].count()
    print(f"\n{len(manifest)} windows: " + ", ".join(f"{s} {n}" for s, n in counts.items()))
    return 0


def _windows_describe(args) -> int:
    import numpy as np
    from . import store
    windows = ([store.load_window(args.window_id, args.data_dir)] if args.window_id
               else store.load_windows(args.data_dir, args.source, every_source=True))
    rows = []
    for w in windows:
        rows.append({"window_id": w.window_id, "source": w.source, "n": len(w),
                     "duration_s": w.duration_s,
                     "mean_input": float(np.mean(w.input_tokens)),
                     "max_input": int(np.max(w.input_tokens)),
                     "mean_output": float(np.mean(w.output_tokens)),
                     "max_output": int(np.max(w.output_tokens)),
                     "paper_lambda_ref": w.meta.get("paper_lambda_ref")})
    import pandas as pd
    with _pandas_display():
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"\n{len(rows)} windows verified against their checksums")
    return 0


def _windows_add(args) -> int:
    from . import store
    rows = store.add_source(args.source, args.path, fmt=args.format, n_windows=args.n_windows,
                            seed=args.seed, window_size=args.window_size,
                            data_dir=args.data_dir, replace=args.replace,
                            column_map=_parse_column_map(args.columns))
    from .store import windows_dir
    print(f"added {len(rows)} windows of source {args.source!r} "
          f"({int(rows['n_requests'].sum())} requests) to {windows_dir(args.data_dir)}")
    return 0


def _windows_import_lssp(args) -> int:
    from . import store
    rows = store.import_lssp(Path(args.lssp_dir), args.data_dir)
    print(f"imported {len(rows)} windows from {args.lssp_dir}")
    return 0


def _parse_column_map(spec):
    if not spec:
        return None
    out = {}
    for part in spec.split(","):
        if "=" not in part:
            raise SystemExit(f"--columns: expected FIELD=COLUMN pairs separated by commas, got {part!r}")
        key, value = part.split("=", 1)
        out[key.strip()] = value.strip()
    return out


class _pandas_display:
    def __enter__(self):
        import pandas as pd
        self._ctx = pd.option_context("display.max_rows", None, "display.width", 200)
        self._ctx.__enter__()

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="portbench",
        description="Do LLM-serving scheduler rankings port across workloads, load levels and metrics? "
                    "Simulate the study's 13 policies on its 120 frozen windows and analyse the rankings.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="data folder (default: $PORTBENCH_DATA or the repository's data/)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    windows = sub.add_parser("windows", help="list, describe or add workload windows",
                             description="The frozen workload windows in data/windows/.")
    wsub = windows.add_subparsers(dest="windows_command", required=True, metavar="ACTION")
    p = wsub.add_parser("list", help="one line per window: source, id, request count, the study's λ_ref")
    p.add_argument("--source", help="only this source")
    p.set_defaults(func=_windows_list)
    p = wsub.add_parser("describe", help="verify checksums and summarise windows (tokens, duration)")
    p.add_argument("window_id", nargs="?", help="one window (default: all)")
    p.add_argument("--source", help="only this source")
    p.set_defaults(func=_windows_describe)
    p = wsub.add_parser(
        "add", help="cut windows from a raw trace file and add them as a new source",
        description="Read a raw trace (BurstGPT CSV, Azure LLM inference CSV, Alibaba Bailian JSONL/CSV, "
                    "Mooncake JSONL, plain or .xz, with prefix block hashes, or any CSV with --format csv "
                    "--columns), cut windows of consecutive valid requests with the study's seeded stride "
                    "sampler, synthesise predicted output lengths, and add them to data/windows/ with "
                    "checksums. A malformed file is refused with the row (JSONL: line) and field at fault; "
                    "nothing is written then. Campaigns take the new source only where it is named "
                    "(--source or --windows).")
    p.add_argument("source", help="name of the new source, e.g. my_cluster_2026")
    p.add_argument("path", type=Path, help="raw trace file")
    p.add_argument("--format", required=True, choices=["burstgpt", "azure", "bailian", "mooncake", "csv"])
    p.add_argument("--n-windows", type=int, default=40, help="windows to cut (default 40)")
    p.add_argument("--window-size", type=int, default=200, help="requests per window (default 200)")
    p.add_argument("--seed", type=int, default=0, help="sampler and prediction seed (default 0)")
    p.add_argument("--columns", help="for --format csv: arrival_s=COL,input_tokens=COL,output_tokens=COL")
    p.add_argument("--replace", action="store_true", help="overwrite the source if it exists")
    p.set_defaults(func=_windows_add)
    p = wsub.add_parser("import-lssp", help="(re)build the store from the study's lssp_windows/ CSVs")
    p.add_argument("lssp_dir", help="folder with windows.csv and windows_meta.csv")
    p.set_defaults(func=_windows_import_lssp)

    from . import commands  # sub-commands of the simulator, campaign and analysis
    commands.register(sub)
    return parser


#: What a shell reports for a tool killed by SIGPIPE (128 + 13).
_SIGPIPE_STATUS = 141


def main(argv=None) -> int:
    """Run one command; its exit status. A reader that stops early (``| head``) ends it quietly."""
    try:
        try:
            return _run(argv)
        finally:
            # Flush here, so a closed pipe shows up in this handler and not at interpreter exit.
            sys.stdout.flush()
    except BrokenPipeError:
        # As a Unix tool killed by SIGPIPE: no traceback, status 141. stdout now points at
        # /dev/null so the interpreter's last flush of what is still buffered cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return _SIGPIPE_STATUS


def _run(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except (KeyError, ValueError, RuntimeError, FileNotFoundError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"portbench: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
